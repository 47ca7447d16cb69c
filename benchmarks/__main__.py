"""python -m benchmarks: the table, or --profile; benchmarks/benchmark.py says what each prints."""
import sys

from training import prelude

if __name__ == '__main__':
  prelude.check_python()
  prelude.require('numpy', 'tensorflow')  # one line, not a traceback, where they are not
  from benchmarks import benchmark
  benchmark.main(sys.argv[1:])
