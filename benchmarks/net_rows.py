"""python -m benchmarks.net_rows: the distributed modes where the network is the limit.

Each task of a job runs at an address of its own in a private test network
(benchmarks/netlab.py: one namespace per task on a bridge, all inside one private
namespace, so nothing reaches a real network), every task's link shaped both ways by
tbf to the rate given, or left unshaped. For each rate, mode and worker count one job of
`dist_train.py` (CIFAR-10, --synthetic, one tower a worker) runs past its warm-up; then,
over the next --steps global steps, this reads from the chief's loss lines and the
links' own counters:
  ex/s         examples a second of all workers together (global steps x examples each)
  MB/update    the bytes of one update through the busiest link, in its busier direction
               (ps modes: the gradients', as many as the variables' reads; see
               bytes_per_update for where each is counted)
  bound        the examples a second that link's rate allows at those bytes (rate / bytes
               x examples per update); ours as a share of it
Then multi_gpu_train.py with as many towers as workers, unshaped (nothing to send), for
the all-reduce target: within 10% of it.

    python -m benchmarks.net_rows                                  # the whole table
    python -m benchmarks.net_rows --rates 200mbit --workers 2      # one row per mode

Needs root, iproute2 and iptables (netlab.available() says what is missing). Every task
shares this machine's cores: at 4 workers on 2 cores the unshaped rows measure the
cores, not the network.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import threading

from benchmarks import netlab
from benchmarks.loss_lines import LOSS_LINE, steps_by_task
from benchmarks.timing import ArgumentParser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 2222                  # every task's port, each at an address of its own
RUN_TIMEOUT_SECS = 900       # one job, start to its last measured step
MODES = {'async ps': (1, []), 'sync ps': (1, ['--sync_replicas']),  # (ps tasks, flags)
         'all-reduce': (0, ['--all_reduce'])}
# Where one update's bytes through the busiest link are counted (bytes_per_update): the
# link, the direction (0 sent, 1 received, by that task), and whose steps are updates.
COUNTED = {'async ps': (('worker', 0), 0, 'local_step'), 'sync ps': (('ps', 0), 1, 'step'),
           'all-reduce': (('worker', 0), 1, 'step')}


def parse_args(argv):
  parser = ArgumentParser(prog='python -m benchmarks.net_rows', description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          allow_abbrev=False)  # a mistake: one line (benchmarks/timing.py)
  parser.add_argument('--rates', default='unshaped,1gbit,200mbit',
                      help='link rates, tc\'s words, or unshaped; comma-separated')
  parser.add_argument('--workers', default=[2, 4], type=worker_counts,
                      help='worker counts, comma-separated')
  parser.add_argument('--modes', default=','.join(MODES), help='of: ' + ', '.join(MODES))
  parser.add_argument('--batch_size', type=int, default=128, help='images per worker step '
                      '(multi_gpu_train.py\'s BATCH_SIZE)')
  parser.add_argument('--warmup', type=int, default=5, help='global steps before measuring')
  parser.add_argument('--steps', type=int, default=20, help='global steps measured')
  parser.add_argument('--task_flags', default='', help='more flags for every task, '
                      'space-separated (e.g. --intra_op_threads=1)')
  parser.add_argument('--repeats', type=int, default=3, help='rounds over every job, '
                      'interleaved; the table shows medians')
  return parser.parse_args(argv)


def worker_counts(text):
  """'2,4' -> [2, 4]; argparse says what is wrong with anything else, in one line."""
  try:
    counts = [int(n) for n in text.split(',')]
  except ValueError:
    counts = [0]
  if min(counts) < 1:
    raise argparse.ArgumentTypeError('%r is not worker counts such as 2,4' % text)
  return counts


def rate_bytes_per_sec(rate):
  """'200mbit' -> 25e6; 'unshaped' -> None; SystemExit for what tc would not take."""
  if rate == 'unshaped':
    return None
  found = netlab.rate_bytes(rate)
  if found is None:
    raise SystemExit('error: --rates: %r is not unshaped or a rate such as 200mbit' % rate)
  return found


def job_argv(mode, task, ps_hosts, worker_hosts, train_dir, args):
  job_name, index = task
  _, flags = MODES[mode]
  return [sys.executable, '-u', os.path.join(ROOT, 'dist_train.py'), '--job_name=' + job_name,
          '--task_index=%d' % index, '--ps_hosts=' + ','.join(ps_hosts),
          '--worker_hosts=' + ','.join(worker_hosts), '--allow_nonloopback_hosts',
          '--synthetic', '--batch_size=%d' % args.batch_size, '--log_frequency=1',
          '--summary_steps=0', '--save_every_n_steps=1000000000', '--max_steps=1000000000',
          '--train_dir=' + train_dir, '--startup_timeout_secs=300',
          '--step_timeout_secs=600'] + flags + args.task_flags.split()


def run_job(lab, mode, num_workers, rate, args):
  """One job in the lab, every link at rate; returns its row (a dict)."""
  num_ps, _ = MODES[mode]
  tasks = [('ps', i) for i in range(num_ps)] + [('worker', i) for i in range(num_workers)]
  hosts = {task: lab.add_host('%s%d-%d' % (task[0], task[1], len(lab.hosts)))
           for task in tasks}
  for host in hosts.values():
    if rate != 'unshaped':
      lab.shape(host, rate)
  address = lambda task: '%s:%d' % (hosts[task].address, PORT)  # noqa: E731
  ps_hosts = [address(t) for t in tasks if t[0] == 'ps']
  worker_hosts = [address(t) for t in tasks if t[0] == 'worker']
  with tempfile.TemporaryDirectory(prefix='cifar10_net_rows_') as train_dir:
    processes = {task: subprocess.Popen(
        lab.command(hosts[task], job_argv(mode, task, ps_hosts, worker_hosts, train_dir, args)),
        stdout=subprocess.PIPE if task == ('worker', 0) else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
        for task in tasks}
    try:
      marks = measure(lab, processes[('worker', 0)], hosts[COUNTED[mode][0]], args)
    finally:
      for process in processes.values():
        process.kill()
        process.wait()
  per_update = args.batch_size * (1 if mode == 'async ps' else num_workers)
  updates = marks[-1]['step'] - marks[0]['step']
  busiest = bytes_per_update(mode, marks)
  limit = rate_bytes_per_sec(rate)
  bound = limit / busiest * per_update if limit else None
  return dict(mode=mode, workers=num_workers, rate=rate,
              examples_per_sec=updates * per_update / (marks[-1]['when'] - marks[0]['when']),
              busiest_bytes_per_update=busiest, bound_examples_per_sec=bound)


def bytes_per_update(mode, marks):
  """The bytes of one update through the busiest link: the median over the window's
  steps, each counted on the link, in the direction, where none are under way at a
  mark (the chief's loss lines; COUNTED): the next step reads the variables at once,
  but sends its gradients only once they are computed.

  ps modes: the gradients' direction, as many bytes as the reads' (the variables' size).
  Sync, into the ps: every worker's gradient is in before the update the mark follows.
  Async, out of the chief, over its own updates: an update is one worker's gradient,
  and on the ps's link the other worker's is under way at any mark (3.85 MB counted
  where 4.27 cross, over 6 updates; CI 2026-12-02). All-reduce, into the chief: each
  link carries as much both ways, and the step ends once the chief has what it needs,
  its own last part still on the way out (4.42 MB counted out of it, 4.27 in: the smoke
  test's command, tests/test_benchmark.py, 2026-12-02). A counter read late, once the
  next step's transfer has begun, moves the two steps beside it, one up, one down (all-
  reduce's next begins within milliseconds at a small batch: 3.38 MB over a window,
  CI 2026-12-02): the median of three or more steps is the step between.
  """
  _, direction, steps = COUNTED[mode]
  return statistics.median(
      (after['bytes'][direction] - before['bytes'][direction]) / (after[steps] - before[steps])
      for before, after in zip(marks, marks[1:]) if after[steps] > before[steps])


def measure(lab, chief, host, args):
  """[{step, local_step (the chief's), when, bytes: host's link (sent, received)}] at each
  of the chief's loss lines from the window's start to its end, read as they come: the
  counter first."""
  timer = threading.Timer(RUN_TIMEOUT_SECS, chief.kill)
  timer.start()
  marks, start = [], None
  try:
    for line in chief.stdout:
      found = LOSS_LINE.match(line)
      if not found:
        continue
      step = int(found.group('step'))
      if start is None and step >= args.warmup:
        start = step
      if start is not None:
        marks.append(dict(bytes=lab.link_bytes(host), step=step,
                          local_step=int(found.group('local_step')),
                          when=datetime.datetime.fromisoformat(found.group('time')).timestamp()))
        if step >= start + args.steps:
          return marks
  finally:
    timer.cancel()
  raise SystemExit('error: the chief ended before step %d (rerun with fewer --steps, or '
                   'look at it alone: python dist_train.py --local_cluster=...)'
                   % (args.warmup + args.steps))


def local_rate(num_towers, args):
  """multi_gpu_train.py's examples a second with num_towers towers, over the same window
  of steps as the jobs' (its loss lines' own times, as the chief's are read)."""
  with tempfile.TemporaryDirectory(prefix='cifar10_net_rows_') as train_dir:
    done = subprocess.run(
        [sys.executable, '-u', os.path.join(ROOT, 'multi_gpu_train.py'), '--synthetic',
         '--num_gpus=%d' % num_towers, '--batch_size=%d' % args.batch_size,
         '--log_frequency=1', '--summary_steps=0', '--train_dir=' + train_dir,
         '--max_steps=%d' % (args.warmup + args.steps)], capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), timeout=RUN_TIMEOUT_SECS)
  [(_, start), *_, (_, end)] = [
      (step, when) for step, when in steps_by_task(done.stdout)['local']
      if step >= args.warmup]
  return args.steps * args.batch_size * num_towers / (end - start)


def print_table(rows, local, args):
  print('\nThe distributed modes on shaped links: CIFAR-10, --synthetic, batch %d a worker, '
        'one tower each, every task at its own address; %d global steps after %d'
        % (args.batch_size, args.steps, args.warmup))
  print('MB/update: through the busiest link, its busier direction; bound: what that '
        'link\'s rate allows at those bytes')
  print('%-9s %-7s %-11s %8s %10s %8s %6s' % ('rate', 'workers', 'mode', 'ex/s', 'MB/update',
                                              'bound', 'share'))
  for row in rows:
    bound = row['bound_examples_per_sec']
    print('%-9s %-7d %-11s %8.0f %10.2f %8s %6s' % (
        row['rate'], row['workers'], row['mode'], row['examples_per_sec'],
        row['busiest_bytes_per_update'] / 1e6, '%.0f' % bound if bound else '-',
        '%.0f%%' % (100 * row['examples_per_sec'] / bound) if bound else '-'))
  for (rate, workers), by_mode in _by_job(rows).items():
    if 'all-reduce' in by_mode and 'sync ps' in by_mode:
      print('%s, %d workers: all-reduce / sync ps = %.2f' % (
          rate, workers, by_mode['all-reduce'] / by_mode['sync ps']))
    if rate == 'unshaped' and 'all-reduce' in by_mode and workers in local:
      print('unshaped, %d workers: all-reduce / multi_gpu_train.py with %d towers (%.0f '
            'ex/s) = %.2f' % (workers, workers, local[workers],
                              by_mode['all-reduce'] / local[workers]))


def _median_row(repeats):
  """One job's row: the median of each figure over its repeats."""
  row = dict(repeats[0])
  for key in ('examples_per_sec', 'busiest_bytes_per_update', 'bound_examples_per_sec'):
    if row[key] is not None:
      row[key] = statistics.median(r[key] for r in repeats)
  return row


def _by_job(rows):
  found = {}
  for row in rows:
    found.setdefault((row['rate'], row['workers']), {})[row['mode']] = row['examples_per_sec']
  return found


def main(argv):
  args = parse_args(argv)
  why_not = netlab.available()
  if why_not:
    raise SystemExit('error: %s' % why_not)
  modes = args.modes.split(',')
  unknown = [mode for mode in modes if mode not in MODES]
  if unknown:
    raise SystemExit('error: --modes: %s unknown; give some of %s' % (unknown, list(MODES)))
  jobs = [(rate, workers, mode) for rate in args.rates.split(',')
          for workers in args.workers for mode in modes]
  for rate in args.rates.split(','):
    rate_bytes_per_sec(rate)  # checked before the first job
  runs, local_runs = {}, {}
  for repeat in range(args.repeats):
    for rate, workers, mode in jobs:
      lab = netlab.Lab()
      try:
        row = run_job(lab, mode, workers, rate, args)
      finally:
        lab.stop()
      runs.setdefault((rate, workers, mode), []).append(row)
      print('round %d: %s, %d workers, %s: %.0f examples/sec' % (
          repeat + 1, rate, workers, mode, row['examples_per_sec']), flush=True)
      if rate == 'unshaped' and mode == 'all-reduce':  # the local trainer beside it
        local_runs.setdefault(workers, []).append(local_rate(workers, args))
  rows = [_median_row(runs[job]) for job in jobs]
  local = {workers: statistics.median(rates) for workers, rates in local_runs.items()}
  print_table(rows, local, args)


if __name__ == '__main__':
  main(sys.argv[1:])
