"""The main table: the trainer against both Keras peers at each N, and the machine's rates.

Each repeat runs, in this order: the matmul under each oneDNN setting, conv2's
kernels alone (float32 at ours' setting, bfloat16 where the CPU has the units), the
input pipeline alone, then at each N ours on synthetic input, the custom-loop peer and
the model.fit peer, each with oneDNN off and then on, the same three in bfloat16
with oneDNN on (ours --use_bf16, the peers under Keras' mixed_bfloat16; on CPUs with
bfloat16 units only), ours on real input (at its default) and, at N=1, ours on real
input with --seed, so that a change in the machine's load shows in all of them
alike; then the distribution rows (dist_rows.py). The targets (targets.py) come last:
ours at its default oneDNN against the peers at TensorFlow's (runner.OURS_ONEDNN,
runner.TENSORFLOWS_ONEDNN); the table shows both peers under both settings, so the
comparison at the same setting is there too; and ours in bfloat16 against float32.
"""
import os
import statistics
import tempfile

from benchmarks import dist_rows, targets
from benchmarks.runner import (BF16_UNITS, ONEDNN_SETTINGS, OURS_ONEDNN, TENSORFLOWS_ONEDNN,
                               Runner, flatten, fmt, onednn_name, ours_config, rate, rate_stats,
                               ratio, repeat_tag)

MATMUL_RUNS = 10                  # timed matmuls; the median rate is reported
CONV2_RUNS = 10                   # timed runs of conv2's three kernels; the median rate
# conv2's kernel rate, the yardstick of "of conv2": float32 at ours' oneDNN setting, and
# bfloat16 (oneDNN on) where the CPU has the units, for the bfloat16 rows.
CONV2_DTYPES = [('float32', OURS_ONEDNN)] + [('bfloat16', True)] * BF16_UNITS
PEERS = [('peer', 'custom-loop peer'), ('fit', 'model.fit peer')]  # worker kind, label
BF16_POLICY = 'mixed_bfloat16'    # the peers' Keras policy in the bfloat16 rows
MNIST_TOWERS = 2                  # the MNIST row: the book's 2 towers ...
MNIST_BATCH_SIZE = 100            # ... of 100 images
# The --use_fp16 row: at the table's first N only, synthetic input. On a CPU without
# float16 arithmetic it is slower than float32, not faster (docs/performance.md).
SEED = 1                          # the seeded row: ours at N=1, real input, --seed=SEED
INIT_SEED = 0                     # what ours' and the peers' initialisers draw on synthetic input


def run_table(args, data_dir):
  """Runs every configuration, prints the table, the distribution rows and the targets.

  Returns:
    dict for the JSON: flops_per_example, matmul, pipeline, towers (a row per N),
    dist (None with --skip_dist), targets, runs (every worker's raw result).
  """
  settings = len(ONEDNN_SETTINGS)
  per_repeat = (settings + 3 + 1 + BF16_UNITS + len(args.towers) * (
      1 + settings * (1 if args.skip_peer else 1 + len(PEERS)) +
      BF16_UNITS * (1 if args.skip_peer else 1 + len(PEERS))) + (1 in args.towers) +
                (0 if args.skip_dist else len(dist_rows.runs_for(args))))
  runner = Runner(1 + args.repeats * per_repeat)
  runs = {}
  try:
    # In the parent of the table's first setting: shapes need no kernels, and a parent
    # of its own would import TensorFlow once more.
    counted = runner.run('FLOPs from the layer shapes',
                         dict(kind='flops', onednn=ONEDNN_SETTINGS[0]))
    with tempfile.TemporaryDirectory(prefix='cifar10_benchmark_start_') as start_dir:
      for repeat in range(args.repeats):
        run_repeat(args, data_dir, start_dir, runner, runs, repeat)
        if not args.skip_dist:
          dist_rows.run_repeat(args, runner, runs, repeat)
  finally:
    runner.close()
  flops = dict(counted['per_example'], layers=counted['layers'])
  table = summarise(args, runs, flops)
  print_table(args, table)
  print_precisions(args, table)
  print_of_conv2(args, table)
  dist = None if args.skip_dist else dist_rows.summarise(args, runs)
  table.update(dist=dist, targets=targets.check(table['towers'], dist, args.quick),
               runs=flatten(runs))
  return table


def run_repeat(args, data_dir, start_dir, runner, runs, repeat):
  """One pass over the table's configurations, appending each result to runs[key].

  At each N the synthetic runs, ours and the peers', start from the weights of the
  first one (seeded), saved in start_dir: their first losses differ only by what
  computes them, so equal ones say the peers are the same model.
  """
  def run(key, label, config):
    runs.setdefault(key, []).append(runner.run(label + repeat_tag(repeat, args.repeats),
                                               config))

  common = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                intra=args.intra_op_threads, inter=args.inter_op_threads)
  for on in ONEDNN_SETTINGS:
    run(('matmul', on), 'matmul %dx%d oneDNN %s' % (args.matmul_size, args.matmul_size,
                                                    onednn_name(on)),
        dict(kind='matmul', size=args.matmul_size, runs=MATMUL_RUNS, onednn=on))
  for dtype, on in CONV2_DTYPES:
    run(('conv2', dtype), 'conv2 forward and gradients %s oneDNN %s' % (dtype, onednn_name(on)),
        dict(kind='conv2', batch_size=args.batch_size, dtype=dtype, runs=CONV2_RUNS, onednn=on))
  run('pipeline', 'input pipeline alone', dict(kind='pipeline', data_dir=data_dir,
                                               onednn=OURS_ONEDNN, **common))
  for towers in args.towers:
    start = os.path.join(start_dir, 'N%d.npz' % towers)
    for on in ONEDNN_SETTINGS:
      where = 'save_start' if on == ONEDNN_SETTINGS[0] else 'start_from'
      run(('synthetic', towers, on), 'ours N=%d synthetic oneDNN %s' % (towers,
                                                                        onednn_name(on)),
          ours_config(args, towers, 'synthetic', onednn=on, init_seed=INIT_SEED,
                      **{where: start}))
    for kind, name in [] if args.skip_peer else PEERS:
      for on in ONEDNN_SETTINGS:
        run((kind, towers, on), '%s N=%d synthetic oneDNN %s' % (name, towers,
                                                                 onednn_name(on)),
            dict(kind=kind, towers=towers, onednn=on, init_seed=INIT_SEED, start_from=start,
                 **common))
    if BF16_UNITS:  # from the same weights: the first losses agree to bfloat16's rounding
      run(('bf16', towers), 'ours N=%d synthetic --use_bf16 oneDNN on' % towers,
          ours_config(args, towers, 'synthetic', use_bf16=True, onednn=True,
                      init_seed=INIT_SEED, start_from=start))
      for kind, name in [] if args.skip_peer else PEERS:
        run((kind + '_bf16', towers), '%s N=%d synthetic %s oneDNN on' % (
            name, towers, BF16_POLICY), dict(kind=kind, towers=towers, onednn=True,
                                            policy=BF16_POLICY, init_seed=INIT_SEED,
                                            start_from=start, **common))
    run(('real', towers), 'ours N=%d real' % towers,
        ours_config(args, towers, 'real', data_dir))
    if towers == 1:
      run('seeded', 'ours N=1 real --seed=%d' % SEED,
          ours_config(args, 1, 'real', data_dir, seed=SEED))
  run('mnist', 'ours MNIST N=%d synthetic' % MNIST_TOWERS,
      ours_config(args, MNIST_TOWERS, 'synthetic', dataset='mnist',
                  batch_size=MNIST_BATCH_SIZE))
  run('fp16', 'ours N=%d synthetic --use_fp16' % args.towers[0],
      ours_config(args, args.towers[0], 'synthetic', use_fp16=True))


def at(stats, on):
  """stats under oneDNN setting `on`; None (TensorFlow's default, not x86) takes off's."""
  return stats[bool(on)]


def summarise(args, runs, flops):
  """The table's numbers: medians over repeats, ratios, FLOP rates.

  Per N: synthetic, peer and fit at each oneDNN setting ({False: stats, True:
  stats}); the ratios the targets read compare ours at its default with the peers
  at TensorFlow's; *_same_setting compares them with both at ours.
  """
  matmul = {on: statistics.median(r['gflops'] for r in runs[('matmul', on)])
            for on in ONEDNN_SETTINGS}
  conv2 = {dtype: statistics.median(r['gflops'] for r in runs[('conv2', dtype)])
           for dtype, _ in CONV2_DTYPES}
  pipeline = rate_stats(runs['pipeline'])
  rows = {}
  for towers in args.towers:
    by_setting = {kind: {on: rate_stats(runs[(kind, towers, on)])
                         for on in ONEDNN_SETTINGS} if (kind, towers, False) in runs else None
                  for kind in ('synthetic', 'peer', 'fit')}
    ours = at(by_setting['synthetic'], OURS_ONEDNN)
    peer, fit = [at(by_setting[kind], TENSORFLOWS_ONEDNN) if by_setting[kind] else None
                 for kind in ('peer', 'fit')]
    real = rate_stats(runs[('real', towers)])
    achieved = ours['examples_per_sec'] * flops['total'] / 1e9
    rows[str(towers)] = dict(
        by_setting, real=real, synthetic_default=ours, peer_default=peer, fit_default=fit,
        global_batch=towers * args.batch_size,
        real_over_synthetic=ratio(real, ours),
        ours_over_peer=ratio(ours, peer), ours_over_fit=ratio(ours, fit),
        ours_over_peer_same_setting=ratio(ours, by_setting['peer'] and
                                          at(by_setting['peer'], OURS_ONEDNN)),
        ours_over_fit_same_setting=ratio(ours, by_setting['fit'] and
                                         at(by_setting['fit'], OURS_ONEDNN)),
        onednn_on_over_off={kind: ratio(stats[True], stats[False])
                            for kind, stats in by_setting.items() if stats},
        achieved_gflops=achieved,
        fraction_of_matmul=achieved / matmul[bool(OURS_ONEDNN)],
        of_conv2=of_conv2(dict(synthetic=ours, peer=peer, fit=fit), flops['total'],
                          conv2['float32']),
        real_achieved_gflops=real['examples_per_sec'] * flops['total'] / 1e9,
        pipeline_over_synthetic=ratio(pipeline, ours),
        bf16=bf16_row(runs, towers, by_setting, flops['total'], conv2.get('bfloat16')))
    if towers == 1:
      rows['1']['seeded'] = rate_stats(runs['seeded'])
      rows['1']['seeded_over_unseeded'] = ratio(rows['1']['seeded'], real)
  return dict(flops_per_example=flops,
              onednn=dict(ours=OURS_ONEDNN, tensorflows=TENSORFLOWS_ONEDNN),
              matmul=dict(size=args.matmul_size, gflops=matmul[bool(OURS_ONEDNN)],
                          by_setting=matmul,
                          per_repeat={on: [r['gflops'] for r in runs[('matmul', on)]]
                                      for on in ONEDNN_SETTINGS}),
              conv2=dict(gflops=conv2, per_repeat={
                  dtype: [r['gflops'] for r in runs[('conv2', dtype)]] for dtype in conv2}),
              pipeline=pipeline, towers=rows, mnist=rate_stats(runs['mnist']),
              fp16=dict(rate_stats(runs['fp16']), towers=args.towers[0],
                        over_float32=ratio(rate_stats(runs['fp16']),
                                           rows[str(args.towers[0])]['synthetic_default'])))


def of_conv2(stats_by_kind, flops_per_example, conv2_gflops):
  """{kind: its GFLOP/s over conv2's kernel rate} (None for a kind not run): 1.0 would be
  a step whose every FLOP ran as fast as conv2's convolutions alone."""
  return {kind: stats and stats['examples_per_sec'] * flops_per_example / 1e9 / conv2_gflops
          for kind, stats in stats_by_kind.items()}


def bf16_row(runs, towers, float32, flops_per_example, conv2_gflops):
  """The bfloat16 row at N, oneDNN on; None where it was not run (no bfloat16 units).

  Args:
    float32: {kind: {oneDNN setting: stats}} of the float32 runs at N.
    flops_per_example, conv2_gflops: for of_conv2, at conv2's bfloat16 rate.

  Returns:
    dict: synthetic (ours --use_bf16), peer, fit (under mixed_bfloat16; None with
    --skip_peer): stats; ours_over_peer, ours_over_fit: bfloat16 over bfloat16;
    over_float32: {kind: its bfloat16 rate over its own float32 rate at oneDNN on};
    of_conv2: {kind: share of conv2's bfloat16 kernel rate}.
  """
  if ('bf16', towers) not in runs:
    return None
  stats = dict(synthetic=rate_stats(runs[('bf16', towers)]),
               **{kind: rate_stats(runs[(kind + '_bf16', towers)])
                  if (kind + '_bf16', towers) in runs else None for kind in ('peer', 'fit')})
  return dict(stats, ours_over_peer=ratio(stats['synthetic'], stats['peer']),
              ours_over_fit=ratio(stats['synthetic'], stats['fit']),
              over_float32={kind: ratio(stats[kind], float32[kind] and float32[kind][True])
                            for kind in stats},
              of_conv2=of_conv2(stats, flops_per_example, conv2_gflops))


def print_table(args, table):
  """The lines above the table (FLOPs, matmul, pipeline, how rates are taken), then it."""
  flops, layers = table['flops_per_example'], table['flops_per_example']['layers']
  matmul = table['matmul']['by_setting']
  print()
  print('FLOPs per example: %.1f M = forward %.2f M + weight gradients %.2f M + input '
        'gradients %.2f M (%s)' % (
            flops['total'] / 1e6, flops['forward'] / 1e6, flops['backward_weights'] / 1e6,
            flops['backward_inputs'] / 1e6,
            ', '.join('%s %.2f' % (l['name'], 2 * l['macs'] / 1e6) for l in layers)))
  print('float32 matmul %dx%d: %.1f GFLOP/s with oneDNN off, %.1f on (median of %d, all '
        'cores); input pipeline alone: %s images/sec' % (
            args.matmul_size, args.matmul_size, matmul[False], matmul[True], MATMUL_RUNS,
            rate(table['pipeline'], 1).strip()))
  print('examples/sec: median of %d timed steps after %d warm-up [slowest-fastest step]%s; '
        'batch %d per tower; threads intra %d inter %d' % (
            args.steps, args.warmup, ', median of %d repeats' % args.repeats
            if args.repeats > 1 else '', args.batch_size, args.intra_op_threads,
            args.inter_op_threads))
  print('oneDNN: ours by default %s (machine.py), TensorFlow by default %s. ours/peer, '
        'ours/fit: ours at its default over the peer at the row\'s setting' % (
            onednn_name(OURS_ONEDNN), onednn_name(TENSORFLOWS_ONEDNN)))
  print()
  print('towers  oneDNN  %-20s  %-20s  ours/peer  %-20s  ours/fit  GFLOP/s  of mm  '
        'peak MB syn/peer/fit' % ('ours synthetic ex/s', 'custom-loop peer',
                                  'model.fit peer'))
  for towers in args.towers:
    row = table['towers'][str(towers)]
    ours = row['synthetic_default']
    for on in ONEDNN_SETTINGS:
      stats = {kind: row[kind][on] if row[kind] else None for kind in ('synthetic', 'peer',
                                                                       'fit')}
      gflops = stats['synthetic']['examples_per_sec'] * flops['total'] / 1e9
      marks = (('o' if on == bool(OURS_ONEDNN) else '') +
               ('t' if on == bool(TENSORFLOWS_ONEDNN) else ''))
      print('%6d  %-3s %-2s  %s  %s  %9s  %s  %8s  %7.1f  %4.0f%%  %s' % (
          towers, onednn_name(on), marks,
          rate(stats['synthetic']), rate(stats['peer']),
          fmt(ratio(ours, stats['peer']), '%.2f'), rate(stats['fit']),
          fmt(ratio(ours, stats['fit']), '%.2f'), gflops, 100 * gflops / matmul[on],
          '/'.join('%.0f' % stats[k]['peak_mb'] if stats[k] else '-'
                   for k in ('synthetic', 'peer', 'fit'))))
  print('(o: ours\' default oneDNN setting; t: TensorFlow\'s, the peers\' default)')
  print()
  print('towers  %-20s  real/syn  oneDNN on/off: ours / peer / fit' % 'ours real ex/s')
  for towers in args.towers:
    row = table['towers'][str(towers)]
    gains = row['onednn_on_over_off']
    print('%6d  %s  %8s  %s' % (towers, rate(row['real']), fmt(row['real_over_synthetic'],
                                                                '%.2f'),
                                ' / '.join(fmt(gains.get(k), '%.2f')
                                           for k in ('synthetic', 'peer', 'fit'))))
  if 'seeded' in table['towers'].get('1', {}):
    row = table['towers']['1']
    print('N=1 real input with --seed=%d: %s examples/sec, %.2fx unseeded' % (
        SEED, rate(row['seeded']).strip(), row['seeded_over_unseeded']))
  print('MNIST, the book\'s network (397,510 parameters), %d towers x %d images, synthetic '
        'input: %s examples/sec' % (MNIST_TOWERS, MNIST_BATCH_SIZE,
                                    rate(table['mnist']).strip()))


def print_precisions(args, table):
  """The --use_fp16 line, then the bfloat16 rows and which comparison each ratio is."""
  fp16 = table['fp16']
  print('--use_fp16, N=%d synthetic: %s examples/sec, %.2fx float32\'s synthetic rate: '
        'this CPU has no float16 arithmetic, so its float16 convolutions and matmuls run '
        'slower kernels than float32\'s, plus the casts; the gain is on GPUs with tensor '
        'cores' % (fp16['towers'], rate(fp16).strip(), fp16['over_float32']))
  rows = [(towers, table['towers'][str(towers)]['bf16']) for towers in args.towers]
  if not any(row for _, row in rows):
    print('bfloat16: not run; this CPU has no bfloat16 units (no avx512_bf16 or amx_bf16)')
    return
  print()
  print('bfloat16, oneDNN on: ours --use_bf16; the peers under Keras\' %s policy (float32 '
        'variables, LRN and logits). ours/peer, ours/fit: bfloat16 over bfloat16; '
        'bf16/f32: each over its own float32 rate above at oneDNN on' % BF16_POLICY)
  print('towers  %-20s  %-20s  ours/peer  %-20s  ours/fit  bf16/f32 ours / peer / fit' % (
      'ours bf16 ex/s', 'custom-loop peer', 'model.fit peer'))
  for towers, row in rows:
    print('%6d  %s  %s  %9s  %s  %8s  %s' % (
        towers, rate(row['synthetic']), rate(row['peer']), fmt(row['ours_over_peer'], '%.2f'),
        rate(row['fit']), fmt(row['ours_over_fit'], '%.2f'),
        ' / '.join(fmt(row['over_float32'][kind], '%.2f') for kind in ('synthetic', 'peer',
                                                                        'fit'))))


def print_of_conv2(args, table):
  """Each trainer's GFLOP/s as a share of conv2's kernel rate, float32 and bfloat16."""
  conv2 = table['conv2']['gflops']
  print()
  print('Of conv2: conv2\'s forward and both gradient convolutions alone, batch %d: %s. '
        'Each trainer\'s GFLOP/s (%.1f MFLOP an example) over that rate, in its precision:'
        % (args.batch_size, ', '.join('%.1f GFLOP/s %s' % (gflops, dtype)
                                      for dtype, gflops in conv2.items()),
           table['flops_per_example']['total'] / 1e6))
  kinds = ('synthetic', 'peer', 'fit')
  print('towers  float32: ours / custom-loop peer / model.fit peer%s' % (
      '   bfloat16: ours / custom-loop peer / model.fit peer' if 'bfloat16' in conv2 else ''))
  for towers in args.towers:
    row = table['towers'][str(towers)]
    shares = [' / '.join(fmt(row['of_conv2'][kind] and 100 * row['of_conv2'][kind], '%.0f%%')
                         for kind in kinds)]
    if row['bf16']:
      shares.append(' / '.join(fmt(row['bf16']['of_conv2'][kind] and
                                   100 * row['bf16']['of_conv2'][kind], '%.0f%%')
                               for kind in kinds))
    print(('%6d  %-48s  %s' % (towers, shares[0], shares[1] if len(shares) > 1 else '')).rstrip())
