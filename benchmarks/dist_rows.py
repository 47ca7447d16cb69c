"""What distribution costs: dist_train.py on 127.0.0.1 against multi_gpu_train.py.

Runs the programs themselves, as a user would, with --synthetic so that input is
not the difference, --log_frequency=1 so that every step prints its loss line,
and no summaries and no checkpoints between the first step and the last:
  multi_gpu_train.py                         the baseline, no ps
  dist_train.py --local_cluster=1,1          one ps and one worker, async
  ... --sync_replicas                        the same through SyncReplicasOptimizer
  dist_train.py --local_cluster=1,2 [sync]   two workers, sharing this machine's cores
Every worker and the baseline run the same towers and batch per tower.

examples/sec comes from the loss lines' own timestamps: the window opens when the
last worker to get there has finished its warm-up steps and closes when the first
worker to finish prints its last line, so with two workers both are training
throughout. Each worker's rate is its local steps in the window x its images per
step / the time between its first and last line there; the cluster's is their sum.
For one process that is its mean rate after warm-up.
"""
import datetime
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from runner import repeat_tag
from timing import BenchmarkError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_SECS = 600       # a run still going after this is killed; its tasks die with it
NO_SAVE_STEPS = 10 ** 9      # --save_every_n_steps: only the saves before and after training
START_LAG_SECS = 3           # the chief trains alone this long at most: the other workers
                             # look for its variables once a second (RECOVERY_WAIT_SECS)
MIN_STEPS = 20               # timed steps at least, even with --quick: the window needs
                             # several loss lines of every worker, and sync skips some

# (label, workers, --sync_replicas); workers None: multi_gpu_train.py, the baseline.
RUNS = [('multi_gpu_train.py', None, False),
        ('dist_train.py 1 worker, async', 1, False),
        ('dist_train.py 1 worker, --sync_replicas', 1, True),
        ('dist_train.py 2 workers, async', 2, False),
        ('dist_train.py 2 workers, --sync_replicas', 2, True)]
BASELINE = RUNS[0][0]


def runs_for(args):
  """RUNS; --quick, a smoke test kept near a minute, leaves out two workers in sync."""
  return RUNS[:-1] if args.quick else RUNS

# '[worker1] 2026-11-23 07:01:09.659295: step 3, loss = 4.44 (170.2 examples/sec; 0.094
# sec/batch) [worker 1, local step 3]'; multi_gpu_train.py's lines lack both brackets.
LOSS_LINE = re.compile(r'^(?:\[(?P<task>\w+)\] )?(?P<time>\d{4}-\d\d-\d\d [\d:.]+): step '
                       r'(?P<step>\d+), loss = [^(]+\([\d.]+ examples/sec; [\d.]+ sec/batch\)'
                       r'(?: \[worker \d+, local step (?P<local_step>\d+)\])?$')


def command(args, workers, sync, train_dir, solo_rate=None):
  """The command line of one run: the baseline, or a local cluster of one ps task.

  solo_rate: examples/sec of one async worker, measured just before; two workers
  get START_LAG_SECS of its steps on top of their own, for the chief's steps alone.
  """
  towers, per_run = args.dist_towers, args.warmup + max(args.steps, MIN_STEPS)
  flags = ['--synthetic', '--num_gpus=%d' % towers, '--batch_size=%d' % args.batch_size,
           '--log_frequency=1', '--summary_steps=0', '--save_every_n_steps=%d' % NO_SAVE_STEPS,
           '--intra_op_threads=%d' % args.intra_op_threads,
           '--inter_op_threads=%d' % args.inter_op_threads, '--train_dir=' + train_dir]
  if workers is None:
    return [sys.executable, '-u', os.path.join(ROOT, 'multi_gpu_train.py'),
            '--max_steps=%d' % per_run] + flags
  # Sync: an update takes one step of every worker. Async: every worker's step is
  # one update. Both: the chief's first steps come before the others have started.
  lag = 0 if workers == 1 else START_LAG_SECS * solo_rate / (args.batch_size * towers)
  max_steps = (per_run if sync else per_run * workers) + math.ceil(lag)
  return ([sys.executable, '-u', os.path.join(ROOT, 'dist_train.py'),
           '--local_cluster=1,%d' % workers, '--max_steps=%d' % max_steps] + flags +
          (['--sync_replicas'] if sync else []))


def steps_by_task(output):
  """{task: [(local step, seconds since the epoch), ...]} from the loss lines."""
  tasks = {}
  for line in output.splitlines():
    match = LOSS_LINE.match(line)
    if match:
      step = int(match.group('local_step') or match.group('step'))
      when = datetime.datetime.fromisoformat(match.group('time')).timestamp()
      tasks.setdefault(match.group('task') or 'local', []).append((step, when))
  return tasks


def window_rate(tasks, warmup, examples_per_step):
  """examples/sec of all tasks together while every one of them is past its warm-up.

  Args:
    tasks: {task: [(local step, time in seconds), ...]}, from steps_by_task.
    warmup: local steps each task runs before the window may open.
    examples_per_step: images of one local step of one task.

  Returns:
    (examples/sec, window seconds), or (None, reason) when the window holds
    fewer than two lines of some task.
  """
  opens = max(min(t for step, t in lines if step >= warmup) for lines in tasks.values())
  closes = min(lines[-1][1] for lines in tasks.values())
  total = 0.0
  for task, lines in sorted(tasks.items()):
    inside = [(step, t) for step, t in lines if opens <= t <= closes]
    if len(inside) < 2 or inside[-1][1] == inside[0][1]:
      return None, '%s has %d loss lines while all tasks train' % (task, len(inside))
    total += ((inside[-1][0] - inside[0][0]) * examples_per_step /
              (inside[-1][1] - inside[0][1]))
  return total, closes - opens


def run_one(args, runner, label, workers, sync, solo_rate):
  """Runs one configuration to its end; returns its rate and raw lines for the JSON."""
  start = time.time()
  with tempfile.TemporaryDirectory(prefix='cifar10_dist_benchmark_') as train_dir:
    argv = command(args, workers, sync, train_dir, solo_rate)
    try:
      proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECS,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    except subprocess.TimeoutExpired as e:
      raise BenchmarkError('%s ran longer than %d s and was stopped; lower --steps'
                           % (label, RUN_TIMEOUT_SECS)) from e
  output = proc.stdout + proc.stderr
  tasks = steps_by_task(proc.stdout)
  missing = len(tasks) < (workers or 1) or any(
      all(step < args.warmup for step, _ in lines) for lines in tasks.values())
  if proc.returncode or missing:
    why = 'exit status %d' % proc.returncode if proc.returncode else 'too few loss lines'
    raise BenchmarkError('%s failed (%s). Its last output lines:\n%s\nTo rerun it alone: '
                         '%s' % (label, why, '\n'.join(output.strip().splitlines()[-25:]),
                                 ' '.join(argv)))
  examples_per_step = args.batch_size * args.dist_towers
  examples_per_sec, window = window_rate(tasks, args.warmup, examples_per_step)
  if examples_per_sec is None:
    raise BenchmarkError('%s: %s; raise --steps' % (label, window))
  result = dict(label=label, command=argv, workers=workers, sync=sync,
                examples_per_sec=examples_per_sec, window_sec=window,
                examples_per_step=examples_per_step, loss_lines=tasks, wall_sec=time.time() - start)
  runner.progress(label, ': %.1f examples/sec' % examples_per_sec, result['wall_sec'])
  return result


def run_repeat(args, runner, runs, repeat):
  """One pass over runs_for(args) in order, appending each to runs[('dist', label)]."""
  solo_rate = None
  for label, workers, sync in runs_for(args):
    result = run_one(args, runner, label + repeat_tag(repeat, args.repeats), workers, sync,
                     solo_rate)
    runs.setdefault(('dist', label), []).append(result)
    if workers == 1 and not sync:
      solo_rate = result['examples_per_sec']


def summarise(args, runs):
  """Prints the distribution rows; returns {label: dict(examples_per_sec, ...)}."""
  rows = {}
  for label, workers, sync in runs_for(args):
    rates = [r['examples_per_sec'] for r in runs[('dist', label)]]
    rows[label] = dict(examples_per_sec=statistics.median(rates), per_repeat=rates,
                       workers=workers, sync=sync)
  for row in rows.values():
    row['vs_multi_gpu_train'] = row['examples_per_sec'] / rows[BASELINE]['examples_per_sec']
  print()
  print('What distribution costs: towers per worker %d, batch %d per tower, synthetic '
        'input, one ps task, all on 127.0.0.1; examples/sec of all workers together from '
        'their loss lines, after %d warm-up steps%s' % (
            args.dist_towers, args.batch_size, args.warmup,
            ', median of %d repeats' % args.repeats if args.repeats > 1 else ''))
  print('%-42s  %8s  %s' % ('run', 'ex/s', 'vs multi_gpu_train.py'))
  for label, workers, _ in runs_for(args):
    print('%-42s  %8.0f  %7.2f%s' % (
        label, rows[label]['examples_per_sec'], rows[label]['vs_multi_gpu_train'],
        '   (both workers share the %d cores)' % os.cpu_count() if workers == 2 else ''))
  return rows
