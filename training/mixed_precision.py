"""Mixed precision for the towers: float16 or bfloat16 compute over float32 weights.

The weights stay float32 (variables, moving averages, checkpoints). Each tower
reads them through a custom getter (float16_getter, bfloat16_getter) that hands
the model casts to the towers' dtype, so the convolutions and matmuls run in it;
the models keep LRN, the cross-entropy and the weight decay in float32. The
gradients leave the tower as float32 (the gradient of a cast is a cast back).

bfloat16 (--use_bf16) has float32's exponent range: nothing underflows that
float32 would keep, so there is no loss scale, and its checkpoints are a float32
run's. It is fast only on bfloat16 units (bfloat16_units): x86 CPUs with
AVX512_BF16 or AMX, through oneDNN, and GPUs of compute capability 8.0 or more.

float16 (--use_fp16) gradients underflow to zero below 6e-8, so each tower's loss is
multiplied by the loss scale before its gradients are taken, and the averaged
gradients are divided by it once. A step whose averaged gradients hold inf or
NaN is skipped (variables, moving averages and global step untouched) and the
scale halves; after LOSS_SCALE_PERIOD clean steps in a row it doubles. The
scale and its two counts (clean steps in a row, steps skipped) are variables,
saved in the checkpoint. A skipped step still consumed a batch: a run resuming
its seeded input starts at global step + skipped steps (checkpoint_skipped_steps).

In the trainer's graph (sync towers; bfloat16: no loss_scale, nothing after the average):

    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                     custom_getter=mixed_precision.cast_getter(dtype)):
      for i, device in ...:                              # the tower loop
        images = tf.cast(images, dtype)                  # tf.float16 or tf.bfloat16
        loss = tower_loss(scope, images, labels, model)  # float32, unscaled
        grads = opt.compute_gradients(mixed_precision.scale_loss(loss, loss_scale))
    grads, all_finite = mixed_precision.unscale_and_check(average_gradients(tower_grads),
                                                          loss_scale)
    update = mixed_precision.apply_or_skip(apply_fn, all_finite, loss_scale)

dist_train.py keeps the scale on the ps, shared by the workers: each worker
step reads it once (read_once) and scales and unscales with that snapshot.
Async workers pass it to apply_or_skip, which then halves from the snapshot and
writes the scale only on a skip or a doubling; sync, the chief's queue runner
checks the aggregated gradient (all_finite) and calls apply_or_skip without one.

tf_cnn_benchmarks does the same (float32 storage getter, loss scaling); the
legacy tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer unscales
each tower's gradients separately and leaves the moving averages outside its
skip, so it is not used here.
"""
import collections

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2  # RewriterConfig's enums

from training import machine

# ---- Loss-scale knobs ------------------------------------------------------
INITIAL_LOSS_SCALE = 2.0 ** 15    # 32768: the loss is multiplied by this at step 0
LOSS_SCALE_PERIOD = 2000          # clean steps in a row after which the scale doubles
MIN_LOSS_SCALE = 1.0              # halving on overflow stops here
LOSS_SCALE_SCOPE = 'loss_scale'   # variable scope of the loss scale's variables

# ---- Where bfloat16 is fast: GPUs bfloat16_units accepts (CPUs: machine.BFLOAT16_FLAGS)


def float16_getter(getter, name, *args, **kwargs):
  """Custom getter: creates (or reuses) the variable as float32, returns a float16 cast.

  Pass as variable_scope(..., custom_getter=float16_getter) around the towers.
  Every tower reads the one float32 variable through its own cast, named
  <layer>/<variable>_float16 beside the variable (tower i > 0 adds _i: the variable
  store builds it outside the tower's name scope); the gradient flows back through
  the cast as float32.

  The models, which import nothing of this package, take their weight decay on
  the float32 read this cast is made from: the Cast op's input (_float32_value
  in cifar10/model.py and mnist/model.py). Keep the result one tf.cast of the
  float32 variable, or they raise a TypeError.

  Returns:
    float16 tensor of the variable's shape.
  """
  return _cast_of_float32(getter, name, tf.float16, *args, **kwargs)


def bfloat16_getter(getter, name, *args, **kwargs):
  """float16_getter for bfloat16 towers (--use_bf16): the same one tf.cast of the
  float32 variable, named <layer>/<variable>_bfloat16.

  Returns:
    bfloat16 tensor of the variable's shape.
  """
  return _cast_of_float32(getter, name, tf.bfloat16, *args, **kwargs)


def _cast_of_float32(getter, name, compute_dtype, *args, **kwargs):
  kwargs['dtype'] = tf.float32
  var = getter(name, *args, **kwargs)
  return tf.cast(var, compute_dtype, name='%s_%s' % (name, compute_dtype.name))


def compute_dtype(use_fp16, use_bf16):
  """The towers' dtype for the flags: tf.float16, tf.bfloat16, or tf.float32."""
  return tf.float16 if use_fp16 else tf.bfloat16 if use_bf16 else tf.float32


def cast_getter(dtype):
  """The towers' custom getter for compute dtype `dtype`; None (no getter) for float32."""
  return {tf.float16: float16_getter, tf.bfloat16: bfloat16_getter}.get(dtype)


def start_line(use_fp16, num_towers):
  """The start-up line of float16 towers (use_fp16), or of bfloat16 towers: what
  computes them (machine.bfloat16_units_here(num_towers))."""
  if use_fp16:
    return ('float16 towers, float32 variables; dynamic loss scale from %g (a resumed run '
            'keeps its own), doubled after %d clean steps, halved on an overflow' % (
                INITIAL_LOSS_SCALE, LOSS_SCALE_PERIOD))
  return ('bfloat16 towers on %s, float32 variables; LRN, softmax and loss in float32; no '
          'loss scale' % machine.bfloat16_units_here(num_towers).what)


LossScale = collections.namedtuple('LossScale', [
    'scale',       # float32 scalar variable, a power of two
    'good_steps',  # int64 scalar variable: clean steps since the last change of scale
    'skipped_steps',  # int64 scalar variable: steps skipped since step 0; each took a batch
    'period',      # int: the scale doubles when good_steps reaches this
])


def make_loss_scale(initial_scale=INITIAL_LOSS_SCALE, period=LOSS_SCALE_PERIOD):
  """Creates the loss scale's variables: loss_scale/scale, good_steps, skipped_steps.

  Call once, where the shared variables live (the trainer's CPU device). Both are
  global and not trainable: the Saver keeps them, the moving averages and the
  variable check of the trainer do not see them.

  Returns:
    LossScale.
  """
  with tf.compat.v1.variable_scope(LOSS_SCALE_SCOPE):
    scale = tf.compat.v1.get_variable(
        'scale', [], tf.float32, tf.compat.v1.constant_initializer(initial_scale),
        trainable=False)
    good_steps = tf.compat.v1.get_variable(
        'good_steps', [], tf.int64, tf.compat.v1.zeros_initializer(), trainable=False)
    skipped_steps = tf.compat.v1.get_variable(
        'skipped_steps', [], tf.int64, tf.compat.v1.zeros_initializer(), trainable=False)
  return LossScale(scale, good_steps, skipped_steps, period)


def scale_loss(loss, loss_scale):
  """One tower's loss times the scale: take the tower's gradients of this.

  Returns:
    float32 scalar, tower_i/scaled_loss. Log and check the unscaled loss.
  """
  return tf.multiply(loss, loss_scale.scale, name='scaled_loss')


def read_once(loss_scale):
  """The scale read once, for a step of workers that share loss_scale (dist_train.py).

  Other workers may change the shared scale while this step runs; every tower
  scales its loss by this one value, and unscale_and_check divides by it, so the
  gradient that leaves the worker is right whatever the others did meanwhile.

  Returns:
    LossScale whose scale is a float32 scalar tensor, loss_scale/snapshot.
  """
  return loss_scale._replace(scale=tf.identity(loss_scale.scale, name='snapshot'))


def bfloat16_in_a_cluster(config):
  """Turns grappler's remapper off in a distributed worker's ConfigProto, for --use_bf16.

  The remapper fuses a convolution with its bias (and ReLU) into _FusedConv2D, whose
  bfloat16 kernel is oneDNN's, which TensorFlow's oneDNN pass substitutes in a local
  session. A worker of a cluster gets the fused op but not the substitution: every
  CIFAR-10 step failed, `Value for attr 'T' of bfloat16 is not in the list of allowed
  values` (TensorFlow 2.21, AVX512_BF16, 2026-12-02; MNIST has no convolution). Without
  the fusion the convolutions, biases and ReLUs run as oneDNN's own bfloat16 ops.
  """
  config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF


def all_finite(grads_and_vars):
  """bool scalar: False when any gradient holds inf or NaN."""
  return tf.reduce_all(
      tf.stack([tf.reduce_all(tf.math.is_finite(grad)) for grad, _ in grads_and_vars]),
      name='all_finite')


def unscale_and_check(grads_and_vars, loss_scale):
  """Divides the averaged gradients by the scale and checks them, once per step.

  Args:
    grads_and_vars: list over variables of (float32 gradient of the scaled loss,
      variable), as average_gradients returns it.
    loss_scale: LossScale (or read_once's snapshot of it).

  Returns:
    (grads_and_vars divided by the scale (exact: the scale is a power of two),
     all_finite: bool scalar, False when any gradient holds inf or NaN).
  """
  with tf.name_scope('unscale'):
    inverse = 1.0 / loss_scale.scale
    unscaled = [(grad * inverse, var) for grad, var in grads_and_vars]
    finite = all_finite(unscaled)
  return unscaled, finite


LossScaleUpdate = collections.namedtuple('LossScaleUpdate', [
    'train_op',   # op: the update when all_finite, then the new scale
    'applied',    # bool scalar: this step's update was applied (False: skipped)
    'scale',      # float32 scalar: the scale this step's gradients were taken at
    'new_scale',  # float32 scalar: the scale of the next step
])


def apply_or_skip(apply_fn, all_finite, loss_scale, scale=None):
  """Applies the update only when the gradients are finite, then adjusts the scale.

  Args:
    apply_fn: callable of no arguments returning the update op: apply_gradients
      with the global step, and the moving averages after it. It is built inside
      the true branch of a tf.cond, so a skipped step runs none of it.
    all_finite: bool scalar from unscale_and_check.
    loss_scale: LossScale.
    scale: float32 scalar, the scale this step's gradients were taken at, when
      several workers share loss_scale (read_once's); None: read here, once the
      towers are done with it.

  Returns:
    LossScaleUpdate. On a skipped step the scale halves from `scale` (not below
    MIN_LOSS_SCALE, and never back up past a lower value another worker has set
    meanwhile) and skipped_steps counts it; after loss_scale.period applied steps
    in a row the scale doubles. Only a skip or a doubling writes the scale, so a
    worker's clean step cannot undo another's halving.
  """
  with tf.name_scope('apply_or_skip'):
    if scale is None:
      # Read after every tower has used the scale, so that the assigns below
      # cannot overtake any of their reads.
      with tf.control_dependencies([all_finite]):
        scale = tf.identity(loss_scale.scale, name='scale')
    # The branches run once the scale is read: a doubling cannot overtake the read
    # and report its own result as the scale this step was taken at.
    with tf.control_dependencies([scale]):
      all_finite = tf.identity(all_finite, name='all_finite')

    def apply():
      with tf.control_dependencies([apply_fn()]):
        # Atomic on the variable: of workers applying at once, one reaches period.
        good_steps = loss_scale.good_steps.assign_add(1, read_value=True)

      def double():
        with tf.control_dependencies([loss_scale.good_steps.assign(0)]):
          return loss_scale.scale.assign(loss_scale.scale * 2.0, read_value=True)

      new_scale = tf.cond(good_steps >= loss_scale.period, double,
                          lambda: tf.identity(loss_scale.scale))
      return tf.constant(True), new_scale

    def skip():
      new_scale = tf.minimum(loss_scale.scale, tf.maximum(scale * 0.5, MIN_LOSS_SCALE))
      with tf.control_dependencies([loss_scale.scale.assign(new_scale),
                                    loss_scale.good_steps.assign(0),
                                    loss_scale.skipped_steps.assign_add(1)]):
        return tf.constant(False), tf.identity(new_scale)

    applied, new_scale = tf.cond(all_finite, apply, skip, name='applied')
    train_op = tf.group(applied, new_scale, name='train_op')
  return LossScaleUpdate(train_op, applied, scale, new_scale)


def restore(sess, checkpoint_path, var_list):
  """Restores var_list from a checkpoint of a float32 or a mixed-precision run.

  A float32 run's checkpoint has no loss_scale/ variables: those start at their
  initial values instead. Any other variable missing still fails the restore.
  (The reverse needs nothing: a float32 graph's Saver ignores loss_scale/.)

  Args:
    sess: tf.compat.v1.Session of the graph holding var_list.
    checkpoint_path: str, a checkpoint prefix (model.ckpt-1000).
    var_list: the variables the trainer saves, tf.compat.v1.global_variables().

  Returns:
    list of str: the loss-scale variables initialised instead of restored,
    empty when the checkpoint had them.
  """
  return restorer(var_list)(sess, checkpoint_path)


def restorer(var_list):
  """restore(), its ops built now: for a graph finalized before it restores
  (dist_train.py's chief, under MonitoredSession).

  Returns:
    callable (sess, checkpoint_path) -> what restore() returns.
  """
  loss_scale = [v for v in var_list if v.op.name.startswith(LOSS_SCALE_SCOPE + '/')]
  names = {v.op.name for v in loss_scale}
  others = tf.compat.v1.train.Saver([v for v in var_list if v.op.name not in names])
  # Per loss-scale variable: its restore, or its initial value.
  each = [(v.op.name, tf.compat.v1.train.Saver([v]), v.initializer) for v in loss_scale]

  def restore_fn(sess, checkpoint_path):
    in_checkpoint = {name for name, _ in tf.train.list_variables(checkpoint_path)}
    others.restore(sess, checkpoint_path)
    for name, saver, initializer in each:
      if name in in_checkpoint:
        saver.restore(sess, checkpoint_path)
      else:
        sess.run(initializer)
    return sorted(names - in_checkpoint)
  return restore_fn


def checkpoint_skipped_steps(checkpoint_path):
  """Steps a checkpoint's run skipped: 0 for a float32 run's, or no checkpoint (None).

  A seeded input resumes at global step + this, the batches the run consumed.
  """
  if not checkpoint_path:
    return 0
  reader = tf.train.load_checkpoint(checkpoint_path)
  name = LOSS_SCALE_SCOPE + '/skipped_steps'
  return int(reader.get_tensor(name)) if reader.has_tensor(name) else 0


