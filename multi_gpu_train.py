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
Speed on a 2-core CPU without GPUs: about 700 examples/sec with 1, 2 or 4 towers,
1.4-1.6x the Keras MirroredStrategy peers (benchmarks/benchmark.py; README
"Performance").
Rerunning resumes from the latest checkpoint in --train_dir; --fresh starts over.
--seed=N makes a run repeat exactly. Ctrl-C or SIGTERM saves at the current step.
"""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's errors only; no INFO, WARNING

import collections
import contextlib
import datetime
import functools
import re
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import cifar10
import cifar10_input
import mnist
import mnist_input
import training_run

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
# constants build_train_graph reads; the input module gives prepare,
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
flags.DEFINE_boolean('synthetic', False, 'Feed random in-memory images instead of files, '
                     'to time the compute alone.')
flags.DEFINE_boolean('log_device_placement', False, 'Log the device of every op.')
flags.DEFINE_boolean('allow_growth', False, 'Allocate GPU memory as needed instead of '
                     'taking nearly all of it at start.')
flags.DEFINE_float('gpu_memory_fraction', 0.0, 'Cap on the share of each GPU\'s memory '
                   'this process takes (per_process_gpu_memory_fraction); 0: no cap.')
flags.DEFINE_integer('intra_op_threads', 0, 'Threads inside one op; 0: one per core.')
flags.DEFINE_integer('inter_op_threads', 0, 'Ops run at once; 0: one per core.')
flags.DEFINE_integer('seed', None, 'Seed every random choice (initial weights, record order, '
                     'distortions) so that the same command repeats exactly, whatever '
                     'the towers, and a resumed run equals an uninterrupted one.')

TrainingError = training_run.TrainingError


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


def tower_devices(num_gpus):
  """Device of each tower: /gpu:i when TensorFlow sees enough GPUs, else /cpu:i.

  Returns:
    (list of device strings, number of CPU devices the session must create,
     a line for start-up saying where the towers run).
  """
  gpus = training_run.list_gpus()  # honours CUDA_VISIBLE_DEVICES
  if len(gpus) >= num_gpus:
    return (['/gpu:%d' % i for i in range(num_gpus)], 1,
            'towers on /gpu:0 .. /gpu:%d of %d visible GPUs' % (num_gpus - 1, len(gpus)))
  where = ('the tower runs on /cpu:0' if num_gpus == 1 else
           'towers run on %d virtual CPU devices /cpu:0 .. /cpu:%d, sharing the CPU cores'
           % (num_gpus, num_gpus - 1))
  return (['/cpu:%d' % i for i in range(num_gpus)], num_gpus,
          'TensorFlow sees %d GPU(s) (CUDA_VISIBLE_DEVICES=%s), fewer than --num_gpus=%d: %s'
          % (len(gpus), os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), num_gpus, where))


def _place(device, variables_device):
  """Device function: variables on `variables_device`, every other op on `device`.

  variables_device '' leaves variables to an enclosing device function, such as
  replica_device_setter putting them on parameter servers. A device set by an
  inner scope wins (the input's /cpu:0, SyncReplicasOptimizer's queues).
  """
  def place(op):
    node_def = op if isinstance(op, tf.compat.v1.NodeDef) else op.node_def
    if node_def.op in ('VarHandleOp', 'VariableV2'):
      return variables_device
    return node_def.device or device
  return place


def session_config(num_cpu_devices=1, log_device_placement=False, allow_growth=False,
                   gpu_memory_fraction=0.0, intra_op_threads=0, inter_op_threads=0):
  """ConfigProto with soft placement, the virtual CPU devices and the GPU options."""
  config = tf.compat.v1.ConfigProto(
      allow_soft_placement=True,  # ops with no GPU kernel fall back to the CPU
      log_device_placement=log_device_placement,
      device_count={'CPU': num_cpu_devices},
      intra_op_parallelism_threads=intra_op_threads,
      inter_op_parallelism_threads=inter_op_threads)
  config.gpu_options.allow_growth = allow_growth
  if gpu_memory_fraction:
    config.gpu_options.per_process_gpu_memory_fraction = gpu_memory_fraction
  return config


def build_train_graph(next_batch, devices, batch_size, async_towers=False,
                      summaries=True, variables_device='/cpu:0', wrap_optimizer=None,
                      model=cifar10):
  """Builds the towers, the gradient average, the update and the moving averages.

  This is train()'s graph, in its own function so that tests and the benchmark
  build exactly what training runs.

  Args:
    next_batch: callable returning (images float32 [batch_size, 24, 24, 3],
      labels int32 [batch_size]); called once per tower, on the CPU, so each
      tower dequeues its own batch from the one input pipeline.
    devices: list of device strings, one tower each.
    batch_size: int, images per tower.
    async_towers: bool; False: average the towers' gradients and apply them once
      per step. True: each tower applies its own gradients (one train op each).
    summaries: bool, build the TensorBoard summary op.
    variables_device: where the shared variables live; '' leaves them to an
      enclosing device function (a parameter-server replica_device_setter).
    wrap_optimizer: optional callable taking and returning the optimizer
      (for instance in a SyncReplicasOptimizer).
    model: the model package (DATASETS[...].model): its inference, loss and constants.

  Returns:
    dict with train_ops (one op, or one per tower when async), apply_ops (the
    same updates without the moving averages, for the benchmark), tower_losses
    (float32 scalars), loss (their mean; async: tower 0's), global_step, lr,
    examples_per_update, decay_steps, summary_op (None without summaries), ema,
    optimizer and model.
  """
  num_towers = len(devices)
  examples_per_update = batch_size if async_towers else batch_size * num_towers
  on_cpu = _place('/cpu:0', variables_device)
  with tf.compat.v1.device(on_cpu):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    # One decay per NUM_EPOCHS_PER_DECAY epochs of updates, counted in global batches.
    decay_steps = int(model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN / examples_per_update *
                      model.NUM_EPOCHS_PER_DECAY)
    lr = tf.compat.v1.train.exponential_decay(model.INITIAL_LEARNING_RATE, global_step,
                                              decay_steps,
                                              model.LEARNING_RATE_DECAY_FACTOR,
                                              staircase=model.STAIRCASE)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    if wrap_optimizer:
      opt = wrap_optimizer(opt)

  tower_grads, tower_losses = [], []
  # A re-entered copy of the current scope, so that reuse ends with the loop.
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()):
    for i, device in enumerate(devices):
      with tf.compat.v1.device(_place(device, variables_device)), \
          tf.name_scope('%s_%d' % (model.TOWER_NAME, i)) as scope:
        with tf.device('/cpu:0'):
          images, labels = next_batch()
        loss = tower_loss(scope, images, labels, model)
        tf.compat.v1.get_variable_scope().reuse_variables()  # towers 1.. share tower 0's
        tower_grads.append(opt.compute_gradients(loss))
        tower_losses.append(loss)

  with tf.compat.v1.device(on_cpu):
    variables = tf.compat.v1.trainable_variables()
    ema = tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY,
                                                      num_updates=global_step)
    if async_towers:
      updates = tower_grads
    else:
      updates = [average_gradients(tower_grads)]
    train_ops, apply_ops = [], []
    for grads in updates:
      apply_ops.append(opt.apply_gradients(grads, global_step=global_step))
      # The averages read the variables only after this update has landed.
      with tf.control_dependencies([apply_ops[-1]]):
        ema_op = ema.apply(variables)
      train_ops.append(tf.group(apply_ops[-1], ema_op))
    # Async: tower 0's loss, which its own train op computes; the mean would run
    # every tower's forward pass in tower 0's step.
    loss = tower_losses[0] if async_towers else tf.reduce_mean(tf.stack(tower_losses),
                                                                name='total_loss')

  summary_op = None
  if summaries:
    # Async: only tower 0's tensors, the ones its own train op computes.
    watched = range(num_towers) if not async_towers else [0]
    summary_op = _summaries(watched, tower_losses, updates[0], lr, model)
  return dict(train_ops=train_ops, apply_ops=apply_ops, tower_losses=tower_losses,
              loss=loss,
              global_step=global_step, lr=lr, examples_per_update=examples_per_update,
              decay_steps=decay_steps, summary_op=summary_op, ema=ema, optimizer=opt,
              model=model)


def _summaries(towers, tower_losses, grads, lr, model):
  """TensorBoard summaries, tags free of tower prefixes so 1- and 4-tower runs overlay.

  The raw summary ops take the tag as given; tf.summary.* would derive it from
  the graph's name scopes and uniquify it ('total_loss_1').
  """
  graph = tf.compat.v1.get_default_graph()
  scalars, histograms = {}, {}
  total, cross_entropy = [], []
  for i in towers:
    prefix = '%s_%d/' % (model.TOWER_NAME, i)
    total.append(tower_losses[i])
    cross_entropy.append(graph.get_tensor_by_name(prefix + 'cross_entropy:0'))
    scalars[prefix + 'total_loss'] = total[-1]
    scalars[prefix + 'cross_entropy'] = cross_entropy[-1]
  scalars['total_loss'] = tf.reduce_mean(total)
  scalars['cross_entropy'] = tf.reduce_mean(cross_entropy)
  scalars['learning_rate'] = lr
  first = '%s_%d/' % (model.TOWER_NAME, towers[0])
  for x in tf.compat.v1.get_collection(model.ACTIVATIONS, first):
    layer = x.op.name[len(first):].split('/')[0]  # tower_0/conv1/conv1 -> conv1
    histograms[layer + '/activations'] = x
    scalars[layer + '/sparsity'] = tf.nn.zero_fraction(x)
  for grad, var in grads:
    histograms[var.op.name] = var
    histograms[var.op.name + '/gradients'] = grad
  with tf.name_scope('summaries'):
    return tf.compat.v1.summary.merge(
        [tf.raw_ops.ScalarSummary(tags=tag, values=value) for tag, value in scalars.items()] +
        [tf.raw_ops.HistogramSummary(tag=tag, values=value)
         for tag, value in histograms.items()])


TrainRun = collections.namedtuple('TrainRun', [
    'train_dir',   # str
    'lock',        # the open lock file: held until the process ends
    'checkpoint',  # str, the checkpoint to restore, or None to start from step 0
    'start_step',  # int, its global step
    'kept',        # the checkpoints the Saver rotates, oldest first
])


def start(exit_stack, train_dir, data_dir, max_steps, synthetic=False, data_url=None,
          data_md5=None, fresh=False, data_input=cifar10_input):
  """Checks, lock and resume point: everything that can stop a run before it starts.

  Nothing is created or moved until every check has passed: a run that cannot
  start leaves no directory behind. The lock on train_dir is released when
  exit_stack (a contextlib.ExitStack) closes. data_input: the data set's input
  module, whose prepare() downloads and checks the files.

  Returns:
    a TrainRun, or None when train_dir's checkpoint is already at max_steps.
  """
  training_run.check_train_dir(train_dir)
  lock = None
  if os.path.isdir(train_dir):  # before reading its checkpoints
    lock = exit_stack.enter_context(training_run.lock_train_dir(train_dir))
  checkpoint, start_step, kept, notes = (
      (None, 0, [], []) if fresh else training_run.checkpoint_to_resume(train_dir))
  for note in notes:
    print(note)
  if start_step >= max_steps:
    print('%s is at step %d, not below --max_steps=%d: nothing to do. Raise --max_steps '
          'to train further.' % (checkpoint, start_step, max_steps))
    return None
  if not synthetic:
    data_input.prepare(data_dir, data_url, data_md5)
  if lock is None:
    training_run.make_train_dir(train_dir)
    lock = exit_stack.enter_context(training_run.lock_train_dir(train_dir))
  if fresh:  # last of the checks: nothing moves unless the run can start
    training_run.set_aside(train_dir)
  return TrainRun(train_dir, lock, checkpoint, start_step, kept)


def train(train_dir, data_dir, num_gpus, batch_size, max_steps, log_frequency=LOG_FREQUENCY,
          summary_steps=SUMMARY_STEPS, save_every_n_steps=SAVE_EVERY_N_STEPS,
          async_towers=False, synthetic=False, data_url=None, data_md5=None, fresh=False,
          config_options=None, seed=None, stop=None, flag_values=None, dataset='cifar10'):
  """Trains until global step max_steps, resuming from train_dir's latest checkpoint.

  Args:
    dataset: a key of DATASETS: the model and the input.
    seed: int >= 0 for a run that repeats exactly (see input_pipeline), or None.
    stop: a training_run.StopSignals, or None (tests): when it is requested the
      loop ends after the current step, saves, and training_run.Stopped is raised.
    flag_values: dict, the command line's flags, for the run record.
  """
  data = DATASETS[dataset]
  with contextlib.ExitStack() as exit_stack:  # holds the lock on train_dir
    run = start(exit_stack, train_dir, data_dir, max_steps, synthetic, data_url, data_md5,
                fresh, data.input)
    if run is None:
      return
    devices, num_cpu_devices, where = tower_devices(num_gpus)
    record = run_record(flag_values, seed, devices, run.start_step, data)
    record['data'] = data_read(data.input, data_dir, data_url, data_md5, synthetic)
    print('Run record: %s' % training_run.write_run_record(train_dir, record))
    with tf.Graph().as_default():
      if seed is not None:
        tf.compat.v1.set_random_seed(seed)  # the initial weights
        if any(device.startswith('/gpu') for device in devices):  # CPU kernels repeat as they are
          exit_stack.enter_context(training_run.op_determinism())
      next_batch, input_init = input_pipeline(data_dir, num_gpus, batch_size, synthetic,
                                              seed, run.start_step, data.input)
      graph = build_train_graph(next_batch, devices, batch_size, async_towers,
                                summaries=summary_steps > 0, model=data.model)
      print_start(graph, where, num_gpus, batch_size, async_towers,
                  'synthetic' if synthetic else data_dir, seed)
      config = session_config(num_cpu_devices, **(config_options or {}))
      with open_session(run, config, input_init) as (sess, saver):
        loop(sess, saver, graph, run, max_steps, log_frequency, summary_steps,
             save_every_n_steps, stop or NEVER, record)


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


def run_record(flag_values, seed, devices, start_step, data):
  """What this run used: flags, every constant of the trainer, model and reader.

  Constants are read when the run starts, so a constant edited between two runs
  shows in their records.
  """
  return collections.OrderedDict([
      ('command', ' '.join(sys.argv)),
      ('started', datetime.datetime.now().isoformat(timespec='seconds')),
      ('start_step', start_step),
      ('seed', seed),
      ('flags', flag_values or {}),
      ('constants', {
          'multi_gpu_train.py': training_run.constants_of(sys.modules[__name__]),
          '%s/model.py' % data.model.__name__: training_run.constants_of(data.model),
          '%s.py' % data.input.__name__: training_run.constants_of(data.input)}),
      ('tensorflow', tf.__version__),
      ('devices', devices),
  ])


def data_read(data_input, data_dir, data_url, data_md5, synthetic):
  """What the run reads, for its record: the directory and which copy, not only the
  official URL that the input module's constants name."""
  if synthetic:
    return 'synthetic'
  source = collections.OrderedDict(data_dir=os.path.abspath(data_dir))
  if data_md5:
    source['copy'] = 'your own archive, md5 %s (--data_md5)' % data_md5
  else:
    source['url'] = data_url or data_input.DATA_URL
  return source


def print_start(graph, where, num_gpus, batch_size, async_towers, source, seed=None):
  """The start-up lines: devices, global batch, parameters, learning-rate schedule."""
  num_params = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
  print('TensorFlow %s; %s' % (tf.__version__, where))
  print('global batch %d = %d x %d towers%s; %d trainable parameters' % (
      batch_size * num_gpus, batch_size, num_gpus,
      ' (async: each update applies %d)' % batch_size if async_towers else '', num_params))
  print('decay_steps %d = %d examples / %d per update x %g epochs; input: %s%s' % (
      graph['decay_steps'], graph['model'].NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
      graph['examples_per_update'], graph['model'].NUM_EPOCHS_PER_DECAY, source,
      '' if seed is None else '; seed %d: this run repeats exactly' % seed))
  print(schedule_line(graph['model'], graph['decay_steps']))


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
    (session, Saver that continues the rotation of run.kept).
  """
  saver = training_run.make_saver(tf.compat.v1.global_variables())
  init = tf.compat.v1.global_variables_initializer()
  with tf.compat.v1.Session(config=config) as sess:
    if run.checkpoint:
      try:
        saver.restore(sess, run.checkpoint)
      except (tf.errors.OpError, ValueError) as e:
        raise TrainingError('cannot restore %s into this model: %s Use another '
                            '--train_dir, or --fresh to start over.'
                            % (run.checkpoint, training_run.restore_error(e))) from None
      print('Resuming from %s at step %d' % (run.checkpoint, run.start_step))
    else:
      sess.run(init)
      print('Starting from step 0 in %s' % run.train_dir)
    sess.run(input_init)
    sys.stdout.flush()
    yield sess, saver


class _Never:
  requested = False


NEVER = _Never()  # the stop signal of a run nobody can interrupt (tests)


def loop(sess, saver, graph, run, max_steps, log_frequency, summary_steps,
         save_every_n_steps, stop, record):
  """The step loop: run, check, log, summarise, save; then the last save."""
  train_ops, loss, global_step = graph['train_ops'], graph['loss'], graph['global_step']
  async_towers = len(train_ops) > 1
  num_towers = len(graph['tower_losses'])
  all_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                              for v in tf.compat.v1.trainable_variables()])
  # A failed event-file write is said once; training goes on (training_run.SummaryWriter).
  writer = training_run.SummaryWriter(
      run.train_dir, sess.graph if not run.checkpoint else None) if summary_steps else None
  save = functools.partial(_save, sess, saver, all_finite, run.train_dir,
                           graph['model'].__name__)
  if writer:  # runs compared side by side in TensorBoard say what differed
    writer.add_summary(training_run.text_summary('run_record', record), run.start_step)

  # Async: towers 1.. run in threads; the loop below runs tower 0 and logs.
  # Every applied update takes one from this budget, so async towers together
  # stop exactly at max_steps.
  take_update = _update_budget(max_steps - run.start_step)
  halt, failures, threads = threading.Event(), [], []
  updates_by_tower = [0] * len(train_ops)
  for i, op in enumerate(train_ops[1:], 1):
    threads.append(threading.Thread(target=_run_tower, daemon=True,
                                    args=(sess, op, take_update, halt, failures,
                                          updates_by_tower, i)))
    threads[-1].start()

  step = last_saved = last_summary = run.start_step
  try:
    while not stop.requested and take_update():
      # Summaries describe the variables at `step`, before this update.
      summarize = summary_steps and step % summary_steps == 0
      fetches = [train_ops[0], loss] + ([graph['summary_op']] if summarize else [])
      start_time = time.time()
      results = sess.run(fetches)
      duration = time.time() - start_time
      updates_by_tower[0] += 1
      previous, step = step, (sess.run(global_step) if async_towers else step + 1)

      loss_value = results[1]
      if not np.isfinite(loss_value):
        raise TrainingError(
            'loss is %s at step %d: the model diverged. Lower INITIAL_LEARNING_RATE '
            '(%s/model.py) or --batch_size; %s' % (
                loss_value, step, graph['model'].__name__, _last_checkpoint_note(last_saved)))
      if failures:
        raise failures[0]

      examples_per_sec = (step - previous) * graph['examples_per_update'] / duration
      if step // log_frequency != previous // log_frequency or previous == run.start_step:
        sec_per_batch = duration / ((step - previous) if async_towers else num_towers)
        print('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)' % (
            datetime.datetime.now(), step, loss_value, examples_per_sec, sec_per_batch))
        sys.stdout.flush()
      if summarize:
        _write_summary(writer, results[2], previous, examples_per_sec)
        last_summary = previous

      if step // save_every_n_steps != last_saved // save_every_n_steps:
        last_saved = save(step, last_saved)
  finally:
    halt.set()
    for thread in threads:
      thread.join()
  # The global step, not the loop's count: async towers may have landed a few more.
  step = sess.run(global_step)
  if writer:
    if step != last_summary:  # every run ends with a summary of where it stopped
      _write_summary(writer, sess.run(graph['summary_op']), step, None)
    writer.close()
  if step != last_saved:
    save(step, last_saved)
  if stop.requested:
    print('Stopped by %s at step %d%s; rerun the same command to resume.' % (
        stop.name, step, '' if step != run.start_step else ' before any step'))
    raise training_run.Stopped(stop.exit_code)
  if async_towers:
    print('updates applied per tower: %s; global step %d' % (', '.join(
        'tower_%d %d' % (i, n) for i, n in enumerate(updates_by_tower)), step))


def _write_summary(writer, summary, step, examples_per_sec):
  writer.add_summary(summary, step)
  if examples_per_sec is not None:
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag='examples_per_sec', simple_value=examples_per_sec)]), step)


def _last_checkpoint_note(last_saved):
  if last_saved:
    return 'the last checkpoint, step %d, is untouched.' % last_saved
  return 'no checkpoint was written.'


def _save(sess, saver, all_finite, train_dir, model_name, step, last_saved):
  """Writes model.ckpt-<step> unless a variable is NaN; returns step."""
  if not sess.run(all_finite):
    raise TrainingError(
        'a variable became NaN or infinite by step %d: the model diverged. Lower '
        'INITIAL_LEARNING_RATE (%s/model.py); %s'
        % (step, model_name, _last_checkpoint_note(last_saved)))
  print('Saved checkpoint %s' % training_run.save_checkpoint(sess, saver, train_dir, step,
                                                             KEEP_CHECKPOINTS))
  sys.stdout.flush()
  return step


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
  apply_dataset_defaults()
  check_flags()
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # our own lines say it
  try:
    train(FLAGS.train_dir, FLAGS.data_dir, FLAGS.num_gpus, FLAGS.batch_size,
          FLAGS.max_steps, log_frequency=FLAGS.log_frequency,
          summary_steps=FLAGS.summary_steps, save_every_n_steps=FLAGS.save_every_n_steps,
          async_towers=FLAGS.async_towers,
          synthetic=FLAGS.synthetic, data_url=FLAGS.data_url, data_md5=FLAGS.data_md5,
          fresh=FLAGS.fresh,
          config_options=dict(log_device_placement=FLAGS.log_device_placement,
                              allow_growth=FLAGS.allow_growth,
                              gpu_memory_fraction=FLAGS.gpu_memory_fraction,
                              intra_op_threads=FLAGS.intra_op_threads,
                              inter_op_threads=FLAGS.inter_op_threads),
          seed=FLAGS.seed, stop=stop, dataset=FLAGS.dataset,
          flag_values={flag.name: flag.value
                       for flag in FLAGS.get_flags_for_module(sys.argv[0])})
  except (TrainingError, cifar10_input.DataError) as e:
    sys.exit('error: %s' % e)
  except training_run.Stopped as e:  # train() has saved and said so
    sys.exit(e.exit_code)
  except KeyboardInterrupt:  # a second signal: stop now, without saving
    sys.exit('Stopped by a second %s without saving; the last checkpoint in %s is '
             'untouched.' % (stop.name, FLAGS.train_dir))


if __name__ == '__main__':
  training_run.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
