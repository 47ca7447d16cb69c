"""The trainer's speed targets on this machine, each printed against what was measured.

docs/performance.md says, for each one that falls short, by how much
and why.
"""
# ---- Targets: edit, save, rerun -------------------------------------------------
# Ours at its default oneDNN setting (training/machine.py); the peers at TensorFlow's.
OURS_OVER_PEER = 1.4        # ours / the custom-loop Keras peer, synthetic input, every N
OURS_OVER_FIT = 1.6         # ours / the model.fit peer, synthetic input, every N
OF_MATMUL = 0.70            # ours' GFLOP/s at N = 1 / the float32 matmul rate, same oneDNN
OF_CONV2 = 0.85             # ours' GFLOP/s / conv2's float32 kernel rate, same run, every N
REAL_OVER_SYNTHETIC = 0.95  # real input / synthetic input, every N
SEEDED_OVER_UNSEEDED = 0.95  # real input with --seed / without, N = 1
DIST_OVER_LOCAL = 0.9       # dist_train.py, 1 ps + 1 worker / multi_gpu_train.py, async and sync
BF16_OVER_FLOAT32 = 1.3     # ours --use_bf16 / ours float32, both oneDNN on, synthetic, every N
BF16_OVER_FIT = 1.2         # ours --use_bf16 / the model.fit peer under mixed_bfloat16, every N


def check(rows, dist, quick=False):
  """Prints one line per target; returns them, measured values and verdicts, for the JSON.

  Args:
    rows: the table's rows, {'1': row dict, ...}, keyed by towers.
    dist: dist_rows.summarise's rows, or None when they were not run.
    quick: --quick's few steps time start-up, not speed: what was measured is printed,
      and no verdict (None in the JSON).
  """
  def per_n(key):
    return {'N=%s' % n: row[key] for n, row in rows.items()}

  def per_n_bf16(key):  # rows with a bfloat16 row (a CPU with bfloat16 units)
    return {'N=%s' % n: row['bf16'][key] for n, row in rows.items() if row.get('bf16')}

  one_worker = {'sync' if row['sync'] else 'async': row['vs_multi_gpu_train']
                for row in (dist or {}).values() if row['workers'] == 1}
  targets = [
      ('ours / custom-loop peer, every N', OURS_OVER_PEER, '%.2f', per_n('ours_over_peer')),
      ('ours / model.fit peer, every N', OURS_OVER_FIT, '%.2f', per_n('ours_over_fit')),
      ('ours of matmul rate at N=1', OF_MATMUL, '%.0f%%',
       {'N=1': rows['1']['fraction_of_matmul']} if '1' in rows else {}),
      ('ours of conv2 kernel rate, float32, every N', OF_CONV2, '%.0f%%',
       {'N=%s' % n: row['of_conv2']['synthetic'] for n, row in rows.items()}),
      ('real / synthetic input, every N', REAL_OVER_SYNTHETIC, '%.2f',
       per_n('real_over_synthetic')),
      ('seeded / unseeded real input at N=1', SEEDED_OVER_UNSEEDED, '%.2f',
       {'N=1': rows['1'].get('seeded_over_unseeded')} if '1' in rows else {}),
      ('dist_train.py 1 worker / multi_gpu_train.py', DIST_OVER_LOCAL, '%.2f', one_worker),
      ('ours bfloat16 / ours float32, every N', BF16_OVER_FLOAT32, '%.2f',
       {n: over['synthetic'] for n, over in per_n_bf16('over_float32').items()}),
      ('ours bfloat16 / model.fit peer bfloat16, every N', BF16_OVER_FIT, '%.2f',
       per_n_bf16('ours_over_fit')),
  ]
  print()
  print('Targets, as this --quick run measured them: no verdict, its few steps time '
        'start-up; run without --quick to judge them:' if quick else
        'Targets, each against what this run measured:')
  results = []
  for name, goal, pattern, measured in targets:
    measured = {where: value for where, value in measured.items() if value is not None}
    show = lambda value: pattern % (100 * value if '%%' in pattern else value)
    verdict = None if quick else 'not measured'
    if measured and not quick:
      worst = min(measured, key=measured.get)
      short = 1 - measured[worst] / goal
      verdict = 'met' if short <= 0 else 'SHORT by %.1f%% (%s: %s)' % (
          100 * short, worst, show(measured[worst]))
    print(('  %-48s >= %-5s  %-34s  %s' % (name, show(goal), ', '.join(
        '%s %s' % (where, show(value)) for where, value in measured.items()),
        verdict or '')).rstrip())
    results.append(dict(name=name, goal=goal, measured=measured, verdict=verdict))
  return results
