"""What the benchmark's workers and its parent share: step timing, memory, the result line.

Imports no TensorFlow, so the parent (benchmark.py) can import it too.
"""
import math
import resource
import sys
import time

RESULT_PREFIX = 'BENCHMARK_RESULT '  # a worker's one line of JSON starts with this


class BenchmarkError(Exception):
  """A configuration failed; the message names it and says what to try."""


def time_steps(run_step, warmup, steps):
  """Runs warmup untimed steps, then returns the seconds of each of `steps` steps."""
  for _ in range(warmup):
    run_step()
  durations = []
  for _ in range(steps):
    start = time.perf_counter()
    run_step()
    durations.append(time.perf_counter() - start)
  return durations


def peak_mb():
  """This process's peak resident memory in MB (ru_maxrss: KB on Linux, bytes on macOS)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2 ** 20 if sys.platform == 'darwin' else 2 ** 10)


def check_losses(who, losses):
  """Raises when a loss is NaN or infinite: a diverged run's step times mean nothing."""
  if not all(math.isfinite(loss) for loss in losses):
    raise BenchmarkError('%s: loss became %s, the model diverged; try a smaller '
                         '--batch_size' % (who, losses[-1]))
