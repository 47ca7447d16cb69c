"""--extras: what the trainer does per step beyond the update, at each tower count."""
from runner import Runner, flatten, ours_config, rate, rate_stats, ratio, repeat_tag

SUMMARY_SAMPLES = 10              # steps timed with the summary op fetched


def run_extras(args):
  """Moving averages and summaries, each against the update alone.

  Per N, synthetic input: an 'extras' process timing, step by step in one session
  of a graph with summaries, the update alone (no moving averages), the train op
  (update + moving averages) and the train op with the summary op fetched and
  written; and an 'ours' process with a summaries=False graph, whose train op
  should match the first process's. Summaries cost, per step, (summary step -
  train op step) / SUMMARY_STEPS, as the trainer fetches them that often.
  """
  samples = min(SUMMARY_SAMPLES, args.steps)
  runner = Runner(args.repeats * len(args.towers) * 2)
  runs = {}
  for repeat in range(args.repeats):
    tag = repeat_tag(repeat, args.repeats)
    for towers in args.towers:
      runs.setdefault(('extras', towers), []).append(runner.run(
          'ours N=%d update only / + moving averages / + summaries%s' % (towers, tag),
          dict(ours_config(args, towers, 'synthetic'), kind='extras',
               summary_samples=samples)))
      runs.setdefault(('no_summaries', towers), []).append(runner.run(
          'ours N=%d summaries=False graph%s' % (towers, tag),
          ours_config(args, towers, 'synthetic')))

  # The trainer's constant, read by the workers: the parent does not import TensorFlow.
  summary_steps = runs[('extras', args.towers[0])][0]['summary_steps']
  print()
  print('Per-step extras of the trainer: synthetic input, batch %d per tower, examples/sec '
        '[slowest-fastest step]; summaries once per %d steps' % (args.batch_size,
                                                                 summary_steps))
  print('towers  %-20s  %-20s  %-20s  summary step s  EMA cost  summary cost  both   '
        '%-20s' % ('update only', '+ moving averages', '+ summaries (amort.)',
                   'summaries=False graph'))
  rows = {str(towers): extras_row(runs, towers, summary_steps) for towers in args.towers}
  print('(cost: examples/sec without the extra / with it. Steps of each kind alternate in '
        'one session; the last column is a separate process, for comparison with '
        '"+ moving averages")')
  return dict(summary_steps=summary_steps, summary_samples=samples, towers=rows,
              runs=flatten(runs))


def extras_row(runs, towers, summary_steps):
  """One tower count's costs, printed as a row of the table; returns them."""
  extras = runs[('extras', towers)]
  stats = {kind: rate_stats([dict(r, durations=r['durations'][kind]) for r in extras])
           for kind in ('update_only', 'train_op', 'summary')}
  examples_per_step = extras[0]['examples_per_step']
  plain_sec = examples_per_step / stats['train_op']['examples_per_sec']
  summary_sec = examples_per_step / stats['summary']['examples_per_sec']
  amortized_sec = plain_sec + (summary_sec - plain_sec) / summary_steps
  amortized = dict(examples_per_sec=examples_per_step / amortized_sec,
                   min=float('nan'), max=float('nan'))
  no_summaries = rate_stats(runs[('no_summaries', towers)])
  row = dict(update_only=stats['update_only'], moving_averages=stats['train_op'],
             summary_step=dict(stats['summary'], step_sec=summary_sec),
             trainer_amortized=amortized, summaries_false_graph=no_summaries,
             ema_slowdown=ratio(stats['update_only'], stats['train_op']),
             summary_slowdown=amortized_sec / plain_sec,
             total_slowdown=ratio(stats['update_only'], amortized))
  print('%6d  %s  %s  %7.0f%13s  %14.3f  %7.3fx  %11.3fx  %5.3fx  %s' % (
      towers, rate(stats['update_only']), rate(stats['train_op']),
      amortized['examples_per_sec'], '', summary_sec, row['ema_slowdown'],
      row['summary_slowdown'], row['total_slowdown'], rate(no_summaries)))
  return row
