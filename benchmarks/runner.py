"""The parent's side of a worker: start it, read its result, summarise step times.

Imports no TensorFlow: every number comes from a worker.py process, forked from a
worker parent (worker.serve) that has imported it, one parent per environment.
"""
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.timing import RESULT_PREFIX, BenchmarkError
from training import machine  # imports no TensorFlow at its top either

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the workers' cwd
WORKER = 'benchmarks.worker'      # run as python -m WORKER, so the repo's modules import
WORKER_TIMEOUT_SECS = 3600        # a worker still running after this is killed

# oneDNN in the workers: a config's 'onednn' is True, False, or None (TensorFlow's own
# default, the variable unset). OURS is what multi_gpu_train.py picks here with no
# --onednn (the user's TF_ENABLE_ONEDNN_OPTS included); TENSORFLOWS what TensorFlow does
# with the variable unset, the peers' default.
OURS_ONEDNN = machine.decide('auto', os.environ, platform.machine(), machine.cpu_flags()).on
TENSORFLOWS_ONEDNN = machine.tensorflow_default(platform.machine(), machine.cpu_flags())
ONEDNN_SETTINGS = (False, True)   # every configuration of the table runs under both
# bfloat16 rows (ours --use_bf16, the peers under mixed_bfloat16) only on a CPU with
# bfloat16 units, and with oneDNN on: without either it is emulated, far slower than
# float32 (docs/performance.md).
BF16_UNITS = bool(set(machine.BFLOAT16_FLAGS) & machine.cpu_flags())


class Runner:
  """Runs worker processes one at a time, numbering them for the progress lines."""

  def __init__(self, total):
    self.total, self.done = total, 0
    self.parents = {}  # a worker environment (JSON) -> its WorkerParent

  def run(self, label, config, env=None):
    """Runs one configuration in a process of its own; returns its result dict."""
    environ = worker_env(config, env)
    key = json.dumps(environ, sort_keys=True)
    if key not in self.parents:
      self.parents[key] = WorkerParent(environ)
    start = time.time()
    code, stdout, stderr = self.parents[key].run(json.dumps(config), WORKER_TIMEOUT_SECS)
    if code is None:
      raise BenchmarkError('%s ran longer than %d s and was stopped; lower --steps or '
                           '--batch_size' % (label, WORKER_TIMEOUT_SECS))
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if code or not lines:
      output = (stdout + stderr).strip().splitlines()
      raise BenchmarkError('%s failed (exit status %d). Its last output lines:\n%s\n'
                           'To rerun it alone, from %s: python -m %s \'%s\''
                           % (label, code, '\n'.join(output[-25:]), ROOT,
                              WORKER, json.dumps(config)))
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result.update(label=label, config=config, wall_sec=time.time() - start)
    self.progress(label, _rate_note(result), result['wall_sec'])
    return result

  def close(self):
    for parent in self.parents.values():
      parent.close()

  def progress(self, label, note, wall_sec):
    """Counts a run as done and says so on stderr: '[ 4/17] ours N=1 synthetic: ...'."""
    self.done += 1
    print('[%2d/%d] %s%s (%.0f s)' % (self.done, self.total, label, note, wall_sec),
          file=sys.stderr, flush=True)


class WorkerParent:
  """`python -m benchmarks.worker --parent` in one environment: it imports TensorFlow
  once and forks a worker per configuration (worker.serve), a process of its own.

  OPENBLAS_NUM_THREADS=1: numpy's OpenBLAS would otherwise start threads at import,
  and a fork copies no thread (the workers' numbers are TensorFlow's, not numpy's).
  """

  def __init__(self, environ):
    self.errors = tempfile.TemporaryFile('w+')  # the parent's own stderr, for a failure
    self.process = subprocess.Popen([sys.executable, '-m', WORKER, '--parent'], cwd=ROOT,
                                    env=dict(environ, OPENBLAS_NUM_THREADS='1'),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=self.errors)
    self.answers = b''  # what the parent said and was not yet read

  def run(self, config, timeout):
    """(exit code, stdout, stderr) of one worker; the code is None when it ran past
    timeout seconds and was killed."""
    with tempfile.TemporaryDirectory(prefix='cifar10_benchmark_worker_') as directory:
      out, err = os.path.join(directory, 'out'), os.path.join(directory, 'err')
      request = json.dumps(dict(config=config, out=out, err=err)) + '\n'
      self.process.stdin.write(request.encode())
      self.process.stdin.flush()
      pid = self._answer('pid', None)
      code = self._answer('exit', timeout)
      if code is None:
        os.kill(pid, signal.SIGKILL)
        self._answer('exit', None)
      with open(out) as o, open(err) as e:
        return code, o.read(), e.read()

  def _answer(self, word, timeout):
    """The number of the parent's next line `word N`; None after timeout seconds."""
    deadline = None if timeout is None else time.time() + timeout
    while b'\n' not in self.answers:
      left = None if deadline is None else max(deadline - time.time(), 0)
      if not select.select([self.process.stdout], [], [], left)[0]:
        return None
      more = os.read(self.process.stdout.fileno(), 4096)
      if not more:
        self.process.wait()
        self.errors.seek(0)
        raise BenchmarkError('the worker parent (python -m %s --parent) exited with %d: %s'
                             % (WORKER, self.process.returncode, self.errors.read()[-2000:]))
      self.answers += more
    line, self.answers = self.answers.split(b'\n', 1)
    found, number = line.decode().split()
    if found != word:  # the parent answers pid, then exit, in turn
      raise BenchmarkError('the worker parent said %r where %r was due' % (line, word))
    return int(number)

  def close(self):
    self.process.stdin.close()
    self.process.wait()
    self.errors.close()


def worker_env(config, env=None):
  """The worker's environment: ours, quiet TensorFlow, env, and config['onednn'] if given."""
  environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', **(env or {}))
  if 'onednn' in config:  # this configuration's setting, whatever the user's shell has
    environ.pop(machine.SET_HERE_ENV, None)
    environ.pop(machine.ENV, None)
    if config['onednn'] is not None:
      environ[machine.ENV] = '1' if config['onednn'] else '0'
  return environ


def onednn_name(on):
  """'on', 'off' or 'TF default' for labels."""
  return {True: 'on', False: 'off', None: 'TF default'}[on]


def _rate_note(result):
  if 'examples_per_step' in result:
    return ': %.1f examples/sec' % (result['examples_per_step'] /
                                    statistics.median(result['durations']))
  if 'gflops' in result:
    return ': %.1f GFLOP/s' % result['gflops']
  return ''


def repeat_tag(repeat, repeats):
  """' (repeat 2/3)' for the progress lines, '' when there is one repeat."""
  return ' (repeat %d/%d)' % (repeat + 1, repeats) if repeats > 1 else ''


def rate_stats(results):
  """examples/sec over one configuration's runs (one per repeat).

  Returns:
    dict: examples_per_sec (median over repeats of each run's median step),
    min and max (slowest and fastest single step of any run), peak_mb (largest).
  """
  medians = [r['examples_per_step'] / statistics.median(r['durations']) for r in results]
  return dict(examples_per_sec=statistics.median(medians),
              min=min(r['examples_per_step'] / max(r['durations']) for r in results),
              max=max(r['examples_per_step'] / min(r['durations']) for r in results),
              per_repeat=medians, peak_mb=max(r['peak_mb'] for r in results),
              steps=sum(len(r['durations']) for r in results))


def rate(stats, width=7):
  """'  812 [ 640- 851]': median examples/sec [slowest step - fastest step]."""
  if not stats:
    return '-'.center(width + 13)
  return '%*.0f [%4.0f-%4.0f]' % (width, stats['examples_per_sec'], stats['min'],
                                  stats['max'])


def ratio(numerator, denominator):
  """examples/sec of one stats dict over another's; None when either is missing."""
  if not numerator or not denominator:
    return None
  return numerator['examples_per_sec'] / denominator['examples_per_sec']


def fmt(value, pattern):
  return '-' if value is None else pattern % value


def ours_config(args, towers, input_name, data_dir=None, **overrides):
  """A worker config for the trainer's graph, at its default oneDNN; overrides change it."""
  config = dict(kind='ours', towers=towers, batch_size=args.batch_size, input=input_name,
                data_dir=data_dir, steps=args.steps, warmup=args.warmup,
                intra=args.intra_op_threads, inter=args.inter_op_threads, onednn=OURS_ONEDNN)
  config.update(overrides)
  return config


def flatten(runs):
  """Every worker's raw result (config, step times, memory) as a list, for the JSON."""
  return [result for key in runs for result in runs[key]]
