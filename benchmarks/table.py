"""The main table: the trainer against both Keras peers at each N, and the machine's rates.

Each repeat runs, in this order: the matmul, the input pipeline alone, then at each
N ours on synthetic input, the custom-loop peer, the model.fit peer and ours on
real input, so that a change in the machine's load shows in all of them alike;
then the distribution rows (dist_rows.py). The targets (targets.py) come last.
"""
import statistics

import dist_rows
import targets
from runner import Runner, flatten, fmt, ours_config, rate, rate_stats, ratio, repeat_tag

MATMUL_RUNS = 10                  # timed matmuls; the median rate is reported
PEERS = [('peer', 'custom-loop peer'), ('fit', 'model.fit peer')]  # worker kind, label
MNIST_TOWERS = 2                  # the MNIST row: the book's 2 towers ...
MNIST_BATCH_SIZE = 100            # ... of 100 images
# The --use_fp16 row: at the table's first N only, synthetic input. On a CPU without
# float16 arithmetic it is slower than float32, not faster (docs/performance.md).


def flop_count(layers):
  """FLOPs per example of one training step, from the layers' shapes.

  Per layer with M multiply-adds per example (conv: out_h*out_w*out_c * k*k*in_c;
  dense: in*out):
    forward                  F = 2 M   (a multiply and an add each)
    gradient wrt the weights     2 M   (the same products, input x output gradient)
    gradient wrt the input       2 M   (output gradient x weights), except conv1,
                                       whose input is the image and needs none
  so a step costs 3 x forward - conv1's forward. For the tutorial's model:
    conv1    M = 24*24*64 * 5*5*3  =  2,764,800   F =  5.53 MFLOP
    conv2    M = 12*12*64 * 5*5*64 = 14,745,600   F = 29.49
    local3   M = 2304 * 384        =    884,736   F =  1.77
    local4   M = 384 * 192         =     73,728   F =  0.15
    softmax  M = 192 * 10          =      1,920   F =  0.004
    forward 36.94 + weight gradients 36.94 + input gradients 31.41
      = 105.3 MFLOP per example (105,295,104)
  Biases, relu, pooling, LRN and the loss are left out: about 0.7 MFLOP forward
  (mostly the two LRNs), 1-2% of the total.

  Args:
    layers: list of dicts with name, macs (multiply-adds per example) and
      input_gradient (bool), from the 'flops' worker.

  Returns:
    dict of FLOPs per example: forward, backward_weights, backward_inputs, total.
  """
  forward = sum(2 * layer['macs'] for layer in layers)
  backward_inputs = sum(2 * layer['macs'] for layer in layers if layer['input_gradient'])
  return dict(forward=forward, backward_weights=forward, backward_inputs=backward_inputs,
              total=2 * forward + backward_inputs)


def run_table(args, data_dir):
  """Runs every configuration, prints the table, the distribution rows and the targets.

  Returns:
    dict for the JSON: flops_per_example, matmul, pipeline, towers (a row per N),
    dist (None with --skip_dist), targets, runs (every worker's raw result).
  """
  per_repeat = (4 + len(args.towers) * (2 if args.skip_peer else 2 + len(PEERS)) +
                (0 if args.skip_dist else len(dist_rows.runs_for(args))))
  runner = Runner(1 + args.repeats * per_repeat)
  layers = runner.run('FLOPs from the layer shapes', dict(kind='flops'))['layers']
  runs = {}
  for repeat in range(args.repeats):
    run_repeat(args, data_dir, runner, runs, repeat)
    if not args.skip_dist:
      dist_rows.run_repeat(args, runner, runs, repeat)
  table = summarise(args, runs, layers)
  print_table(args, table)
  dist = None if args.skip_dist else dist_rows.summarise(args, runs)
  table.update(dist=dist, targets=targets.check(table['towers'], dist), runs=flatten(runs))
  return table


def run_repeat(args, data_dir, runner, runs, repeat):
  """One pass over the table's configurations, appending each result to runs[key]."""
  def run(key, label, config):
    runs.setdefault(key, []).append(runner.run(label + repeat_tag(repeat, args.repeats),
                                               config))

  common = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                intra=args.intra_op_threads, inter=args.inter_op_threads)
  run('matmul', 'matmul %dx%d' % (args.matmul_size, args.matmul_size),
      dict(kind='matmul', size=args.matmul_size, runs=MATMUL_RUNS))
  run('pipeline', 'input pipeline alone', dict(kind='pipeline', data_dir=data_dir, **common))
  for towers in args.towers:
    run(('synthetic', towers), 'ours N=%d synthetic' % towers,
        ours_config(args, towers, 'synthetic'))
    for kind, name in [] if args.skip_peer else PEERS:
      run((kind, towers), '%s N=%d synthetic' % (name, towers),
          dict(kind=kind, towers=towers, **common))
    run(('real', towers), 'ours N=%d real' % towers,
        ours_config(args, towers, 'real', data_dir))
  run('mnist', 'ours MNIST N=%d synthetic' % MNIST_TOWERS,
      ours_config(args, MNIST_TOWERS, 'synthetic', dataset='mnist',
                  batch_size=MNIST_BATCH_SIZE))
  run('fp16', 'ours N=%d synthetic --use_fp16' % args.towers[0],
      ours_config(args, args.towers[0], 'synthetic', use_fp16=True))


def summarise(args, runs, layers):
  """The table's numbers: medians over repeats, ratios, FLOP rates."""
  flops = flop_count(layers)
  matmul_gflops = statistics.median(r['gflops'] for r in runs['matmul'])
  pipeline = rate_stats(runs['pipeline'])
  rows = {}
  for towers in args.towers:
    stats = {kind: rate_stats(runs[(kind, towers)]) if (kind, towers) in runs else None
             for kind in ('real', 'synthetic', 'peer', 'fit')}
    achieved = stats['synthetic']['examples_per_sec'] * flops['total'] / 1e9
    rows[str(towers)] = dict(
        stats, global_batch=towers * args.batch_size,
        real_over_synthetic=ratio(stats['real'], stats['synthetic']),
        ours_over_peer=ratio(stats['synthetic'], stats['peer']),
        ours_over_fit=ratio(stats['synthetic'], stats['fit']),
        achieved_gflops=achieved, fraction_of_matmul=achieved / matmul_gflops,
        real_achieved_gflops=stats['real']['examples_per_sec'] * flops['total'] / 1e9,
        pipeline_over_synthetic=ratio(pipeline, stats['synthetic']))
  return dict(flops_per_example=dict(flops, layers=layers),
              matmul=dict(size=args.matmul_size, gflops=matmul_gflops,
                          per_repeat=[r['gflops'] for r in runs['matmul']]),
              pipeline=pipeline, towers=rows, mnist=rate_stats(runs['mnist']),
              fp16=dict(rate_stats(runs['fp16']), towers=args.towers[0],
                        over_float32=ratio(rate_stats(runs['fp16']),
                                           rows[str(args.towers[0])]['synthetic'])))


def print_table(args, table):
  """The lines above the table (FLOPs, matmul, pipeline, how rates are taken), then it."""
  flops, layers = table['flops_per_example'], table['flops_per_example']['layers']
  print()
  print('FLOPs per example: %.1f M = forward %.2f M + weight gradients %.2f M + input '
        'gradients %.2f M (%s)' % (
            flops['total'] / 1e6, flops['forward'] / 1e6, flops['backward_weights'] / 1e6,
            flops['backward_inputs'] / 1e6,
            ', '.join('%s %.2f' % (l['name'], 2 * l['macs'] / 1e6) for l in layers)))
  print('float32 matmul %dx%d: %.1f GFLOP/s (median of %d, all cores); input pipeline '
        'alone: %s images/sec' % (args.matmul_size, args.matmul_size,
                                  table['matmul']['gflops'], MATMUL_RUNS,
                                  rate(table['pipeline'], 1).strip()))
  print('examples/sec: median of %d timed steps after %d warm-up [slowest-fastest step]%s; '
        'batch %d per tower; threads intra %d inter %d' % (
            args.steps, args.warmup, ', median of %d repeats' % args.repeats
            if args.repeats > 1 else '', args.batch_size, args.intra_op_threads,
            args.inter_op_threads))
  print()
  print('towers  global  %-20s  %-20s  real/syn  %-20s  ours/peer  %-20s  ours/fit  '
        'GFLOP/s  of mm  peak MB real/syn/peer/fit' % (
            'real ex/s', 'synthetic ex/s', 'custom-loop peer', 'model.fit peer'))
  for towers in args.towers:
    row = table['towers'][str(towers)]
    print('%6d  %6d  %s  %s  %8s  %s  %9s  %s  %8s  %7.1f  %4.0f%%  %s' % (
        towers, row['global_batch'], rate(row['real']), rate(row['synthetic']),
        fmt(row['real_over_synthetic'], '%.2f'), rate(row['peer']),
        fmt(row['ours_over_peer'], '%.2f'), rate(row['fit']),
        fmt(row['ours_over_fit'], '%.2f'), row['achieved_gflops'],
        100 * row['fraction_of_matmul'],
        '/'.join('%.0f' % row[k]['peak_mb'] if row[k] else '-'
                 for k in ('real', 'synthetic', 'peer', 'fit'))))
  print('MNIST, the book\'s network (397,510 parameters), %d towers x %d images, synthetic '
        'input: %s examples/sec' % (MNIST_TOWERS, MNIST_BATCH_SIZE,
                                    rate(table['mnist']).strip()))
  fp16 = table['fp16']
  print('--use_fp16, N=%d synthetic: %s examples/sec, %.2fx float32\'s synthetic rate: '
        'this CPU has no float16 arithmetic, so its float16 convolutions and matmuls run '
        'slower kernels than float32\'s, plus the casts; the gain is on GPUs with tensor '
        'cores' % (fp16['towers'], rate(fp16).strip(), fp16['over_float32']))
