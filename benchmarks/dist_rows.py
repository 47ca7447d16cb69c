"""What distribution costs: dist_train.py on 127.0.0.1 against multi_gpu_train.py.

Runs the programs themselves, as a user would, with --synthetic so that input is
not the difference, --log_frequency=1 so that every step prints its loss line,
and no summaries and no checkpoints between the first step and the last:
  multi_gpu_train.py                         the baseline, no ps
  dist_train.py --local_cluster=1,1          one ps and one worker, async
  ... --sync_replicas                        the same through SyncReplicasOptimizer
  dist_train.py --local_cluster=1,2 [sync]   two workers, sharing this machine's cores
  ... --replicas_to_aggregate=1              sync, each update from the first gradient
                                             in: the other worker is a backup
Every worker and the baseline run the same towers and batch per tower.

examples/sec and bytes per update come from the programs' loss lines (loss_lines.py).
Beside the bytes, the floor: the trainable parameters (the start-up line's count) x 4
bytes, read and pushed back once per update in async, once by every worker in sync (a
backup worker's gradient is sent too, then dropped).

No run assumes how long a task takes to start. multi_gpu_train.py runs --warmup +
--steps steps to its end. A cluster runs with no step limit of its own: this
process reads its lines as they come and, once the window holds --steps local
steps of every worker (the second worker may join seconds after the chief, or at
once), stops it with SIGTERM as a user would; the chief saves, the launcher stops
the other tasks and exits 143.
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.loss_lines import (LOSS_LINE, applied_rate, bytes_per_update,
                                   loopback_bytes_sent, loss_line_samples, steps_by_task,
                                   window, window_full, window_rate)
from benchmarks.runner import repeat_tag
from benchmarks.timing import BenchmarkError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_SECS = 600       # a run still going after this is killed; its tasks die with it
NO_SAVE_STEPS = 10 ** 9      # --save_every_n_steps: only the saves before and after training
NO_END_STEPS = 10 ** 9       # a cluster's --max_steps: it trains until this process stops it
STOP_SIGNAL = signal.SIGTERM  # ... with this, once its window is full
STOPPED_EXIT_CODE = 143      # the launcher's exit code then (training.signals', 128 + SIGTERM)

SYNC = ('--sync_replicas',)
BACKUP = SYNC + ('--replicas_to_aggregate=1',)  # 2 workers: one backup per update
# (label, workers, dist_train.py's own flags); workers None: multi_gpu_train.py, the baseline.
RUNS = [('multi_gpu_train.py', None, ()),
        ('dist_train.py 1 worker, async', 1, ()),
        ('dist_train.py 1 worker, --sync_replicas', 1, SYNC),
        ('dist_train.py 2 workers, async', 2, ()),
        ('dist_train.py 2 workers, --sync_replicas', 2, SYNC),
        ('dist_train.py 2 workers, sync, 1 backup', 2, BACKUP)]
BASELINE = RUNS[0][0]
QUICK_RUNS = 4  # --quick: the baseline and one run of each kind up to two async workers


def runs_for(args):
  """RUNS; --quick, a smoke test kept near a minute, leaves out the two-worker sync runs."""
  return RUNS[:QUICK_RUNS] if args.quick else RUNS


def replicas_to_aggregate(workers, flags):
  """The workers whose gradients one update gathers: all of them, unless flags say."""
  given = [f for f in flags if f.startswith('--replicas_to_aggregate=')]
  return int(given[0].split('=')[1]) if given else (workers if SYNC[0] in flags else 1)

def command(args, workers, dist_flags, train_dir):
  """The command line of one run: the baseline, or a local cluster of one ps task."""
  towers = args.dist_towers
  flags = ['--synthetic', '--num_gpus=%d' % towers, '--batch_size=%d' % args.batch_size,
           '--log_frequency=1', '--summary_steps=0', '--save_every_n_steps=%d' % NO_SAVE_STEPS,
           '--intra_op_threads=%d' % args.intra_op_threads,
           '--inter_op_threads=%d' % args.inter_op_threads, '--train_dir=' + train_dir]
  if workers is None:
    return [sys.executable, '-u', os.path.join(ROOT, 'multi_gpu_train.py'),
            '--max_steps=%d' % (args.warmup + args.steps)] + flags
  return ([sys.executable, '-u', os.path.join(ROOT, 'dist_train.py'),
           '--local_cluster=1,%d' % workers, '--max_steps=%d' % NO_END_STEPS] + flags +
          list(dist_flags))


def watch(argv, num_tasks, args):
  """Runs argv, reading its loss lines as they come; a cluster is stopped once its
  window is full. Returns (exit code, stdout, stderr, whether it was stopped, whether it
  ran out of time, the loopback counter as each loss line was read)."""
  with tempfile.TemporaryFile('w+') as err:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    timed_out = threading.Event()

    def time_out():
      timed_out.set()
      proc.kill()  # the tasks die with their launcher
    timer = threading.Timer(RUN_TIMEOUT_SECS, time_out)
    timer.start()
    lines, stopped, sent = [], False, []
    try:
      for line in proc.stdout:
        lines.append(line)
        if not LOSS_LINE.match(line):
          continue
        sent.append(loopback_bytes_sent(proc.pid))
        if (num_tasks and not stopped and
            window_full(steps_by_task(''.join(lines)), num_tasks, args.warmup, args.steps)):
          proc.send_signal(STOP_SIGNAL)
          stopped = True
      code = proc.wait()
    finally:
      timer.cancel()
    err.seek(0)
    return code, ''.join(lines), err.read(), stopped, timed_out.is_set(), sent


def run_one(args, runner, label, workers, dist_flags):
  """Runs one configuration to its end; returns its rate and raw lines for the JSON."""
  start = time.time()
  with tempfile.TemporaryDirectory(prefix='cifar10_dist_benchmark_') as train_dir:
    argv = command(args, workers, dist_flags, train_dir)
    code, stdout, stderr, stopped, timed_out, sent = watch(argv, workers, args)
  if timed_out:
    raise BenchmarkError('%s ran longer than %d s and was stopped; lower --steps'
                         % (label, RUN_TIMEOUT_SECS))
  tasks = steps_by_task(stdout)
  expected = STOPPED_EXIT_CODE if workers else 0
  why = None
  if code != expected:
    why = 'exit status %d' % code
  elif workers and not stopped:
    why = 'it ended before every worker had trained --steps=%d steps together' % args.steps
  elif window(tasks, args.warmup) is None:
    why = 'too few loss lines'
  if why:
    raise BenchmarkError('%s failed (%s). Its last output lines:\n%s\nTo rerun it alone: '
                         '%s' % (label, why, '\n'.join((stdout + stderr).strip().splitlines()
                                                        [-25:]), ' '.join(argv)))
  examples_per_step = args.batch_size * args.dist_towers
  examples_per_sec, window_sec = window_rate(tasks, args.warmup, examples_per_step)
  if examples_per_sec is None:
    raise BenchmarkError('%s: %s; raise --steps' % (label, window_sec))
  result = dict(label=label, command=argv, workers=workers, sync=SYNC[0] in dist_flags,
                examples_per_sec=examples_per_sec, window_sec=window_sec,
                examples_per_step=examples_per_step, loss_lines=tasks, stopped=stopped,
                wall_sec=time.time() - start)
  if workers:
    samples = loss_line_samples(stdout, sent)
    replicas = replicas_to_aggregate(workers, dist_flags)
    opens, closes = window(tasks, args.warmup)
    parameters = re.search(r'hold (\d+) trainable parameters', stdout)
    result.update(
        replicas_to_aggregate=replicas,
        applied_examples_per_sec=applied_rate(samples, opens, closes,
                                              replicas * examples_per_step),
        bytes_per_update=bytes_per_update(samples, opens, closes),
        # A worker step reads each variable and pushes its gradient: once per update in
        # async, once by every worker in sync (a backup's gradient is sent, then dropped).
        floor_bytes_per_update=(int(parameters.group(1)) * 4 * 2 *
                                (workers if SYNC[0] in dist_flags else 1)
                                if parameters else None))
  runner.progress(label, ': %.1f examples/sec' % examples_per_sec, result['wall_sec'])
  return result


def run_repeat(args, runner, runs, repeat):
  """One pass over runs_for(args) in order, appending each to runs[('dist', label)]."""
  for label, workers, dist_flags in runs_for(args):
    runs.setdefault(('dist', label), []).append(
        run_one(args, runner, label + repeat_tag(repeat, args.repeats), workers, dist_flags))


def summarise(args, runs):
  """Prints the distribution rows; returns {label: dict(examples_per_sec, ...)}."""
  rows = {}
  for label, workers, dist_flags in runs_for(args):
    done = runs[('dist', label)]
    median = lambda key: _median([r.get(key) for r in done])  # noqa: E731
    rows[label] = dict(examples_per_sec=median('examples_per_sec'),
                       per_repeat=[r['examples_per_sec'] for r in done], workers=workers,
                       sync=SYNC[0] in dist_flags,
                       replicas_to_aggregate=done[0].get('replicas_to_aggregate'),
                       applied_examples_per_sec=median('applied_examples_per_sec'),
                       bytes_per_update=median('bytes_per_update'),
                       floor_bytes_per_update=done[0].get('floor_bytes_per_update'))
  for row in rows.values():
    row['vs_multi_gpu_train'] = row['examples_per_sec'] / rows[BASELINE]['examples_per_sec']
  print()
  print('What distribution costs: towers per worker %d, batch %d per tower, synthetic '
        'input, one ps task, all on 127.0.0.1; examples/sec of all workers together from '
        'their loss lines, after %d warm-up steps%s' % (
            args.dist_towers, args.batch_size, args.warmup,
            ', median of %d repeats' % args.repeats if args.repeats > 1 else ''))
  print('applied: examples of the gradients that updates used; MB/update: sent over '
        '127.0.0.1 per global step, and its floor: the variables read and the gradients '
        'pushed, once per update in async, once per worker in sync')
  print('%-42s  %8s  %8s  %7s  %10s  %5s' % ('run', 'ex/s', 'applied', 'vs local',
                                            'MB/update', 'floor'))
  for label, workers, _ in runs_for(args):
    row = rows[label]
    print('%-42s  %8.0f  %8s  %7.2f  %10s  %5s%s' % (
        label, row['examples_per_sec'], _shown(row['applied_examples_per_sec'], 1),
        row['vs_multi_gpu_train'], _shown(row['bytes_per_update'], 1e6, '%.1f'),
        _shown(row['floor_bytes_per_update'], 1e6, '%.1f'),
        '   (the workers share the %d cores)' % os.cpu_count() if workers == 2 else ''))
  return rows


def _median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _shown(value, unit, pattern='%.0f'):
  return '-' if value is None else pattern % (value / unit)
