"""Everything that can stop a run before its first step, and the lines it starts with."""
import collections
import contextlib
import os

import numpy as np
import tensorflow as tf

from training import checkpoints
from training import directory
from training import input_data
from training import memory_check
from training import mixed_precision
from training import onednn
from training import updates
from training.errors import TrainingError


TrainRun = collections.namedtuple('TrainRun', [
    'train_dir',   # str
    'checkpoint',  # str, the checkpoint to restore, or None to start from step 0
    'start_step',  # int, its global step
])


def start(exit_stack, settings, data_input, stop_when_done=True, stop=None):
  """Checks, lock and resume point: everything that can stop a run before it starts.

  Nothing is created until every check has passed: a run that cannot start
  leaves no directory behind. (--fresh moves the old files once the graph is
  built and its step known to fit in memory.) The lock on train_dir is released
  when exit_stack (a contextlib.ExitStack) closes. data_input: the data set's
  input module, whose prepare() downloads and checks the files. Both trainers
  start here (dist_train.py's chief; its other workers only prepare the data).
  stop: the run's signals.StopSignals, or None: a Ctrl-C or SIGTERM during the
  download stops it at once (signals.Interrupted), its partial file removed.

  Returns:
    a TrainRun, or None when train_dir's checkpoint is already at max_steps and
    stop_when_done (dist_train.py's chief goes on, to tell the ps tasks it is done).
  """
  train_dir = settings.train_dir
  directory.check_train_dir(train_dir)
  check_precision(settings)
  locked = False
  if os.path.isdir(train_dir):  # before reading its checkpoints
    exit_stack.enter_context(directory.lock_train_dir(train_dir))
    locked = True
  checkpoint, start_step, notes = (
      (None, 0, []) if settings.fresh else checkpoints.checkpoint_to_resume(train_dir))
  for note in notes:
    print(note)
  if start_step >= settings.max_steps and stop_when_done:
    print(nothing_to_do(checkpoint, start_step, settings.max_steps))
    return None
  prepare_data(settings, data_input, stop)
  if not locked:
    directory.make_train_dir(train_dir)
    exit_stack.enter_context(directory.lock_train_dir(train_dir))
  return TrainRun(train_dir, checkpoint, start_step)


def prepare_data(settings, data_input, stop=None):
  """The data set downloaded if missing, and checked, within --download_timeout_secs
  and --download_stall_secs; nothing with --synthetic. stop (a StopSignals, or None):
  a Ctrl-C or SIGTERM meanwhile stops the download at once (signals.Interrupted)."""
  if not settings.synthetic:
    with stop.raising() if stop else contextlib.nullcontext():
      data_input.prepare(settings.data_dir, settings.data_url, settings.data_md5,
                         input_data.Deadlines(settings.download_timeout_secs,
                                             settings.download_stall_secs))


def check_precision(settings):
  """--use_bf16 where the towers' devices have no bfloat16 units: a TrainingError, as
  bfloat16 runs there slower than float32, not faster."""
  if settings.use_bf16:
    units = mixed_precision.bfloat16_units_here(settings.num_gpus)
    if not units.ok:
      raise TrainingError('--use_bf16: %s. Drop --use_bf16 to train in float32.'
                          % units.what)


def nothing_to_do(checkpoint, step, max_steps):
  """The line of a run whose checkpoint is already at max_steps (both trainers)."""
  return ('%s is at step %d, not below --max_steps=%d: nothing to do. Raise --max_steps '
          'to train further.' % (checkpoint, step, max_steps))


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


def print_versions(where):
  """The first start-up lines: TensorFlow, where the towers run, oneDNN."""
  print('TensorFlow %s; %s' % (tf.__version__, where))
  print(onednn.start_line())


def num_parameters():
  return sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())


def print_schedule(decay_steps, epoch, examples_per_update, per, model, settings):
  """The schedule's lines: decay_steps as computed, then the learning rate whole.

  per: what one update is called ('update', 'worker step').
  """
  print('decay_steps %d = %d examples (%s) / %d per %s x %g epochs; input: %s%s' % (
      decay_steps, epoch.count, epoch.source, examples_per_update, per,
      model.NUM_EPOCHS_PER_DECAY, 'synthetic' if settings.synthetic else settings.data_dir,
      '' if settings.seed is None else '; seed %d: this run repeats exactly' % settings.seed))
  print(updates.schedule_line(model, decay_steps))
