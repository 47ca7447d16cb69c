"""Benchmarks the multi-tower trainer against Keras, against dist_train.py, and the machine.

    python -m benchmarks                       # the table, towers 1, 2, 4
    python -m benchmarks --repeats 3           # three times over, medians across
    python -m benchmarks --quick               # smoke test: 1 tower, 3 steps, batch 16
    python -m benchmarks --profile --towers=1  # op time by op type: oneDNN off, on, bf16

Run from the repository's root. Other work on the cores skews the numbers, so the
start-up line prints the load average. What this machine measured, and how long each
command takes: docs/performance.md.

The table, per number of towers N (global batch N x --batch_size):
  real, synthetic   ours: multi_gpu_train.build over placement.tower_devices(N)'s
                    devices, in session_config()'s session, one sess.run of [train
                    op, loss] timed per step; generated files in the real CIFAR-10
                    layout (distorted_dataset), or in-memory batches (synthetic_dataset)
  custom-loop peer  the same model in Keras, a tf.function step under
                    MirroredStrategy on the same devices and global batch
  model.fit peer    the same model compiled with Keras defaults, model.fit under
                    MirroredStrategy, each batch timed by a callback
  GFLOP/s, of mm    synthetic examples/sec x FLOPs per example, and that as a share
                    of the machine's measured float32 matmul rate
  peak MB           ru_maxrss of each configuration's process, forked after
                    TensorFlow's import: what the configuration touched, less
                    than a fresh process, which also counts the library pages
                    its import read
  bfloat16          on a CPU with bfloat16 units, at each N with oneDNN on: ours
                    with --use_bf16 and both peers under Keras' mixed_bfloat16 policy
                    (float32 variables, LRN and logits), from the same weights; printed
                    with what each ratio compares (bfloat16 over bfloat16, and each
                    over its own float32 rate)
Rates are the median over --steps timed steps after --warmup, [slowest - fastest
step]. Then what distribution costs (dist_rows.py: dist_train.py with one ps task
and one or two workers on 127.0.0.1, against multi_gpu_train.py, from their own
loss lines) and each target against what was measured (targets.py).

Files: this one parses the flags and writes every number to --json (default
benchmarks/results/benchmark.json, or profile.json); table.py, dist_rows.py and
op_profile.py schedule the runs and print, loss_lines.py reads the dist rows' rates
from the programs' output, targets.py holds the targets. runner.py runs one
`python -m benchmarks.worker` process per configuration, forked from a parent that
has imported TensorFlow (one per environment), so devices, thread pools and memory
start clean without the seconds of an import each; measure_*.py time inside it,
keras_peer.py is the peers' model, timing.py what both sides share. This process and its modules import no TensorFlow.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from benchmarks import op_profile, table
from benchmarks.timing import ArgumentParser, BenchmarkError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCHES_DIR = 'cifar-10-batches-bin'  # cifar10_input's; this parent imports no TensorFlow

# ---- Benchmark knobs: edit, save, rerun -----------------------------------------
TOWERS = '1,2,4'                  # tower counts of the table, one row each
BATCH_SIZE = 128                  # images per tower, as the trainer's BATCH_SIZE
TIMED_STEPS = 15                  # steps timed per configuration; the median is reported
WARMUP_STEPS = 5                  # untimed steps first: graph optimisation, buffers filling
REPEATS = 1                       # times the whole interleaved sequence runs
DIST_TOWERS = 1                   # towers per worker in the distribution rows (the target's)
RECORDS_PER_FILE = 10000          # generated records per .bin file, as the official files
MATMUL_SIZE = 2048                # n of the n x n float32 matmul: 2 n^3 FLOP = 17.2 GFLOP
RESULTS_DIR = os.path.join(ROOT, 'benchmarks', 'results')

# --quick: small enough for a test; flags given explicitly still win.
QUICK = dict(towers='1', steps=3, warmup=1, batch_size=16, records_per_file=64,
             matmul_size=256, dist_towers=1)


def parse_args(argv):
  """The flags, checked: a mistake stops the run with one line naming it."""
  parser = ArgumentParser(prog='python -m benchmarks', description=__doc__.split('\n')[0],
                          allow_abbrev=False)
  parser.add_argument('--towers', default=TOWERS, help='tower counts, comma separated')
  parser.add_argument('--steps', type=int, default=TIMED_STEPS, help='timed steps per run')
  parser.add_argument('--warmup', type=int, default=WARMUP_STEPS,
                      help='untimed steps before them')
  parser.add_argument('--batch_size', type=int, default=BATCH_SIZE, help='images per tower')
  parser.add_argument('--intra_op_threads', type=int, default=0, help='0: one per core')
  parser.add_argument('--inter_op_threads', type=int, default=0, help='0: one per core')
  parser.add_argument('--repeats', type=int, default=REPEATS,
                      help='runs of the interleaved sequence; medians across')
  parser.add_argument('--records_per_file', type=int, default=RECORDS_PER_FILE,
                      help='generated records per .bin file for the real-input runs')
  parser.add_argument('--data_dir', default=None,
                      help='use this directory\'s cifar-10-batches-bin/ instead of '
                      'generated files')
  parser.add_argument('--matmul_size', type=int, default=MATMUL_SIZE, help='n of n x n')
  parser.add_argument('--dist_towers', type=int, default=DIST_TOWERS,
                      help='towers per worker in the distribution rows')
  parser.add_argument('--skip_peer', action='store_true', help='no Keras peer runs')
  parser.add_argument('--skip_dist', action='store_true',
                      help='no dist_train.py or multi_gpu_train.py runs')
  parser.add_argument('--profile', action='store_true',
                      help='instead of the table: one step traced, op time by op type, at '
                      'the first of --towers')
  parser.add_argument('--quick', action='store_true', help='tiny smoke run: %s' % QUICK)
  parser.add_argument('--json', default=None,
                      help='where the numbers go; default benchmarks/results/benchmark.json '
                      '(--profile: profile.json)')
  args = parser.parse_args(argv)
  if args.quick:
    parser.set_defaults(**QUICK)  # explicit flags still win on the second parse
    args = parser.parse_args(argv)
  check_args(parser, args)
  return args


def check_args(parser, args):
  try:
    args.towers = [int(t) for t in args.towers.split(',')]
  except ValueError:
    parser.error('--towers must be comma-separated integers, got %r' % args.towers)
  for name in ('steps', 'batch_size', 'repeats', 'records_per_file', 'matmul_size',
               'dist_towers'):
    if getattr(args, name) < 1:
      parser.error('--%s must be at least 1, got %d' % (name, getattr(args, name)))
  for name in ('warmup', 'intra_op_threads', 'inter_op_threads'):
    if getattr(args, name) < 0:
      parser.error('--%s must be 0 or more, got %d' % (name, getattr(args, name)))
  if min(args.towers) < 1:
    parser.error('--towers must all be at least 1, got %s' % args.towers)
  if args.data_dir and not os.path.isdir(os.path.join(args.data_dir, BATCHES_DIR)):
    parser.error('--data_dir %s has no %s/ directory; pass the directory that holds it'
                 % (args.data_dir, BATCHES_DIR))


def write_sample(data_dir, records_per_file):
  """The product's sample writer (cifar10_input.py --write_sample); returns the md5."""
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'cifar10_input.py'),
                         '--write_sample=' + data_dir,
                         '--records_per_file=%d' % records_per_file],
                        capture_output=True, text=True, check=True)
  return re.search(r'archive md5 (\w+)', done.stdout).group(1)


def main(argv):
  args = parse_args(argv)
  mode = 'profile' if args.profile else 'table'
  json_path = args.json or os.path.join(RESULTS_DIR, '%s.json' % (
      'profile' if args.profile else 'benchmark'))
  load = os.getloadavg()[0]
  print('CIFAR-10 trainer benchmark: %s; %d CPU cores, load average %.2f at start%s' % (
      mode, os.cpu_count(), load,
      ' (busy: other work skews these numbers)' if load > 0.5 else ''), flush=True)
  output = dict(args=vars(args), cpu_count=os.cpu_count(), load_average_at_start=load)
  with tempfile.TemporaryDirectory(prefix='cifar10_benchmark_') as tmp_dir:
    data_dir = args.data_dir
    if not data_dir and not args.profile:
      data_dir = tmp_dir
      write_sample(data_dir, args.records_per_file)
      print('real input: generated %d records per file in %s (removed at the end)'
            % (args.records_per_file, data_dir), flush=True)
    try:
      if args.profile:
        output['profile'] = op_profile.run_profile(args)
      else:
        output['table'] = table.run_table(args, data_dir)
    except BenchmarkError as e:
      sys.exit('error: %s' % e)
  output['load_average_at_end'] = os.getloadavg()[0]
  os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
  with open(json_path, 'w') as f:
    json.dump(output, f, indent=1)
  print('\nwrote %s' % json_path)
