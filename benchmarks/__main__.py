"""python -m benchmarks: the table, or --profile; benchmarks/benchmark.py says what each prints."""
import sys

from benchmarks import benchmark

if __name__ == '__main__':
  benchmark.main(sys.argv[1:])
