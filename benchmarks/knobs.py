"""--knobs: session and input knobs at KNOB_TOWERS towers, each against the first row."""
import os

from runner import (OURS_ONEDNN, Runner, flatten, onednn_name, ours_config, rate,
                    rate_stats, ratio, repeat_tag)

KNOB_TOWERS = 2                   # towers of every knob run
SEEDED_OVER_UNSEEDED = 0.95       # target: the --seed pipeline against the unseeded one


def knobs_to_run():
  """[(name, worker config overrides, extra environment or None)], the first the baseline.

  threads      intra_op / inter_op pool sizes of session_config (0: one per core)
  XLA          auto-clustering: global_jit_level ON_1, plus TF_XLA_FLAGS=
               --tf_xla_cpu_global_jit, without which CPU ops are never clustered;
               xla_ops_run counts compiled clusters that ran in one traced step
  prefetch     real input with dataset.prefetch(towers) on top of the pipeline's
               own AUTOTUNE prefetch: a whole step's batches ready ahead
  --seed       real input through the trainer's seeded pipeline (records picked
               by index_shuffle from (seed, step), one global batch a step),
               against the unseeded one
  oneDNN       every row runs at the trainer's default (training/onednn.py; on x86 CPUs with
               AVX2, on); this one at the other setting
  """
  xla_flags = (os.environ.get('TF_XLA_FLAGS', '') + ' --tf_xla_cpu_global_jit').strip()
  return [('threads 0/0 (one per core)', dict(intra=0, inter=0), None),
          ('threads 1/2', dict(intra=1, inter=2), None),
          ('threads 2/2', dict(intra=2, inter=2), None),
          ('XLA auto-clustering ON_1', dict(intra=0, inter=0, xla=True),
           dict(TF_XLA_FLAGS=xla_flags)),
          ('real input', dict(intra=0, inter=0, input='real'), None),
          ('real input + prefetch(%d)' % KNOB_TOWERS,
           dict(intra=0, inter=0, input='real', extra_prefetch=KNOB_TOWERS), None),
          ('real input, --seed=1', dict(intra=0, inter=0, input='real', seed=1), None),
          ('oneDNN %s' % onednn_name(not OURS_ONEDNN), dict(intra=0, inter=0,
                                                             onednn=not OURS_ONEDNN), None)]


def run_knobs(args, data_dir):
  """Runs every knob args.repeats times, interleaved; prints the table; returns it."""
  knobs = knobs_to_run()
  runner = Runner(args.repeats * len(knobs))
  runs = {}
  for repeat in range(args.repeats):
    for name, overrides, env in knobs:
      config = ours_config(args, KNOB_TOWERS, 'synthetic', data_dir, **overrides)
      runs.setdefault(name, []).append(runner.run(
          'ours N=%d %s%s' % (KNOB_TOWERS, name, repeat_tag(repeat, args.repeats)),
          config, env))

  baseline = rate_stats(runs[knobs[0][0]])
  rows = {}
  print()
  print('Knobs at %d towers, batch %d per tower, synthetic input and oneDNN %s unless said; '
        'threads are intra/inter' % (KNOB_TOWERS, args.batch_size, onednn_name(OURS_ONEDNN)))
  print('%-28s  %-20s  vs first  peak MB  note' % ('knob', 'ex/s'))
  for name, _, _ in knobs:
    stats = rate_stats(runs[name])
    note = ''
    if 'xla_ops_run' in runs[name][0]:
      stats['xla_ops_run'] = runs[name][0]['xla_ops_run']
      note = '%d XLA clusters ran' % stats['xla_ops_run']
    rows[name] = dict(stats, vs_first=ratio(stats, baseline))
    print('%-28s  %s  %7.3f  %7.0f  %s' % (name, rate(stats), rows[name]['vs_first'],
                                           stats['peak_mb'], note))
  seeded = ratio(rows['real input, --seed=1'], rows['real input'])
  print('seeded / unseeded real input: %.3f (target >= %.2f)' % (seeded,
                                                                 SEEDED_OVER_UNSEEDED))
  return dict(towers=KNOB_TOWERS, knobs=rows, seeded_over_unseeded=seeded,
              runs=flatten(runs))
