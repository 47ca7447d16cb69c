"""Trains the CIFAR-10 model on several GPUs at once: synchronous data parallelism.

    python multi_gpu_train.py --num_gpus=4
    python multi_gpu_train.py --dataset=mnist --num_gpus=2   # the book's MNIST, TFRecords

Each GPU runs one tower: a full copy of the model on its own batch, all towers
sharing one set of variables on the CPU. Each step the towers' gradients are
averaged on the CPU and applied once, so one step over 4 towers of 128 images is
one SGD step on a batch of 512. With fewer GPUs than --num_gpus the towers run on
virtual CPU devices instead (start-up says so).

Expect, as in the original tutorial: precision @ 1 of about 0.86 on the test set
(cifar10_eval.py) after 100K steps on one GPU at batch 128; loss starts near 4.68.
Speed, and how it compares: docs/performance.md (python -m benchmarks).
Rerunning resumes from the latest checkpoint in --train_dir; --fresh starts over.
--seed=N makes a run repeat exactly. Ctrl-C or SIGTERM saves at the current step.
"""
import sys

from training import prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  prelude.start(sys.argv, hold_signals=True)  # first: Python 3.11+, --onednn, signals
                                              # held for the step loop, TensorFlow imported quietly

import collections
import contextlib
import functools
import time

from absl import app
from absl import flags
import tensorflow as tf

import cifar10
import data_sets
from training import (async_towers, checkpoints, errors, input_data, machine,
                      mixed_precision, placement, run_record, signals, startup, steps)
from training import settings as trainer_settings
from training.summaries import build_summaries, open_writer
from training.updates import learning_rate, moving_averages, then_average

# ---- Training knobs: edit, save, rerun ----------------------------------------
BATCH_SIZE = 128                  # images per tower; one step sees BATCH_SIZE * num_gpus
NUM_GPUS = 1                      # towers; each gets /gpu:i, or /cpu:i without GPUs
MAX_STEPS = 1000000               # global step to stop at (the tutorial's 1M)
LOG_FREQUENCY = 10                # steps between loss lines
SAVE_EVERY_N_STEPS = 1000         # steps between checkpoints; one more after the last step
SUMMARY_STEPS = 100               # steps between TensorBoard summaries; 0 turns them off
KEEP_CHECKPOINTS = 5              # older checkpoints are deleted as new ones land
TRAIN_DIR = '/tmp/cifar10_train'  # checkpoints and event files
DATA_DIR = '/tmp/cifar10_data'    # the archive and cifar-10-batches-bin/
# --dataset=mnist: the book's constants (chapter 12)
MNIST_BATCH_SIZE = 100            # images per tower
MNIST_MAX_STEPS = 1000
MNIST_TRAIN_DIR = '/tmp/mnist_train'
MNIST_DATA_DIR = '/tmp/mnist_data'  # train.tfrecords and test.tfrecords

DATASET_DEFAULTS = {  # what --dataset gives the flags not set on the command line
    'cifar10': dict(batch_size=BATCH_SIZE, max_steps=MAX_STEPS, train_dir=TRAIN_DIR,
                    data_dir=DATA_DIR),
    'mnist': dict(batch_size=MNIST_BATCH_SIZE, max_steps=MNIST_MAX_STEPS,
                  train_dir=MNIST_TRAIN_DIR, data_dir=MNIST_DATA_DIR)}

FLAGS = flags.FLAGS


def define_flags():
  """The trainer's flags (training/settings.py), defaults from the constants above.
  Called when this file runs as a program: importing it defines none."""
  trainer_settings.define_trainer_flags(DATASET_DEFAULTS, NUM_GPUS, LOG_FREQUENCY,
                                        SUMMARY_STEPS, SAVE_EVERY_N_STEPS)
  flags.adopt_module_key_flags(trainer_settings)  # in --helpshort, and the run record


def tower_loss(scope, images, labels, model=cifar10):
  """Builds one tower and returns its total loss.

  Args:
    scope: str, the tower's name scope ('tower_0/'), whose LOSSES terms are summed.
    images: float32 [batch, 24, 24, 3] (cifar10) or [batch, 784] (mnist).
    labels: int32 [batch].
    model: the model package, cifar10 or mnist.

  Returns:
    float32 scalar: this tower's cross-entropy plus its weight-decay terms.
  """
  logits = model.inference(images)
  # model.loss() sums the LOSSES of every tower built so far; keep only ours.
  model.loss(logits, labels)
  losses = tf.compat.v1.get_collection(model.LOSSES, scope)
  return tf.add_n(losses, name='total_loss')


def average_gradients(tower_grads):
  """The synchronisation point: the mean of each variable's gradient over the towers.

  Call it under tf.device('/cpu:0'), where the shared variables live.

  Args:
    tower_grads: list over towers of lists over variables of (gradient, variable):
      [[(g0_v0, v0), (g0_v1, v1), ...], [(g1_v0, v0), (g1_v1, v1), ...], ...]

  Returns:
    list over variables of (mean gradient, variable): [(mean_v0, v0), ...].

  Raises:
    ValueError: a tower has no gradient for a variable.
  """
  average_grads = []
  for grad_and_vars in zip(*tower_grads):
    # grad_and_vars: ((g0_v, v), (g1_v, v), ...), one variable across the towers.
    var = grad_and_vars[0][1]
    grads = []
    for g, _ in grad_and_vars:
      if g is None:
        raise ValueError('no gradient for variable %s: it does not feed the loss. '
                         'Remove it or make it non-trainable.' % var.op.name)
      grads.append(tf.expand_dims(g, 0))
    grad = tf.reduce_mean(tf.concat(grads, axis=0), axis=0)
    average_grads.append((grad, var))
  return average_grads


Towers = collections.namedtuple('Towers', [
    'losses',  # list over towers of float32 scalars: each tower's total loss
    'grads',   # list over towers of [(gradient, variable), ...], average_gradients' input
])


def build_towers(next_batch, devices, optimizer, model=cifar10, variables_device='/cpu:0',
                 loss_scale=None, dtype=tf.float32):
  """One replica of the model per device, all sharing one set of variables.

  Args:
    next_batch: callable returning (images, labels) for one tower; called once per
      tower, on the CPU, so each tower takes its own batch from the one input.
    devices: list of device strings, one tower each ('/gpu:0', '/cpu:1', ...).
    optimizer: its compute_gradients() gives each tower's gradients.
    model: the model package: inference, loss and its constants.
    variables_device: where the shared variables live; '' leaves them to an
      enclosing device function (a parameter-server replica_device_setter).
    loss_scale: float16's mixed_precision.LossScale (gradients of the loss times it), or None.
    dtype: the towers' compute dtype: tf.float32, or tf.float16 or tf.bfloat16 on casts of
      the float32 variables (mixed_precision.cast_getter).

  Returns:
    Towers: each tower's loss (float32, unscaled) and gradients (float32; scaled
    by the loss scale, if any), in device order.
  """
  tower_grads, tower_losses = [], []
  getter = mixed_precision.cast_getter(dtype)  # None for float32
  # A re-entered copy of the current scope, so that reuse ends with the loop (and,
  # in float16 or bfloat16, so that all towers, reusing, read through the one getter).
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=getter):
    for i, device in enumerate(devices):
      with tf.compat.v1.device(placement.place(device, variables_device)), \
          tf.name_scope('%s_%d' % (model.TOWER_NAME, i)) as scope:
        with tf.device('/cpu:0'):
          images, labels = next_batch()
        images = tf.cast(images, dtype)  # float32: images themselves, no op
        loss = tower_loss(scope, images, labels, model)  # float32 either way
        tf.compat.v1.get_variable_scope().reuse_variables()  # towers 1.. share tower 0's
        # fp16: gradients below float16's 6e-8 would be zero, so the loss is scaled up.
        scaled = mixed_precision.scale_loss(loss, loss_scale) if loss_scale else loss
        tower_grads.append(optimizer.compute_gradients(scaled))
        tower_losses.append(loss)
  return Towers(tower_losses, tower_grads)


TrainGraph = collections.namedtuple('TrainGraph', [
    'train_op',             # one step: the averaged update, then the moving averages
    'update_op',            # the averaged update alone (the benchmark times it apart);
                            # None in fp16, where it runs inside the skip
    'loss',                 # float32 scalar: the mean of the towers' total losses
    'global_step',          # int64 variable: updates applied
    'decay_steps',          # int: updates between two drops of the learning rate
    'examples_per_update',  # int: batch_size x towers
    'summary_op',           # the merged summaries, or None
    'loss_scale_update',    # fp16: mixed_precision.LossScaleUpdate (applied, scale,
                            # new_scale, to fetch with train_op); float32: None
])


def build(next_batch, devices, batch_size, examples_per_epoch, model=cifar10,
          summaries=True, use_fp16=False, use_bf16=False):
  """train()'s graph, in the tutorial's order: rate, towers, average, apply, averages.

  Args:
    next_batch, devices, model: as build_towers'.
    batch_size: int, images per tower.
    examples_per_epoch: int, training records in one epoch (for the schedule).
    summaries: bool, build the TensorBoard summary op.
    use_fp16, use_bf16: bool, float16 towers over float32 variables with a dynamic loss
      scale (a step whose gradients overflow is skipped), or bfloat16 towers without one.

  Returns:
    a TrainGraph.
  """
  examples_per_update = batch_size * len(devices)
  with tf.device('/cpu:0'):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, decay_steps = learning_rate(global_step, examples_per_update, examples_per_epoch, model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    loss_scale = (mixed_precision.make_loss_scale(mixed_precision.INITIAL_LOSS_SCALE)
                  if use_fp16 else None)
  towers = build_towers(next_batch, devices, opt, model, loss_scale=loss_scale,
                        dtype=mixed_precision.compute_dtype(use_fp16, use_bf16))
  with tf.device('/cpu:0'):
    grads = average_gradients(towers.grads)
    ema = moving_averages(global_step, model)
    if use_fp16:  # divide by the scale once; apply only finite gradients
      grads, all_finite = mixed_precision.unscale_and_check(grads, loss_scale)
      update_op, loss_scale_update = None, mixed_precision.apply_or_skip(
          lambda: then_average(opt.apply_gradients(grads, global_step=global_step), ema),
          all_finite, loss_scale)
      train_op = loss_scale_update.train_op
    else:
      update_op, loss_scale_update = opt.apply_gradients(grads, global_step=global_step), None
      train_op = then_average(update_op, ema)
    loss = tf.reduce_mean(tf.stack(towers.losses), name='total_loss')
  summary_op = (build_summaries(range(len(devices)), towers.losses, grads, lr, model,
                                loss_scale_update and loss_scale_update.scale)
                if summaries else None)
  return TrainGraph(train_op, update_op, loss, global_step, decay_steps,
                    examples_per_update, summary_op, loss_scale_update)


def train(settings, stop=None, flag_values=None, flags_given=()):
  """Trains until global step settings.max_steps, resuming from the latest checkpoint.

  Args:
    settings: a training.settings.Settings.
    stop: a signals.StopSignals, or None (tests): when it is requested the
      loop ends after the current step, saves, and errors.Stopped is raised.
    flag_values: dict, the command line's flags, for the run record;
    flags_given: the names of those set on the command line.
  """
  data = data_sets.DATASETS[settings.dataset]
  with contextlib.ExitStack() as exit_stack:  # holds the lock on train_dir
    run = startup.start(exit_stack, settings, data.input, stop=stop)
    devices, num_cpu_devices, where = placement.tower_devices(settings.num_gpus)
    describe = functools.partial(  # describe(start_step): the run record
        run_record.describe, {'multi_gpu_train.py': run_record.constants_of(
            sys.modules[__name__])}, flag_values, settings, devices, data=data,
        flags_given=flags_given)
    if run is None:  # nothing to do; what was edited since the last run is still said
      changed = run_record.changes_since(settings.train_dir, describe(settings.max_steps))
      if changed:
        print(changed)
      return
    epoch = input_data.examples_per_epoch(settings, data)
    with tf.Graph().as_default():
      if settings.seed is not None:
        tf.compat.v1.set_random_seed(settings.seed)  # the initial weights
        if any(d.startswith('/gpu') for d in devices):  # CPU kernels repeat as they are
          exit_stack.enter_context(placement.op_determinism())
      next_batch, input_init = input_data.input_pipeline(
          settings.data_dir, settings.num_gpus, settings.batch_size, data.input,
          settings.synthetic, settings.seed, input_data.first_batch(run))
      # --async_towers: each tower applies its own gradients (training/async_towers.py).
      build_graph = (functools.partial(async_towers.build, build_towers)
                     if settings.async_towers else build)
      graph = build_graph(next_batch, devices, settings.batch_size, epoch.count, data.model,
                          summaries=settings.summary_steps > 0, use_fp16=settings.use_fp16,
                          use_bf16=settings.use_bf16)
      record = write_start(graph, run, settings, data, where, epoch, describe)
      config = placement.session_config(num_cpu_devices, settings.session)
      all_finite = checkpoints.all_variables_finite()  # what each save checks first
      with open_session(run, config, input_init) as (sess, saver):
        run_loop = (functools.partial(async_towers.loop, save=save, finish=finish)
                    if settings.async_towers else loop)
        state = Run(run, saver, all_finite, data.model.__name__, record)
        rereads = not settings.synthetic and settings.seed is None  # each epoch, from disk
        with steps.stop_on_changed_data(
            rereads and (lambda: data.input.check_train_files(settings.data_dir)),
            lambda: save_after_error(sess, state, graph)):
          run_loop(sess, state, graph, settings, stop or steps.NEVER)


def write_start(graph, run, settings, data, where, epoch, describe):
  """Once the graph is built and its step known to fit in memory: --fresh's move, the
  run record (describe(start_step)), the start-up lines. Returns the record."""
  startup.check_memory(  # what the loop runs in one step, summaries included
      (list(graph.train_ops) if settings.async_towers else [graph.train_op]) + [graph.loss] +
      ([graph.summary_op] if graph.summary_op is not None else []), settings)
  replaced = checkpoints.set_aside(settings.train_dir) if settings.fresh else None
  record = describe(run.start_step)
  run_record.write_and_compare(settings.train_dir, record, replaced)
  startup.print_versions(where, settings.session)
  print('global batch %d = %d x %d towers%s; %d trainable parameters' % (
      settings.batch_size * settings.num_gpus, settings.batch_size, settings.num_gpus,
      ' (async: each update applies %d)' % settings.batch_size if settings.async_towers
      else '', startup.num_parameters()))
  startup.print_schedule(graph.decay_steps, epoch, graph.examples_per_update, 'update',
                         data.model, settings)
  if settings.use_fp16 or settings.use_bf16:  # the towers' precision
    print(mixed_precision.start_line(settings.use_fp16, settings.num_gpus))
  return record


@contextlib.contextmanager
def open_session(run, config, input_init):
  """A session with the variables restored from run.checkpoint, or initialised,
  and the input pipeline started (input_init).

  Yields:
    (session, Saver that writes checkpoints and deletes none: save_checkpoint rotates).
  """
  saver = checkpoints.make_saver(tf.compat.v1.global_variables())
  init = tf.compat.v1.global_variables_initializer()
  with tf.compat.v1.Session(config=config) as sess:
    # --log_device_placement: TensorFlow's lines come in these first runs and the first
    # step's; then their sum.
    with placement.placement_summed_up(sess, config.log_device_placement) as arm:
      if run.checkpoint:
        try:  # a float32 run's checkpoint into fp16 too: its loss scale starts fresh
          fresh = mixed_precision.restore(sess, run.checkpoint, tf.compat.v1.global_variables())
        except (tf.errors.OpError, ValueError) as e:
          raise errors.TrainingError('cannot restore %s into this model: %s Use another '
                                     '--train_dir, or --fresh to start over.'
                                     % (run.checkpoint, checkpoints.restore_error(e))) from None
        print('Resuming from %s at step %d' % (run.checkpoint, run.start_step))
        if fresh:
          print('%s holds no loss scale (a float32 run\'s): it starts at %g' % (
              run.checkpoint, mixed_precision.INITIAL_LOSS_SCALE))
      else:
        sess.run(init)
        print('Starting from step 0 in %s' % run.train_dir)
      sess.run(input_init)
      arm()  # the first step places the input pipeline's functions
      sys.stdout.flush()
      yield sess, saver


Run = collections.namedtuple('Run', [
    'start',       # the startup.TrainRun: train_dir, checkpoint, start_step
    'saver',       # writes checkpoints (checkpoints.save_if_finite)
    'all_finite',  # bool op: no variable is NaN or infinite, checked before each save
    'model_name',  # 'cifar10' or 'mnist', for the messages that name its constants
    'record',      # the run record, the event file's first entry
])


def loop(sess, run, graph, settings, stop):
  """The step loop: run, check, log, summarise, save; then the last save."""
  start_step = run.start.start_step
  writer = open_writer(sess, run.start, settings.summary_steps, run.record)
  # fp16: [applied, scale, new_scale] of each step; float32: nothing more to fetch.
  scale_fetches = list(graph.loss_scale_update[1:]) if graph.loss_scale_update else []
  step = last_summary = start_step
  last_saved = start_step if run.start.checkpoint else None
  unlogged = None  # the latest step's line when the frequency skipped it: the run's last
  while not stop.requested and step < settings.max_steps:
    # Summaries describe the variables at `step`, before this update.
    summarize = writer and step % settings.summary_steps == 0
    fetches = [graph.train_op, graph.loss, scale_fetches] + (
        [graph.summary_op] if summarize else [])
    start_time = time.time()
    results = sess.run(fetches)
    duration = time.time() - start_time

    loss_value = results[1]  # unscaled: a real divergence
    steps.check_loss(loss_value, step + 1, run.model_name,
                     lambda: checkpoints.untouched_note(last_saved))
    if scale_fetches and not results[2][0]:  # overflowed: nothing applied, step unchanged
      steps.check_skip(step + 1, *results[2][1:])
      continue
    step += 1
    examples_per_sec = graph.examples_per_update / duration
    unlogged = (step, loss_value, examples_per_sec, duration / settings.num_gpus)
    if step % settings.log_frequency == 0 or step == start_step + 1:
      steps.print_loss_line(*unlogged)
      unlogged = None
    if summarize:  # with examples/sec: the median of the speeds noted since the last
      writer.write_summary(results[3], step - 1)
      last_summary = step - 1
    elif writer:  # a step without summaries, as the console's are (most of them)
      writer.note_speed(examples_per_sec)
    if step % settings.save_every_n_steps == 0:
      last_saved = save(sess, run, step, last_saved)
  if unlogged:  # every run shows its last step, at --max_steps or stopped by a signal
    steps.print_loss_line(*unlogged)
  finish(sess, run, graph, writer, last_saved, last_summary, stop)


def save(sess, run, step, last_saved):
  return checkpoints.save_if_finite(sess, run.saver, run.start.train_dir, step,
                                    KEEP_CHECKPOINTS, run.all_finite, run.model_name, last_saved)


def save_after_error(sess, run, graph):
  """After a step that failed, which applied nothing: a checkpoint of the global step,
  unless one is on disk. Returns what it says."""
  step = sess.run(graph.global_step)
  if checkpoints.saved(run.start.train_dir, step):
    return 'The checkpoint of step %d is kept; rerun to resume once the file is whole.' % step
  save(sess, run, step, None)
  return 'Saved step %d; rerun to resume once the file is whole.' % step


def finish(sess, run, graph, writer, last_saved, last_summary, stop):
  """After the loop: a summary and a checkpoint of the step where it stopped, and
  errors.Stopped after a signal. Returns the global step."""
  # The global step, not the loop's count: async towers may have landed a few more.
  step = sess.run(graph.global_step)
  if writer:
    if step != last_summary:  # every run ends with a summary of where it stopped
      writer.write_summary(sess.run(graph.summary_op), step)
    writer.close()
  if step not in (last_saved, run.start.start_step):  # a step taken, and not yet saved
    save(sess, run, step, last_saved)
  steps.stopped(stop, step, run.start.start_step)
  return step


def main(argv):
  with errors.one_line_errors():  # every error a user can cause: one line, its exit code
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
    trainer_settings.apply_dataset_defaults(FLAGS, DATASET_DEFAULTS)  # --train_dir's too
    stop = signals.StopSignals(FLAGS.train_dir)  # next, so that no Ctrl-C or SIGTERM is lost
    sys.stdout.reconfigure(line_buffering=True)  # each line at once, into `| tee` too
    trainer_settings.check_trainer_flags(FLAGS)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # our own lines say it
    key_flags = FLAGS.get_key_flags_for_module(sys.argv[0])
    train(trainer_settings.settings_from_flags(FLAGS), stop=stop,
          flag_values={flag.name: flag.value for flag in key_flags},
          flags_given=[flag.name for flag in key_flags if flag.present])


if __name__ == '__main__':
  define_flags()
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
