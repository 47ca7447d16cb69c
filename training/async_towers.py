"""--async_towers: each tower applies its own gradients as soon as they are ready.

multi_gpu_train.py's other mode, beside its synchronous average. Its graph and its
loop take the trainer's own pieces as arguments (this package imports no program):

    graph = build(build_towers, next_batch, devices, batch_size, examples_per_epoch, model)
    loop(sess, run, graph, settings, stop, save, finish)  # towers 1.. in threads

There is one train op per tower and `global_step` counts every applied update, so
--max_steps counts per-tower updates; the towers together stop exactly there.
"""
import collections
import threading
import time

import tensorflow as tf

from training import checkpoints, mixed_precision, steps
from training.summaries import build_summaries, open_writer
from training.updates import learning_rate, moving_averages, then_average

AsyncTrainGraph = collections.namedtuple('AsyncTrainGraph', [
    'train_ops',            # one per tower: its own update, then the moving averages
    'loss',                 # float32 scalar: tower 0's, which its own train op computes
    'step_after',           # int64 scalar: the global step read after tower 0's update
    'global_step', 'decay_steps', 'examples_per_update', 'summary_op',  # as TrainGraph's
])


def build(build_towers, next_batch, devices, batch_size, examples_per_epoch, model,
          summaries=True, use_fp16=False, use_bf16=False):
  """The async graph: each tower's own update, on the CPU where the variables live.

  Args:
    build_towers: multi_gpu_train.build_towers, the tower loop.
    Others as multi_gpu_train.build()'s.

  Returns:
    an AsyncTrainGraph; its summaries watch tower 0 alone, the one whose train op
    computes them.
  """
  if use_fp16:  # settings.check_trainer_flags says why
    raise ValueError('use_fp16 needs synchronous towers; async_towers cannot take it')
  with tf.device('/cpu:0'):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, decay_steps = learning_rate(global_step, batch_size, examples_per_epoch, model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
  towers = build_towers(next_batch, devices, opt, model,
                        dtype=mixed_precision.compute_dtype(False, use_bf16))
  with tf.device('/cpu:0'):
    ema = moving_averages(global_step, model)
    train_ops = [then_average(opt.apply_gradients(grads, global_step=global_step), ema)
                 for grads in towers.grads]
    with tf.control_dependencies([train_ops[0]]):  # the other towers' updates so far too
      step_after = tf.identity(global_step.read_value())
  summary_op = (build_summaries([0], towers.losses, towers.grads[0], lr, model)
                if summaries else None)
  return AsyncTrainGraph(train_ops, towers.losses[0], step_after, global_step, decay_steps,
                         batch_size, summary_op)


def loop(sess, run, graph, settings, stop, save, finish):
  """Towers 1.. run in threads; the loop below runs tower 0 and logs.

  Every applied update takes one from a shared budget, so the towers together
  stop exactly at max_steps.

  Args:
    sess, run, graph, settings, stop: as multi_gpu_train.loop's (graph an AsyncTrainGraph).
    save: save(sess, run, step, last_saved), the trainer's checkpoint; returns the step saved.
    finish: finish(sess, run, graph, writer, last_saved, last_summary, stop), the
      trainer's last summary and save; returns the global step.
  """
  writer = open_writer(sess, run.start, settings.summary_steps, run.record)
  take_update = _update_budget(settings.max_steps - run.start.start_step)
  halt, failures, threads = threading.Event(), [], []
  updates_by_tower = [0] * len(graph.train_ops)
  for i, op in enumerate(graph.train_ops[1:], 1):
    threads.append(threading.Thread(target=_run_tower, daemon=True, args=(
        sess, op, take_update, halt, failures, updates_by_tower, i)))
    threads[-1].start()
  step = last_summary = run.start.start_step
  last_saved = step if run.start.checkpoint else None
  unlogged = None  # tower 0's latest line when the frequency skipped it: shown at the end
  try:
    while not stop.requested and take_update():
      summarize = writer and step % settings.summary_steps == 0
      fetches = [graph.train_ops[0], graph.loss, graph.step_after] + (
          [graph.summary_op] if summarize else [])
      start_time = time.time()
      results = sess.run(fetches)
      duration = time.time() - start_time
      updates_by_tower[0] += 1
      previous, step = step, results[2]

      steps.check_loss(results[1], step, run.model_name,
                       lambda: checkpoints.untouched_note(last_saved))
      if failures:
        raise failures[0]
      examples_per_sec = (step - previous) * graph.examples_per_update / duration
      unlogged = (step, results[1], examples_per_sec, duration / (step - previous))
      if (steps.crossed(previous, step, settings.log_frequency) or
          previous == run.start.start_step):
        steps.print_loss_line(*unlogged)
        unlogged = None
      if summarize:
        writer.write_summary(results[3], previous)
        last_summary = previous
      elif writer:
        writer.note_speed(examples_per_sec)
      if steps.crossed(previous, step, settings.save_every_n_steps):
        last_saved = save(sess, run, step, last_saved)
  finally:
    halt.set()
    for thread in threads:
      thread.join()
  if unlogged:  # the other towers may have landed the last updates: tower 0's last step
    steps.print_loss_line(*unlogged)
  step = finish(sess, run, graph, writer, last_saved, last_summary, stop)
  print('updates applied per tower: %s; global step %d' % (', '.join(
      'tower_%d %d' % (i, n) for i, n in enumerate(updates_by_tower)), step))


def _update_budget(updates):
  """A thread-safe countdown: the returned function is True `updates` times."""
  lock, left = threading.Lock(), [updates]
  def take():  # noqa: E306
    with lock:
      left[0] -= 1
      return left[0] >= 0
  return take


def _run_tower(sess, train_op, take_update, stop, failures, counts, i):
  """Tower i applies its own updates while the budget lasts."""
  try:
    while not stop.is_set() and take_update():
      sess.run(train_op)
      counts[i] += 1
  except Exception as e:  # surfaced by the main loop
    failures.append(e)
