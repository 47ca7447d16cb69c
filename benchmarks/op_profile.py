"""--profile: where one step of ours goes, op type by op type: oneDNN off and on, and
with --use_bf16 (oneDNN on) on a CPU with bfloat16 units; how busy each thread was;
and whether a second core speeds up elementwise ops of the LRN's size."""
import statistics

from benchmarks.runner import (BF16_UNITS, ONEDNN_SETTINGS, OURS_ONEDNN, Runner, onednn_name,
                               ours_config)

TRACED_STEPS = 3                  # traced steps per setting; op times are their mean
CHAIN_RUNS = 30                   # timed runs of each of the elementwise chains
SHOWN_SHARE = 0.005               # op types below this share of op time go into "the rest"


def run_profile(args):
  """Traces ours at the first of --towers, synthetic input, under each oneDNN setting,
  then in bfloat16 where this CPU has the units. Keys: 'off', 'on', 'on, bfloat16'."""
  towers = args.towers[0]
  settings = [(onednn_name(on), dict(onednn=on)) for on in ONEDNN_SETTINGS]
  if BF16_UNITS:
    settings.append(('on, bfloat16', dict(onednn=True, use_bf16=True)))
  runner = Runner(len(settings) + 1)
  results = {}
  try:
    for name, overrides in settings:
      config = ours_config(args, towers, 'synthetic', kind='profile', steps=TRACED_STEPS,
                           **overrides)
      results[name] = runner.run('ours N=%d synthetic traced, oneDNN %s' % (towers, name),
                                 config)
    chains = runner.run('elementwise chains, one and two at once',
                        dict(kind='chains', batch_size=args.batch_size, runs=CHAIN_RUNS,
                             onednn=OURS_ONEDNN))
  finally:
    runner.close()
  print()
  print('One step of ours, N=%d, %d images per tower, synthetic: op time per step (ms) and '
        'share of all op time, mean of %d traced steps after %d warm-up; ops on the two '
        'cores overlap, so they add up to more than the step. oneDNN by default: %s'
        % (towers, args.batch_size, TRACED_STEPS, args.warmup, onednn_name(OURS_ONEDNN)))
  for setting, result in results.items():
    print_ops(setting, result)
  print('\nElementwise ops on [%d, 12, 12, 64] float32 (the LRN\'s size), a chain of %d: '
        '%.2f ms alone, %.2f ms for two independent chains at once (%.2fx: 1 would be the '
        'second core\'s full gain, 2 none)' % (args.batch_size, chains['ops'], chains['one_ms'],
                                               chains['two_ms'],
                                               chains['two_ms'] / chains['one_ms']))
  profiles = {setting: dict(ms_per_step=r['ms_per_step'], durations=r['durations'],
                            threads=r['threads']) for setting, r in results.items()}
  return dict(profiles, chains=dict(one_ms=chains['one_ms'], two_ms=chains['two_ms']))


def print_ops(setting, result):
  ops = result['ms_per_step']
  total = sum(ops.values())
  step_ms = 1000 * statistics.median(result['durations'])
  print('\noneDNN %s: traced step %.1f ms (%.0f examples/sec while traced), op time %.1f ms'
        % (setting, step_ms, 1000 * result['examples_per_step'] / step_ms, total))
  rest = 0.0
  for op, ms in sorted(ops.items(), key=lambda item: -item[1]):
    if ms < SHOWN_SHARE * total:
      rest += ms
      continue
    print('  %-44s %8.2f ms  %5.1f%%' % (op, ms, 100 * ms / total))
  print('  %-44s %8.2f ms  %5.1f%%' % ('the rest', rest, 100 * rest / total))
  print('  threads on a core over %d untraced steps (spinning while waiting counts): %s' % (
      result['busy_steps'], ', '.join('%s %.0f%%' % (name, 100 * share)
                            for name, share in result['threads'] if share >= SHOWN_SHARE)))
