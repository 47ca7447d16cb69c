"""Everything that can stop a run before its first step, and the lines it starts with.

The checks, in the order a run meets them: --train_dir and its lock, bfloat16 units
for --use_bf16, the checkpoint to resume (or nothing to do), the data downloaded and
checked; then, once the graph is built, whether one step fits in memory
(check_memory). A step too large for the machine does not fail: it swaps, stalls,
and is killed by the kernel's OOM killer minutes later (exit 137), with no line
saying why and no chance for a SIGTERM to be acted on. So both trainers ask first:

    estimate = estimate_step_bytes(fetches)     # from the graph's static shapes
    check_step_fits(estimate, machine.memory_available(), batch_size, num_towers)

and a step that cannot fit stops the run with one line:

    error: one step at --batch_size=100000 x 1 towers needs about 124.3 GB of memory
    (activations and gradients, estimated from the graph), and this machine has
    21.3 GB available. Lower --batch_size.
"""
import collections
import contextlib

import numpy as np
import tensorflow as tf

from training import checkpoints, machine, placement
from training import directory, storage
from training import input_data
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
  check_data_dir(settings)  # before the lock, which writes into an existing train_dir
  check_precision(settings)
  locked = False
  if storage.isdir(train_dir):  # before reading its checkpoints
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
  check_data_dir(settings)  # dist_train.py's workers and launcher start here
  if not settings.synthetic:
    with stop.raising() if stop else contextlib.nullcontext():
      data_input.prepare(settings.data_dir, settings.data_url, settings.data_md5,
                         input_data.Deadlines(settings.download_timeout_secs,
                                             settings.download_stall_secs))


def check_data_dir(settings):
  """A --data_dir of a scheme TensorFlow lacks (s3://), or of a missing bucket: a
  TrainingError in one line (storage.check); nothing with --synthetic."""
  if not settings.synthetic:
    storage.check(settings.data_dir, '--data_dir')


def check_precision(settings):
  """--use_bf16 where the towers' devices have no bfloat16 units: a TrainingError, as
  bfloat16 runs there slower than float32, not faster."""
  if settings.use_bf16:
    units = machine.bfloat16_units_here(settings.num_gpus)
    if not units.ok:
      raise TrainingError('--use_bf16: %s. Drop --use_bf16 to train in float32.'
                          % units.what)


def nothing_to_do(checkpoint, step, max_steps):
  """The line of a run whose checkpoint is already at max_steps (both trainers)."""
  return ('%s is at step %d, not below --max_steps=%d: nothing to do. Raise --max_steps '
          'to train further.' % (checkpoint, step, max_steps))


def check_memory(fetches, settings):
  """Stops the run in one line when one step cannot fit in the memory available:
  a step too large is otherwise killed by the kernel minutes later, without a word."""
  # The host's share: on GPUs the activations live in GPU memory, and running out
  # of that fails at once and by name (check_step_fits).
  estimate = estimate_step_bytes(fetches, 'CPU')
  check_step_fits(estimate, machine.memory_available(),
                               settings.batch_size, settings.num_gpus)


def print_versions(where, session):
  """The first start-up lines: TensorFlow, where the towers run, oneDNN, the threads
  (session: the run's placement.SessionOptions)."""
  print('TensorFlow %s; %s' % (tf.__version__, where))
  print(machine.start_line())
  print(placement.threads_line(session))


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


# ---- Will one step fit in memory? -------------------------------------------------
USED_SHARE_OF_COUNTED = 0.6   # of what estimate_step_bytes counts (every tensor alive at
                              # once), the share a step uses: above every share measured
                              # (docs/faults.md), so no step is said to need less than it does

# Ops whose output is their input's buffer seen another way: no new memory.
VIEWS = frozenset(['Identity', 'IdentityN', 'Reshape', 'ExpandDims', 'Squeeze',
                   'StopGradient', 'PreventGradient', 'EnsureShape'])
# Ops whose output is a variable's own buffer, counted once at the variable.
VARIABLE_READS = frozenset(['ReadVariableOp'])
VARIABLES = frozenset(['VarHandleOp', 'VariableV2', 'Variable'])


def estimate_step_bytes(fetches, device_type=None):
  """Bytes one run of `fetches` needs, from the graph's static shapes: upper-ish.

  Counts, over the ops that one sess.run(fetches) runs (the fetches and everything
  they depend on, data and control inputs; with a tf.Graph, every op in it):
    - every output of a numeric dtype (float, int, bool) whose shape is fully
      defined, elements x dtype size: the forward activations, the gradients,
      the gradient average, the losses;
    - every variable once, at its own size; its reads are not counted again;
  and does not count: views of another tensor (Identity, Reshape, ExpandDims,
  Squeeze; VIEWS), resource handles, strings, and outputs whose shape is not
  fully defined (a batch dimension of None counts nothing).

  It is an upper-ish estimate of what the step allocates: TensorFlow frees a
  forward activation once the backward pass has used it, so not everything
  counted here is alive at once; and it leaves out what no graph shows: the
  session's runtime, its thread pools, and the scratch memory of kernels (a
  convolution's workspace). On a CPU it counts more than a step's measured rise in
  peak memory, never less (docs/faults.md, "A step too large for memory", gives the
  table).

  Args:
    fetches: a tf.Graph, or a list of tf.Operation / tf.Tensor (the train op,
      the loss, the summary op: what the step loop passes to sess.run).
    device_type: None counts every op; 'CPU' or 'GPU' only the ops placed on a
      device of that type. An op with no device counts as CPU: in the trainers
      every op of a tower is placed, and what is not runs on the host.

  Returns:
    int, bytes.
  """
  if isinstance(fetches, tf.Graph):
    ops = fetches.get_operations()
  else:
    ops = _ops_run_by(fetches)
  total = 0
  for op in ops:
    if device_type is not None and _device_type(op) != device_type.upper():
      continue
    if op.type in VARIABLES:
      total += variable_bytes(op)
    elif op.type not in VIEWS and op.type not in VARIABLE_READS:
      total += sum(_bytes(t.shape, t.dtype) for t in op.outputs)
  return total


def _ops_run_by(fetches):
  """The ops one sess.run(fetches) runs: the fetches and all they depend on."""
  graph = tf.compat.v1.get_default_graph()
  # as_graph_element: a tensor, an op, or what stands for one (a resource
  # variable's assign, which SyncReplicasOptimizer's train op is).
  found, todo = set(), [getattr(element, 'op', element) for element in
                        (graph.as_graph_element(f) for f in fetches if f is not None)]
  while todo:
    op = todo.pop()
    if op not in found:
      found.add(op)
      todo.extend(t.op for t in op.inputs)
      todo.extend(op.control_inputs)
  return sorted(found, key=lambda op: op.name)


def _device_type(op):
  return (tf.DeviceSpec.from_string(op.device).device_type or 'CPU').upper()


def variable_bytes(op):
  """The bytes of the variable an op of VARIABLES makes (from its attributes); 0 for
  any other op (replica_device_setter also places hash tables on the ps tasks)."""
  if getattr(op, 'type', None) not in VARIABLES:
    return 0
  return _bytes(tf.TensorShape(op.get_attr('shape')), op.get_attr('dtype'))


def _bytes(shape, dtype):
  """Elements x bytes per element; 0 for a shape not fully defined or a non-numeric dtype."""
  dtype = tf.as_dtype(dtype).base_dtype
  if not (dtype.is_floating or dtype.is_integer or dtype.is_bool or dtype.is_complex):
    return 0  # resource handles, variants, strings: no fixed size per element
  if shape.rank is None or not shape.is_fully_defined():
    return 0
  return shape.num_elements() * dtype.size


def check_step_fits(estimate_bytes, available_bytes, batch_size, num_towers):
  """Stops the run, in one line, when one step cannot fit in the memory available.

  The step needs about USED_SHARE_OF_COUNTED x estimate_bytes; refused when that
  is more than available_bytes. With available_bytes None (not Linux) it checks
  nothing.

  On GPUs: pass the host's share only, estimate_step_bytes(fetches, 'CPU'),
  against memory_available(). The towers' activations then live in GPU memory,
  which this host figure does not describe, and running out of it fails fast
  and by name (TensorFlow's ResourceExhaustedError in the first step), not by a
  silent stall until the OOM killer comes, which is what this check is for. A
  GPU check would compare estimate_step_bytes(fetches, 'GPU') / num_towers with
  one GPU's free memory.

  Args:
    estimate_bytes: int, from estimate_step_bytes.
    available_bytes: int or None, from memory_available.
    batch_size: int, images per tower (the --batch_size flag).
    num_towers: int (the --num_gpus flag).

  Raises:
    TrainingError: naming the batch, the estimate and what is available.
  """
  needed = int(USED_SHARE_OF_COUNTED * estimate_bytes)
  if available_bytes is None or needed <= available_bytes:
    return
  raise TrainingError(
      'one step at --batch_size=%d x %d towers needs about %s of memory (activations and '
      'gradients, estimated from the graph), and this machine has %s available. Lower '
      '--batch_size%s.' % (batch_size, num_towers, _size(needed),
                           _size(available_bytes), ' or --num_gpus' if num_towers > 1 else ''))


def _size(num_bytes):
  """61200000000 -> '61.2 GB'; below 1 GB in MB."""
  if num_bytes >= 1e9:
    return '%.1f GB' % (num_bytes / 1e9)
  return '%.0f MB' % (num_bytes / 1e6)
