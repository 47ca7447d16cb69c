"""What the benchmark's workers and its parent share: step timing, memory, the result line.

Imports no TensorFlow, so the parent (python -m benchmarks) can import it too.
"""
import argparse
import math
import os
import resource
import sys
import time

import numpy as np

RESULT_PREFIX = 'BENCHMARK_RESULT '  # a worker's one line of JSON starts with this


# The model's layers with weights: the trainer's variable scopes, the peers' layer names.
LAYERS = ('conv1', 'conv2', 'local3', 'local4', 'softmax_linear')


class BenchmarkError(Exception):
  """A configuration failed; the message names it and says what to try."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose mistakes end the run with one line, not the usage and then the error."""

  def error(self, message):
    # The scripts' own messages start with the flag and say what to pass; argparse's
    # ('unrecognized arguments') do not.
    sys.exit('error: %s%s' % (message, '' if message.startswith('--') else
                              ' (--help lists the flags)'))


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


def thread_cpu_seconds():
  """{thread id: (its name, its user + system CPU seconds so far)} of this process's
  threads, from /proc (Linux); {} where there is none."""
  threads = {}
  try:
    ids = os.listdir('/proc/self/task')
  except OSError:
    return threads
  for tid in ids:
    try:
      with open('/proc/self/task/%s/comm' % tid) as f:
        name = f.read().strip()
      with open('/proc/self/task/%s/stat' % tid) as f:
        fields = f.read().rsplit(')', 1)[1].split()  # after the name, which may hold spaces
    except OSError:  # the thread ended meanwhile
      continue
    threads[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'))
  return threads


def busy_threads(run_step, steps):
  """Runs `steps` steps; returns [(thread name, share of the wall time it was on a core)]
  for each thread that ran, busiest first. A thread that spins while it waits for
  work counts as busy: that share is an upper bound on the work it did."""
  before, start = thread_cpu_seconds(), time.perf_counter()
  for _ in range(steps):
    run_step()
  wall, after = time.perf_counter() - start, thread_cpu_seconds()
  shares = [(name, (seconds - before.get(tid, (name, 0.0))[1]) / wall)
            for tid, (name, seconds) in after.items()]
  return sorted([share for share in shares if share[1] > 0], key=lambda share: -share[1])


def peak_mb():
  """This process's peak resident memory in MB (ru_maxrss: KB on Linux, bytes on macOS)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2 ** 20 if sys.platform == 'darwin' else 2 ** 10)


def check_losses(who, losses):
  """Raises when a loss is NaN or infinite: a diverged run's step times mean nothing."""
  if not all(math.isfinite(loss) for loss in losses):
    raise BenchmarkError('%s: loss became %s, the model diverged; try a smaller '
                         '--batch_size' % (who, losses[-1]))


def weight_stats(weights):
  """What the initialisers drew: {layer: dict(shape, kernel_std, bias_mean)}.

  weights: {layer: (kernel, bias)} of a fresh model, numpy arrays.
  """
  return {layer: dict(shape=list(np.shape(kernel)), kernel_std=float(np.std(kernel)),
                      bias_mean=float(np.mean(bias))) for layer, (kernel, bias) in weights.items()}


def save_weights(path, weights):
  """Writes {layer: (kernel, bias)} to an .npz file, for start_weights in another process."""
  np.savez(path, **{name: value for layer, pair in weights.items()
                    for name, value in zip((layer + '/kernel', layer + '/bias'), pair)})


def load_weights(path):
  """{layer: (kernel, bias)} from save_weights' file."""
  with np.load(path) as saved:
    return {layer: (saved[layer + '/kernel'], saved[layer + '/bias']) for layer in LAYERS}
