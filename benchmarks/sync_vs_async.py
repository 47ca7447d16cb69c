"""Synchronous versus asynchronous towers on this machine, side by side.

    python benchmarks/sync_vs_async.py               # 2 towers, 3 rounds, ~3 minutes

Runs the trainer itself (multi_gpu_train.py) with and without --async_towers,
interleaved, on the same generated learnable data and the same number of images:
sync takes EXAMPLES / (towers x batch) steps, async EXAMPLES / batch updates.
Prints the median examples/sec of each mode (from the trainer's own log lines,
first line dropped), the loss each reached, and how many runs diverged (the
trainer stops on a NaN or infinite loss), and writes them as JSON.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))

from benchmark import write_sample  # noqa: E402  the product's sample writer, run as a user would
from timing import ArgumentParser  # noqa: E402

# ---- Comparison knobs: edit, save, rerun ----------------------------------------
TOWERS = 2
BATCH_SIZE = 128          # images per tower
EXAMPLES = 64000          # images each run trains on: 250 sync steps of 2 x 128
ROUNDS = 5                # sync, async, sync, async, ...
RECORDS_PER_FILE = 2000   # generated learnable records per .bin file

LINE = re.compile(r': step (\d+), loss = (\d+\.\d+) \((\d+\.\d) examples/sec')


def run(mode, data_dir, data_md5, args):
  """One training run from step 0; returns its log lines' rates and last loss."""
  # Sync: a global step is one update of towers x batch images. Async: global_step
  # counts every tower's own update of batch images.
  images_per_step = args.batch_size * (1 if mode == 'async' else args.towers)
  max_steps = args.examples // images_per_step
  with tempfile.TemporaryDirectory() as train_dir:
    command = [sys.executable, os.path.join(ROOT, 'multi_gpu_train.py'),
               '--num_gpus=%d' % args.towers, '--batch_size=%d' % args.batch_size,
               '--max_steps=%d' % max_steps, '--data_dir=' + data_dir,
               '--data_md5=' + data_md5,
               '--train_dir=' + train_dir, '--summary_steps=0', '--log_frequency=10',
               '--save_every_n_steps=%d' % (max_steps + 1)]
    if mode == 'async':
      command.append('--async_towers')
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  lines = LINE.findall(done.stdout)
  if done.returncode and 'diverged' in done.stderr:
    return dict(diverged=True, last_step=int(lines[-1][0]) if lines else 0)
  if done.returncode:
    sys.exit('error: %s run failed:\n%s' % (mode, done.stderr[-3000:]))
  rates = [float(rate) for _, _, rate in lines[1:]]  # the first step builds kernels
  return dict(examples_per_sec=statistics.median(rates), last_loss=float(lines[-1][1]),
              last_step=int(lines[-1][0]))


def main():
  parser = ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
  parser.add_argument('--towers', type=int, default=TOWERS)
  parser.add_argument('--batch_size', type=int, default=BATCH_SIZE)
  parser.add_argument('--examples', type=int, default=EXAMPLES)
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  parser.add_argument('--json', default=os.path.join(ROOT, 'benchmarks', 'results',
                                                     'sync_vs_async.json'))
  args = parser.parse_args()
  results = {'sync': [], 'async': []}
  with tempfile.TemporaryDirectory() as data_dir:
    data_md5 = write_sample(data_dir, RECORDS_PER_FILE)
    for round_ in range(args.rounds):
      for mode in ('sync', 'async'):
        results[mode].append(run(mode, data_dir, data_md5, args))
        print('round %d %-5s %s' % (round_ + 1, mode, results[mode][-1]), flush=True)
  print('\n%d towers x %d images, %d images per run, median of %d rounds'
        % (args.towers, args.batch_size, args.examples, args.rounds))
  summary = {}
  for mode, runs in results.items():
    finished = [r for r in runs if not r.get('diverged')]
    summary[mode] = dict(
        diverged=len(runs) - len(finished),
        examples_per_sec=statistics.median(r['examples_per_sec'] for r in finished),
        last_loss=statistics.median(r['last_loss'] for r in finished))
    print('%-5s  %7.1f examples/sec   loss at the end %.2f   diverged in %d of %d runs' % (
        mode, summary[mode]['examples_per_sec'], summary[mode]['last_loss'],
        summary[mode]['diverged'], len(runs)))
  print('async / sync examples/sec: %.2f' % (summary['async']['examples_per_sec'] /
                                             summary['sync']['examples_per_sec']))
  os.makedirs(os.path.dirname(args.json), exist_ok=True)
  with open(args.json, 'w') as f:
    json.dump(dict(args=vars(args), runs=results, summary=summary), f, indent=1)


if __name__ == '__main__':
  main()
