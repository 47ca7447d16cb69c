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
Speed on a 2-core CPU without GPUs: about 700 examples/sec with 1, 2 or 4 towers
with TensorFlow's default kernels, 1.4-1.6x that with oneDNN, which --onednn=auto
turns on there (README "oneDNN on where it wins"); 1.4-1.6x the Keras
MirroredStrategy peers (benchmarks/benchmark.py; README "Performance").
Rerunning resumes from the latest checkpoint in --train_dir; --fresh starts over.
--seed=N makes a run repeat exactly. Ctrl-C or SIGTERM saves at the current step.
"""
import os
import sys

from training import onednn

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's errors only; no INFO, WARNING
if __name__ == '__main__':  # a program, not a module imported by another (tests)
  onednn.choose(sys.argv)  # before TensorFlow is imported: --onednn, the default, the env

import collections
import contextlib
import datetime
import threading
import time
import typing

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import cifar10
import cifar10_input
from training import memory_check
from training import mixed_precision
import mnist
import mnist_input
from training import placement
from training import training_run

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

# ---- The data sets: a model package and an input module each --------------------
# The model package gives inference(images), loss(logits, labels) and the
# constants build() reads; the input module gives prepare,
# train_dataset, seeded_dataset, synthetic_dataset and eval_dataset. A third
# data set is one more package and one more line here.
DataSet = collections.namedtuple('DataSet', ['model', 'input', 'defaults'])
DATASETS = {
    'cifar10': DataSet(cifar10, cifar10_input, dict(
        batch_size=BATCH_SIZE, max_steps=MAX_STEPS, train_dir=TRAIN_DIR, data_dir=DATA_DIR,
        data_url=cifar10_input.DATA_URL)),
    'mnist': DataSet(mnist, mnist_input, dict(
        batch_size=MNIST_BATCH_SIZE, max_steps=MNIST_MAX_STEPS, train_dir=MNIST_TRAIN_DIR,
        data_dir=MNIST_DATA_DIR, data_url=mnist_input.DATA_URL)),
}

FLAGS = flags.FLAGS
flags.DEFINE_enum('dataset', 'cifar10', list(DATASETS), 'The data set and its model; the '
                  'flags below not given take its defaults.')
flags.DEFINE_integer('num_gpus', NUM_GPUS, 'Number of towers (GPUs) to use.')
flags.DEFINE_integer('batch_size', None, 'Images per tower per step (default: %d for '
                     'cifar10, %d for mnist).' % (BATCH_SIZE, MNIST_BATCH_SIZE))
flags.DEFINE_integer('max_steps', None, 'Global step at which to stop (default: %d for '
                     'cifar10, %d for mnist).' % (MAX_STEPS, MNIST_MAX_STEPS))
flags.DEFINE_string('train_dir', None, 'Checkpoints and summaries go here (default: %s, '
                    '%s).' % (TRAIN_DIR, MNIST_TRAIN_DIR))
flags.DEFINE_string('data_dir', None, 'The data set\'s files (default: %s, %s).'
                    % (DATA_DIR, MNIST_DATA_DIR))
flags.DEFINE_string('data_url', None, 'Where to download the data (default: the '
                    'official copy).')
flags.DEFINE_string('data_md5', None, 'cifar10: md5 of the archive at --data_url, for a '
                    'copy of your own (default: the official archive\'s).')
flags.DEFINE_integer('log_frequency', LOG_FREQUENCY, 'Steps between loss lines.')
flags.DEFINE_integer('summary_steps', SUMMARY_STEPS, 'Steps between summaries; 0: none.')
flags.DEFINE_integer('save_every_n_steps', SAVE_EVERY_N_STEPS, 'Steps between checkpoints.')
flags.DEFINE_boolean('fresh', False, 'Start from step 0: move the checkpoints and event '
                     'files already in --train_dir into a dated subdirectory first.')
flags.DEFINE_boolean('async_towers', False, 'Each tower applies its own gradients as soon '
                     'as they are ready (asynchronous), one thread per tower.')
flags.DEFINE_boolean('use_fp16', False, 'Train the model using fp16: float16 towers over '
                     'float32 variables, with dynamic loss scaling (mixed_precision.py).')
flags.DEFINE_boolean('synthetic', False, 'Feed random in-memory images instead of files, '
                     'to time the compute alone.')
flags.DEFINE_boolean('log_device_placement', False, 'Log the device of every op.')
flags.DEFINE_boolean('allow_growth', False, 'Allocate GPU memory as needed instead of '
                     'taking nearly all of it at start.')
flags.DEFINE_float('gpu_memory_fraction', 0.0, 'Cap on the share of each GPU\'s memory '
                   'this process takes (per_process_gpu_memory_fraction); 0: no cap.')
flags.DEFINE_integer('intra_op_threads', 0, 'Threads inside one op; 0: one per core.')
flags.DEFINE_integer('inter_op_threads', 0, 'Ops run at once; 0: one per core.')
flags.DEFINE_enum('onednn', 'auto', onednn.CHOICES, 'TensorFlow\'s oneDNN kernels. auto: on '
                  'where measured faster for this model (x86 with AVX2), else TensorFlow\'s '
                  'default. TF_ENABLE_ONEDNN_OPTS, if set, wins. Read before TensorFlow loads.')
flags.DEFINE_integer('seed', None, 'Seed every random choice (initial weights, record order, '
                     'distortions) so that the same command repeats exactly, whatever '
                     'the towers, and a resumed run equals an uninterrupted one.')

TrainingError = training_run.TrainingError

# TensorBoard shows its chart groups (a tag's part before the first '/') sorted by
# name: these two come before the layers' conv1/, local3/, ...
LOSS_TAGS = '1_loss/'          # total_loss, cross_entropy, and each tower's
TRAINING_TAGS = '2_training/'  # learning_rate, examples_per_sec, loss_scale (--use_fp16)


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
                 loss_scale=None):
  """One replica of the model per device, all sharing one set of variables.

  Args:
    next_batch: callable returning (images, labels) for one tower; called once per
      tower, on the CPU, so each tower takes its own batch from the one input.
    devices: list of device strings, one tower each ('/gpu:0', '/cpu:1', ...).
    optimizer: its compute_gradients() gives each tower's gradients.
    model: the model package: inference, loss and its constants.
    variables_device: where the shared variables live; '' leaves them to an
      enclosing device function (a parameter-server replica_device_setter).
    loss_scale: a mixed_precision.LossScale for float16 towers (--use_fp16), or
      None: float32. The towers then compute in float16 on float16 casts of the
      float32 variables, and take their gradients of the loss times the scale.

  Returns:
    Towers: each tower's loss (float32, unscaled) and gradients (float32; scaled
    by the loss scale, if any), in device order.
  """
  tower_grads, tower_losses = [], []
  getter = mixed_precision.float16_getter if loss_scale else None
  # A re-entered copy of the current scope, so that reuse ends with the loop (and,
  # in float16, so that all towers, reusing, read through the one getter).
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=getter):
    for i, device in enumerate(devices):
      with tf.compat.v1.device(placement.place(device, variables_device)), \
          tf.name_scope('%s_%d' % (model.TOWER_NAME, i)) as scope:
        with tf.device('/cpu:0'):
          images, labels = next_batch()
        if loss_scale:
          images = tf.cast(images, tf.float16)
        loss = tower_loss(scope, images, labels, model)  # float32 either way
        tf.compat.v1.get_variable_scope().reuse_variables()  # towers 1.. share tower 0's
        if loss_scale:  # float16 gradients below 6e-8 would be zero: scale them up
          tower_grads.append(optimizer.compute_gradients(
              mixed_precision.scale_loss(loss, loss_scale)))
        else:
          tower_grads.append(optimizer.compute_gradients(loss))
        tower_losses.append(loss)
  return Towers(tower_losses, tower_grads)


def learning_rate(global_step, examples_per_update, examples_per_epoch, model=cifar10):
  """The tutorial's schedule: the rate drops by LEARNING_RATE_DECAY_FACTOR once per
  NUM_EPOCHS_PER_DECAY epochs, counted in updates of examples_per_update images.

  Returns:
    (float32 scalar learning rate, int decay_steps: updates between two drops).
  """
  decay_steps = int(examples_per_epoch / examples_per_update * model.NUM_EPOCHS_PER_DECAY)
  lr = tf.compat.v1.train.exponential_decay(model.INITIAL_LEARNING_RATE, global_step,
                                            decay_steps, model.LEARNING_RATE_DECAY_FACTOR,
                                            staircase=model.STAIRCASE)
  return lr, decay_steps


def moving_averages(global_step, model=cifar10):
  """The shadow copies evaluation reads: one per trainable variable, in every checkpoint."""
  return tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY,
                                                     num_updates=global_step)


def then_average(update_op, ema):
  """update_op, then the moving averages of the variables it has just changed."""
  with tf.control_dependencies([update_op]):  # the averages read the updated values
    ema_op = ema.apply(tf.compat.v1.trainable_variables())
  return tf.group(update_op, ema_op)


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
          summaries=True, use_fp16=False):
  """train()'s graph, in the tutorial's order: rate, towers, average, apply, averages.

  Args:
    next_batch, devices, model: as build_towers'.
    batch_size: int, images per tower.
    examples_per_epoch: int, training records in one epoch (for the schedule).
    summaries: bool, build the TensorBoard summary op.
    use_fp16: bool, float16 towers over float32 variables, with a dynamic loss
      scale: a step whose averaged gradients overflow is skipped (mixed_precision.py).

  Returns:
    a TrainGraph.
  """
  examples_per_update = batch_size * len(devices)
  with tf.device('/cpu:0'):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, decay_steps = learning_rate(global_step, examples_per_update, examples_per_epoch,
                                    model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    loss_scale = (mixed_precision.make_loss_scale(mixed_precision.INITIAL_LOSS_SCALE)
                  if use_fp16 else None)
  towers = build_towers(next_batch, devices, opt, model, loss_scale=loss_scale)
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


AsyncTrainGraph = collections.namedtuple('AsyncTrainGraph', [
    'train_ops',            # one per tower: its own update, then the moving averages
    'loss',                 # float32 scalar: tower 0's, which its own train op computes
    'global_step', 'decay_steps', 'examples_per_update', 'summary_op',  # as TrainGraph's
])


def build_async(next_batch, devices, batch_size, examples_per_epoch, model=cifar10,
                summaries=True, use_fp16=False):
  """--async_towers: each tower applies its own gradients as soon as they are ready.

  Arguments as build()'s. Returns an AsyncTrainGraph; its summaries watch tower 0
  alone, the one whose train op computes them.
  """
  if use_fp16:  # check_flags says why
    raise ValueError('use_fp16 needs synchronous towers; async_towers cannot take it')
  with tf.device('/cpu:0'):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, decay_steps = learning_rate(global_step, batch_size, examples_per_epoch, model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
  towers = build_towers(next_batch, devices, opt, model)
  with tf.device('/cpu:0'):
    ema = moving_averages(global_step, model)
    train_ops = [then_average(opt.apply_gradients(grads, global_step=global_step), ema)
                 for grads in towers.grads]
  summary_op = (build_summaries([0], towers.losses, towers.grads[0], lr, model)
                if summaries else None)
  return AsyncTrainGraph(train_ops, towers.losses[0], global_step, decay_steps,
                         batch_size, summary_op)


def build_summaries(watched, tower_losses, grads, lr, model=cifar10, loss_scale=None):
  """TensorBoard summaries, tags free of tower prefixes so 1- and 4-tower runs overlay.

  Args:
    watched: indices of the towers whose losses and activations are summarised.
    tower_losses: every tower's total loss; grads: [(gradient, variable), ...].
    loss_scale: fp16: float32 scalar, the scale of this step's gradients; or None.
      The histograms then leave out inf and NaN, which a step skipped after an
      overflow holds (HistogramSummary refuses them).

  The raw summary ops take the tag as given; tf.summary.* would derive it from
  the graph's name scopes and uniquify it ('total_loss_1').
  """
  scalars, histograms = {}, {}
  total, cross_entropy = [], []
  for i in watched:
    prefix = '%s_%d/' % (model.TOWER_NAME, i)
    total.append(tower_losses[i])
    cross_entropy.extend(tf.compat.v1.get_collection(model.CROSS_ENTROPY, prefix))
    scalars[LOSS_TAGS + prefix + 'total_loss'] = total[-1]
    scalars[LOSS_TAGS + prefix + 'cross_entropy'] = cross_entropy[-1]
  scalars[LOSS_TAGS + 'total_loss'] = tf.reduce_mean(total)
  scalars[LOSS_TAGS + 'cross_entropy'] = tf.reduce_mean(cross_entropy)
  scalars[TRAINING_TAGS + 'learning_rate'] = lr
  if loss_scale is not None:
    scalars[TRAINING_TAGS + 'loss_scale'] = loss_scale
  first = '%s_%d/' % (model.TOWER_NAME, watched[0])
  for x in tf.compat.v1.get_collection(model.ACTIVATIONS, first):
    layer = x.op.name[len(first):].split('/')[0]  # tower_0/conv1/conv1 -> conv1
    histograms[layer + '/activations'] = x
    scalars[layer + '/sparsity'] = tf.nn.zero_fraction(x)
  for grad, var in grads:
    histograms[var.op.name] = var
    histograms[var.op.name + '/gradients'] = grad
  with tf.name_scope('summaries'):
    if loss_scale is not None:
      histograms = {tag: tf.boolean_mask(x, tf.math.is_finite(x))
                    for tag, x in histograms.items()}
    return tf.compat.v1.summary.merge(
        [tf.raw_ops.ScalarSummary(tags=tag, values=value) for tag, value in scalars.items()] +
        [tf.raw_ops.HistogramSummary(tag=tag, values=value)
         for tag, value in histograms.items()])


class Settings(typing.NamedTuple):
  """One run's settings: the flags, or a test's arguments (settings_from_flags)."""
  train_dir: str
  data_dir: str
  num_gpus: int = NUM_GPUS
  batch_size: int = BATCH_SIZE                  # images per tower
  max_steps: int = MAX_STEPS                    # the global step to stop at
  dataset: str = 'cifar10'                      # a key of DATASETS
  log_frequency: int = LOG_FREQUENCY
  summary_steps: int = SUMMARY_STEPS            # 0: no summaries
  save_every_n_steps: int = SAVE_EVERY_N_STEPS
  synthetic: bool = False
  data_url: str = None
  data_md5: str = None
  seed: int = None                              # int >= 0: the run repeats exactly
  fresh: bool = False
  async_towers: bool = False
  use_fp16: bool = False                        # float16 towers, float32 variables
  session: placement.SessionOptions = placement.SessionOptions()


def train(settings, stop=None, flag_values=None):
  """Trains until global step settings.max_steps, resuming from the latest checkpoint.

  Args:
    settings: a Settings.
    stop: a training_run.StopSignals, or None (tests): when it is requested the
      loop ends after the current step, saves, and training_run.Stopped is raised.
    flag_values: dict, the command line's flags, for the run record.
  """
  data = DATASETS[settings.dataset]
  with contextlib.ExitStack() as exit_stack:  # holds the lock on train_dir
    run = start(exit_stack, settings, data.input)
    if run is None:
      return
    devices, num_cpu_devices, where = placement.tower_devices(settings.num_gpus)
    epoch = examples_per_epoch(settings, data)
    with tf.Graph().as_default():
      if settings.seed is not None:
        tf.compat.v1.set_random_seed(settings.seed)  # the initial weights
        if any(d.startswith('/gpu') for d in devices):  # CPU kernels repeat as they are
          exit_stack.enter_context(placement.op_determinism())
      next_batch, input_init = input_pipeline(
          settings.data_dir, settings.num_gpus, settings.batch_size, settings.synthetic,
          settings.seed, first_batch(run), data.input)
      build_graph = build_async if settings.async_towers else build
      graph = build_graph(next_batch, devices, settings.batch_size, epoch.count, data.model,
                          summaries=settings.summary_steps > 0, use_fp16=settings.use_fp16)
      check_memory(step_fetches(graph, settings.async_towers), settings)  # before any write
      if settings.fresh:
        training_run.set_aside(settings.train_dir)
      record = run_record(flag_values, settings, devices, run.start_step, data)
      print('Run record: %s' % training_run.write_run_record(settings.train_dir, record))
      print_start(graph, where, settings, data.model, epoch)
      config = placement.session_config(num_cpu_devices, settings.session)
      with open_session(run, config, input_init) as (sess, saver):
        run_loop = loop_async if settings.async_towers else loop
        run_loop(sess, saver, graph, run, settings, stop or NEVER, record)


Epoch = collections.namedtuple('Epoch', [
    'count',   # int: training records in one epoch
    'source',  # str: where the count came from, for start-up
])


def examples_per_epoch(settings, data):
  """One epoch of the schedule: the training records actually read, counted.

  The official sets give the tutorial's 50,000 and the book's 60,000; a sample or
  a copy of your own counts its own records. Synthetic input takes the official
  count, as there is no epoch to count.
  """
  if settings.synthetic:
    return Epoch(data.model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
                 '%s/model.py\'s count: the input is synthetic' % data.model.__name__)
  count, files = data.input.train_records(settings.data_dir)
  return Epoch(count, 'the records in %s' % files)


def step_fetches(graph, async_towers):
  """What the loop runs in one step, summaries included: what must fit in memory."""
  return ((list(graph.train_ops) if async_towers else [graph.train_op]) + [graph.loss] +
          ([graph.summary_op] if graph.summary_op is not None else []))


def check_memory(fetches, settings):
  """Stops the run in one line when one step cannot fit in the memory available:
  a step too large is otherwise killed by the kernel minutes later, without a word."""
  # The host's share: on GPUs the activations live in GPU memory, and running out
  # of that fails at once and by name (memory_check.check_step_fits).
  estimate = memory_check.estimate_step_bytes(fetches, 'CPU')
  memory_check.check_step_fits(estimate, memory_check.memory_available(),
                               settings.batch_size, settings.num_gpus)


TrainRun = collections.namedtuple('TrainRun', [
    'train_dir',   # str
    'checkpoint',  # str, the checkpoint to restore, or None to start from step 0
    'start_step',  # int, its global step
])


def start(exit_stack, settings, data_input=cifar10_input):
  """Checks, lock and resume point: everything that can stop a run before it starts.

  Nothing is created until every check has passed: a run that cannot start
  leaves no directory behind. (--fresh moves the old files once the graph is
  built and its step known to fit in memory: train().) The lock on train_dir is released when
  exit_stack (a contextlib.ExitStack) closes. data_input: the data set's input
  module, whose prepare() downloads and checks the files.

  Returns:
    a TrainRun, or None when train_dir's checkpoint is already at max_steps.
  """
  train_dir = settings.train_dir
  training_run.check_train_dir(train_dir)
  locked = False
  if os.path.isdir(train_dir):  # before reading its checkpoints
    exit_stack.enter_context(training_run.lock_train_dir(train_dir))
    locked = True
  checkpoint, start_step, _, notes = (
      (None, 0, [], []) if settings.fresh else training_run.checkpoint_to_resume(train_dir))
  for note in notes:
    print(note)
  if start_step >= settings.max_steps:
    print('%s is at step %d, not below --max_steps=%d: nothing to do. Raise --max_steps '
          'to train further.' % (checkpoint, start_step, settings.max_steps))
    return None
  if not settings.synthetic:
    data_input.prepare(settings.data_dir, settings.data_url, settings.data_md5)
  if not locked:
    training_run.make_train_dir(train_dir)
    exit_stack.enter_context(training_run.lock_train_dir(train_dir))
  return TrainRun(train_dir, checkpoint, start_step)


def first_batch(run):
  """The global batch a seeded input starts at: one per step run so far, applied or
  skipped (an fp16 step whose gradients overflowed consumed its batch too)."""
  return run.start_step + mixed_precision.checkpoint_skipped_steps(run.checkpoint)


def input_pipeline(data_dir, num_gpus, batch_size, synthetic=False, seed=None,
                   start_step=0, data_input=cifar10_input):
  """The one input pipeline that every tower draws from, on the CPU.

  With a seed, each step reads one global batch, fixed by (seed, global step)
  alone, and cuts it into the towers' batches in tower order: the same images,
  distorted the same way, whatever the number of towers, and a resumed run reads
  on from start_step exactly. (Towers dequeuing their own batches would race
  for them.) Without a seed, each tower dequeues its own batch, shuffled and
  distorted afresh on every run.

  Args:
    data_input: the data set's input module (DATASETS[...].input).

  Returns:
    (next_batch: callable giving the next tower's (images float32 [batch_size,
     24, 24, 3] or [batch_size, 784], labels int32 [batch_size]), called once per
     tower; the op that starts the pipeline, to run once in the session).
  """
  with tf.device('/cpu:0'):
    if seed is not None and not synthetic:
      dataset, load_records = data_input.seeded_dataset(data_dir, batch_size * num_gpus,
                                                        seed, start_step)
      iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
      images, labels = iterator.get_next()
      towers = iter(list(zip(tf.split(images, num_gpus), tf.split(labels, num_gpus))))
      return lambda: next(towers), tf.group(load_records, iterator.initializer)
    if synthetic:
      dataset = data_input.synthetic_dataset(batch_size)
    else:
      dataset = data_input.train_dataset(data_dir, batch_size)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator.get_next, iterator.initializer


def run_record(flag_values, settings, devices, start_step, data, extra_constants=None):
  """What this run used: flags, every constant of the trainer, model and reader.

  Constants are read when the run starts, so a constant edited between two runs
  shows in their records. extra_constants: {file name: constants} of the calling
  program, when it is not this one (dist_train.py).
  """
  constants = {'multi_gpu_train.py': training_run.constants_of(sys.modules[__name__])}
  constants.update(extra_constants or {})
  if settings.use_fp16:
    constants['mixed_precision.py'] = training_run.constants_of(mixed_precision)
  constants['%s/model.py' % data.model.__name__] = training_run.constants_of(data.model)
  constants['%s.py' % data.input.__name__] = training_run.constants_of(data.input)
  return collections.OrderedDict([
      ('command', ' '.join(sys.argv)),
      ('started', datetime.datetime.now().isoformat(timespec='seconds')),
      ('start_step', start_step),
      ('seed', settings.seed),
      ('flags', flag_values or {}),
      ('constants', constants),
      ('tensorflow', tf.__version__),
      ('onednn', onednn.record()),
      ('devices', devices),
      ('data', data_read(data.input, settings)),
  ])


def data_read(data_input, settings):
  """What the run reads, for its record: the directory and which copy, not only the
  official URL that the input module's constants name."""
  if settings.synthetic:
    return 'synthetic'
  source = collections.OrderedDict(data_dir=os.path.abspath(settings.data_dir))
  if settings.data_md5:
    source['copy'] = 'your own archive, md5 %s (--data_md5)' % settings.data_md5
  else:
    source['url'] = settings.data_url or data_input.DATA_URL
  return source


def print_start(graph, where, settings, model, epoch):
  """The start-up lines: devices, oneDNN, global batch, parameters, learning-rate schedule."""
  num_params = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
  batch_size, num_gpus = settings.batch_size, settings.num_gpus
  print('TensorFlow %s; %s' % (tf.__version__, where))
  print(onednn.start_line())
  print('global batch %d = %d x %d towers%s; %d trainable parameters' % (
      batch_size * num_gpus, batch_size, num_gpus,
      ' (async: each update applies %d)' % batch_size if settings.async_towers else '',
      num_params))
  print('decay_steps %d = %d examples (%s) / %d per update x %g epochs; input: %s%s' % (
      graph.decay_steps, epoch.count, epoch.source, graph.examples_per_update,
      model.NUM_EPOCHS_PER_DECAY, 'synthetic' if settings.synthetic else settings.data_dir,
      '' if settings.seed is None else '; seed %d: this run repeats exactly' % settings.seed))
  print(schedule_line(model, graph.decay_steps))
  if settings.use_fp16:
    print('float16 towers, float32 variables; dynamic loss scale from %g (a resumed run '
          'keeps its own), doubled after %d clean steps, halved on an overflow' % (
              mixed_precision.INITIAL_LOSS_SCALE, mixed_precision.LOSS_SCALE_PERIOD))


def schedule_line(model, decay_steps):
  """The learning-rate schedule whole, from the model's constants, for start-up."""
  return 'learning rate %g, multiplied by %g every %d updates (%s); constants in %s/model.py' % (
      model.INITIAL_LEARNING_RATE, model.LEARNING_RATE_DECAY_FACTOR, decay_steps,
      'staircase' if model.STAIRCASE else 'smoothly', model.__name__)


@contextlib.contextmanager
def open_session(run, config, input_init):
  """A session with the variables restored from run.checkpoint, or initialised,
  and the input pipeline started (input_init).

  Yields:
    (session, Saver that writes checkpoints and deletes none: save_checkpoint rotates).
  """
  saver = training_run.make_saver(tf.compat.v1.global_variables())
  init = tf.compat.v1.global_variables_initializer()
  with tf.compat.v1.Session(config=config) as sess:
    if run.checkpoint:
      try:  # a float32 run's checkpoint into fp16 too: its loss scale starts fresh
        fresh = mixed_precision.restore(sess, run.checkpoint, tf.compat.v1.global_variables())
      except (tf.errors.OpError, ValueError) as e:
        raise TrainingError('cannot restore %s into this model: %s Use another '
                            '--train_dir, or --fresh to start over.'
                            % (run.checkpoint, training_run.restore_error(e))) from None
      print('Resuming from %s at step %d' % (run.checkpoint, run.start_step))
      if fresh:
        print('%s holds no loss scale (a float32 run\'s): it starts at %g' % (
            run.checkpoint, mixed_precision.INITIAL_LOSS_SCALE))
    else:
      sess.run(init)
      print('Starting from step 0 in %s' % run.train_dir)
    sess.run(input_init)
    sys.stdout.flush()
    yield sess, saver


class _Never:
  requested = False


NEVER = _Never()  # the stop signal of a run nobody can interrupt (tests)


def loop(sess, saver, graph, run, settings, stop, record):
  """The step loop: run, check, log, summarise, save; then the last save."""
  model_name = DATASETS[settings.dataset].model.__name__
  num_towers = settings.num_gpus
  writer = open_writer(sess, run, settings.summary_steps, record)
  save = saver_with_check(sess, saver, run.train_dir, model_name)
  # fp16: [applied, scale, new_scale] of each step; float32: nothing more to fetch.
  scale_fetches = list(graph.loss_scale_update[1:]) if graph.loss_scale_update else []
  step = last_saved = last_summary = run.start_step
  while not stop.requested and step < settings.max_steps:
    # Summaries describe the variables at `step`, before this update.
    summarize = writer and step % settings.summary_steps == 0
    fetches = [graph.train_op, graph.loss, scale_fetches] + (
        [graph.summary_op] if summarize else [])
    start_time = time.time()
    results = sess.run(fetches)
    duration = time.time() - start_time

    loss_value = results[1]
    check_loss(loss_value, step + 1, model_name, last_saved)  # unscaled: real divergence
    if scale_fetches and not results[2][0]:  # overflowed: nothing applied, step unchanged
      check_skip(step + 1, *results[2][1:])
      continue
    step += 1
    examples_per_sec = graph.examples_per_update / duration
    if step % settings.log_frequency == 0 or step == run.start_step + 1:
      print_loss_line(step, loss_value, examples_per_sec, duration / num_towers)
    if summarize:
      write_summary(writer, results[3], step - 1, examples_per_sec)
      last_summary = step - 1
    if step % settings.save_every_n_steps == 0:
      last_saved = save(step, last_saved)
  finish(sess, graph, run, writer, save, last_saved, last_summary, stop)


def loop_async(sess, saver, graph, run, settings, stop, record):
  """--async_towers: towers 1.. run in threads; the loop below runs tower 0 and logs.

  Every applied update takes one from a shared budget, so the towers together
  stop exactly at max_steps.
  """
  model_name = DATASETS[settings.dataset].model.__name__
  writer = open_writer(sess, run, settings.summary_steps, record)
  save = saver_with_check(sess, saver, run.train_dir, model_name)
  take_update = _update_budget(settings.max_steps - run.start_step)
  halt, failures, threads = threading.Event(), [], []
  updates_by_tower = [0] * len(graph.train_ops)
  for i, op in enumerate(graph.train_ops[1:], 1):
    threads.append(threading.Thread(target=_run_tower, daemon=True, args=(
        sess, op, take_update, halt, failures, updates_by_tower, i)))
    threads[-1].start()

  step = last_saved = last_summary = run.start_step
  try:
    while not stop.requested and take_update():
      summarize = writer and step % settings.summary_steps == 0
      fetches = [graph.train_ops[0], graph.loss] + ([graph.summary_op] if summarize else [])
      start_time = time.time()
      results = sess.run(fetches)
      duration = time.time() - start_time
      updates_by_tower[0] += 1
      previous, step = step, sess.run(graph.global_step)  # the other towers' updates too

      check_loss(results[1], step, model_name, last_saved)
      if failures:
        raise failures[0]
      examples_per_sec = (step - previous) * graph.examples_per_update / duration
      if (step // settings.log_frequency != previous // settings.log_frequency or
          previous == run.start_step):
        print_loss_line(step, results[1], examples_per_sec, duration / (step - previous))
      if summarize:
        write_summary(writer, results[2], previous, examples_per_sec)
        last_summary = previous
      if step // settings.save_every_n_steps != last_saved // settings.save_every_n_steps:
        last_saved = save(step, last_saved)
  finally:
    halt.set()
    for thread in threads:
      thread.join()
  step = finish(sess, graph, run, writer, save, last_saved, last_summary, stop)
  print('updates applied per tower: %s; global step %d' % (', '.join(
      'tower_%d %d' % (i, n) for i, n in enumerate(updates_by_tower)), step))


def open_writer(sess, run, summary_steps, record):
  """The run's event file, opening with its record; None without summaries.

  A failed event-file write is said once; training goes on (training_run.SummaryWriter).
  """
  if not summary_steps:
    return None
  writer = training_run.SummaryWriter(run.train_dir, sess.graph if not run.checkpoint else None)
  # Runs compared side by side in TensorBoard say what differed.
  writer.add_summary(training_run.text_summary('run_record', record), run.start_step)
  return writer


def check_loss(loss_value, step, model_name, last_saved):
  """Stops the run on a NaN or infinite loss, naming the step and what to try."""
  if not np.isfinite(loss_value):
    raise TrainingError(
        'loss is %s at step %d: the model diverged. Lower INITIAL_LEARNING_RATE '
        '(%s/model.py) or --batch_size; %s' % (loss_value, step, model_name,
                                              _last_checkpoint_note(last_saved)))


def check_skip(step, scale, new_scale):
  """fp16: says that a step's gradients overflowed and were not applied; stops the run
  when they overflow even unscaled (scale 1), where no smaller scale can help."""
  print('%s: step %d skipped: gradients overflowed at loss scale %g; scale now %g' % (
      datetime.datetime.now(), step, scale, new_scale))
  sys.stdout.flush()
  if scale <= mixed_precision.MIN_LOSS_SCALE:
    raise TrainingError('the gradients overflow float16 even at loss scale %g at step %d: '
                        'the model diverged. Lower INITIAL_LEARNING_RATE, or train in '
                        'float32 (drop --use_fp16).' % (scale, step))


def print_loss_line(step, loss_value, examples_per_sec, sec_per_batch):
  """The tutorial's line, its fields in its order."""
  print('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)' % (
      datetime.datetime.now(), step, loss_value, examples_per_sec, sec_per_batch))
  sys.stdout.flush()


def finish(sess, graph, run, writer, save, last_saved, last_summary, stop):
  """After the loop: a summary and a checkpoint of the step where it stopped, and
  training_run.Stopped after a signal. Returns the global step."""
  # The global step, not the loop's count: async towers may have landed a few more.
  step = sess.run(graph.global_step)
  if writer:
    if step != last_summary:  # every run ends with a summary of where it stopped
      write_summary(writer, sess.run(graph.summary_op), step, None)
    writer.close()
  if step != last_saved:
    save(step, last_saved)
  if stop.requested:
    print('Stopped by %s at step %d%s; rerun the same command to resume.' % (
        stop.name, step, '' if step != run.start_step else ' before any step'))
    raise training_run.Stopped(stop.exit_code)
  return step


def write_summary(writer, summary, step, examples_per_sec):
  writer.add_summary(summary, step)
  if examples_per_sec is not None:
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag=TRAINING_TAGS + 'examples_per_sec', simple_value=examples_per_sec)]), step)


def _last_checkpoint_note(last_saved):
  if last_saved:
    return 'the last checkpoint, step %d, is untouched.' % last_saved
  return 'no checkpoint was written.'


def saver_with_check(sess, saver, train_dir, model_name):
  """save(step, last_saved): writes model.ckpt-<step> unless a variable is NaN or
  infinite (then TrainingError, the last checkpoint untouched); returns step."""
  all_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                              for v in tf.compat.v1.trainable_variables()])

  def save(step, last_saved):
    if not sess.run(all_finite):
      raise TrainingError(
          'a variable became NaN or infinite by step %d: the model diverged. Lower '
          'INITIAL_LEARNING_RATE (%s/model.py); %s'
          % (step, model_name, _last_checkpoint_note(last_saved)))
    print('Saved checkpoint %s' % training_run.save_checkpoint(sess, saver, train_dir, step,
                                                               KEEP_CHECKPOINTS))
    sys.stdout.flush()
    return step
  return save


def _update_budget(updates):
  """A thread-safe countdown: the returned function is True `updates` times."""
  lock, left = threading.Lock(), [updates]
  def take():
    with lock:
      left[0] -= 1
      return left[0] >= 0
  return take


def _run_tower(sess, train_op, take_update, stop, failures, counts, i):
  """Async mode: tower i applies its own updates while the budget lasts."""
  try:
    while not stop.is_set() and take_update():
      sess.run(train_op)
      counts[i] += 1
  except Exception as e:  # surfaced by the main loop
    failures.append(e)


def apply_dataset_defaults():
  """Gives the flags not set on the command line their --dataset's defaults."""
  for name, value in DATASETS[FLAGS.dataset].defaults.items():
    if FLAGS[name].value is None:
      setattr(FLAGS, name, value)


def settings_from_flags():
  """The run's Settings from the command line, once apply_dataset_defaults() has run.

  Both trainers take their settings from here; dist_train.py refuses the flags
  that mean nothing there (--fresh, --async_towers, --seed), so they keep their
  defaults.
  """
  session = placement.SessionOptions(
      **{name: FLAGS[name].value for name in placement.SessionOptions._fields})
  return Settings(session=session, **{name: FLAGS[name].value for name in Settings._fields
                                      if name != 'session'})


def check_flags(also_positive=()):
  """Stops the run, naming the flag, when a trainer flag is out of range.

  Args:
    also_positive: names of the calling program's own flags that must be >= 1.
  """
  for name in ('num_gpus', 'batch_size', 'max_steps', 'log_frequency',
               'save_every_n_steps') + tuple(also_positive):
    if getattr(FLAGS, name) < 1:
      sys.exit('error: --%s must be at least 1, got %d' % (name, getattr(FLAGS, name)))
  if FLAGS.data_md5 and not hasattr(DATASETS[FLAGS.dataset].input, 'DATA_MD5'):
    sys.exit('error: --data_md5 names a copy of the CIFAR-10 archive; --dataset=%s reads '
             'files with their own published md5s. Drop --data_md5.' % FLAGS.dataset)
  if FLAGS.seed is not None and FLAGS.seed < 0:
    sys.exit('error: --seed must be 0 or more, got %d' % FLAGS.seed)
  if FLAGS.use_fp16 and FLAGS.async_towers:
    sys.exit('error: --use_fp16 cannot train --async_towers: the towers share one loss '
             'scale, and one tower halving it while another is between scaling its loss '
             'and unscaling its gradients would apply that tower\'s gradients at twice or '
             'half their size. Drop one of the two.')
  if FLAGS['seed'].present and FLAGS['async_towers'].present and FLAGS.async_towers:
    sys.exit('error: --seed cannot repeat an --async_towers run: the towers race for the '
             'shared variables by design, so the order of updates differs from run to run. '
             'Drop one of the two.')
  for name in ('summary_steps', 'intra_op_threads', 'inter_op_threads'):
    if getattr(FLAGS, name) < 0:
      sys.exit('error: --%s must be 0 or more, got %d' % (name, getattr(FLAGS, name)))
  if not 0.0 <= FLAGS.gpu_memory_fraction <= 1.0:
    sys.exit('error: --gpu_memory_fraction must be between 0 and 1, got %g'
             % FLAGS.gpu_memory_fraction)


def main(argv):
  del argv  # absl has already refused unknown flags
  stop = training_run.StopSignals(FLAGS.train_dir)  # first, so that no Ctrl-C or SIGTERM is lost
  # Each line as it is printed, into a pipe too (`| tee run.log`), where Python's default
  # would hold the start-up lines back until the session opens.
  sys.stdout.reconfigure(line_buffering=True)
  apply_dataset_defaults()
  check_flags()
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # our own lines say it
  with training_run.one_line_errors():
    train(settings_from_flags(), stop=stop,
          flag_values={flag.name: flag.value
                       for flag in FLAGS.get_flags_for_module(sys.argv[0])})


if __name__ == '__main__':
  placement.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
