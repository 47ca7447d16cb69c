"""training/mixed_precision.py, in graphs built here: float16 and bfloat16 towers over
float32 weights, the loss scale, the checkpoints, where bfloat16 units are.

The towers run on virtual CPU devices; the CPU computes float16 slowly, so the
batches are tiny. The toy run measures that float16 learns:

    python -m pytest tests/test_mixed_precision.py -q -s -k toy_run

multi_gpu_train.py trained with --use_fp16 and --use_bf16: tests/test_trainer_precision.py.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf

import cifar10
from training import mixed_precision, machine
import mnist
import multi_gpu_train
from multi_gpu_train import average_gradients, tower_loss

NUM_TOWERS = 2
CONFIG = tf.compat.v1.ConfigProto(device_count={'CPU': NUM_TOWERS})  # /cpu:0, /cpu:1
# Fresh-model loss of main before this feature, seed 1, 4 images of _images(1, 4):
# the float32 graph must still compute exactly this.
FLOAT32_FRESH_LOSS = 4.6818318367004395

Step = collections.namedtuple('Step', [
    'images', 'labels',  # placeholders of the global batch, split over the towers
    'loss',              # float32 scalar: mean of the towers' unscaled losses
    'cross_entropy',     # float32 scalar: mean of the towers' cross-entropies
    'train_op',
    'update',            # mixed_precision.LossScaleUpdate, or None in float32
    'loss_scale',        # mixed_precision.LossScale, or None in float32
    'global_step',
])


def _build(fp16, batch_size, model=cifar10, initial_scale=mixed_precision.INITIAL_LOSS_SCALE,
           period=mixed_precision.LOSS_SCALE_PERIOD, lr=0.1):
  """The trainer's synchronous step in miniature: towers, average, (unscale,) apply."""
  shape = [batch_size * NUM_TOWERS] + ([24, 24, 3] if model is cifar10 else [784])
  images = tf.compat.v1.placeholder(tf.float32, shape, name='images')
  labels = tf.compat.v1.placeholder(tf.int32, [batch_size * NUM_TOWERS], name='labels')
  global_step = tf.compat.v1.train.get_or_create_global_step()
  opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
  loss_scale = mixed_precision.make_loss_scale(initial_scale, period) if fp16 else None

  tower_grads, tower_losses, cross_entropies = [], [], []
  getter = mixed_precision.float16_getter if fp16 else None
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=getter):
    for i in range(NUM_TOWERS):
      with tf.device('/cpu:%d' % i), tf.name_scope('%s_%d' % (model.TOWER_NAME, i)) as scope:
        tower_images = images[i * batch_size:(i + 1) * batch_size]
        if fp16:
          tower_images = tf.cast(tower_images, tf.float16)
        loss = tower_loss(scope, tower_images, labels[i * batch_size:(i + 1) * batch_size],
                          model)
        tf.compat.v1.get_variable_scope().reuse_variables()
        if fp16:
          tower_grads.append(opt.compute_gradients(mixed_precision.scale_loss(loss, loss_scale)))
        else:
          tower_grads.append(opt.compute_gradients(loss))
        tower_losses.append(loss)
        cross_entropies.append(tf.compat.v1.get_default_graph().get_tensor_by_name(
            scope + 'cross_entropy:0'))

  with tf.device('/cpu:0'):
    grads = average_gradients(tower_grads)
    variables = tf.compat.v1.trainable_variables()
    ema = tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY,
                                                      num_updates=global_step)

    def apply_fn():
      apply_op = opt.apply_gradients(grads, global_step=global_step)
      with tf.control_dependencies([apply_op]):
        return tf.group(apply_op, ema.apply(variables))

    update = None
    if fp16:
      grads, all_finite = mixed_precision.unscale_and_check(grads, loss_scale)
      update = mixed_precision.apply_or_skip(apply_fn, all_finite, loss_scale)
      train_op = update.train_op
    else:
      train_op = apply_fn()
  return Step(images, labels, tf.reduce_mean(tower_losses), tf.reduce_mean(cross_entropies),
              train_op, update, loss_scale, global_step)


def _images(seed, n, model=cifar10):
  """n random images and labels; cifar10: standard normal, mnist: pixels 0..255."""
  rng = np.random.default_rng(seed)
  if model is cifar10:
    images = rng.standard_normal((n, 24, 24, 3)).astype(np.float32)
  else:
    images = rng.integers(0, 256, (n, 784)).astype(np.float32)
  return images, rng.integers(0, 10, n).astype(np.int32)


def _values(sess):
  """{name: value} of every global variable: weights, averages, step, loss scale."""
  variables = tf.compat.v1.global_variables()
  return dict(zip([v.op.name for v in variables], sess.run(variables)))


@pytest.mark.parametrize('model', [cifar10, mnist], ids=['cifar10', 'mnist'])
def test_fp16_tower_layers_float16_lrn_loss_decay_float32_variables_float32(model):
  with tf.Graph().as_default() as graph:
    step = _build(fp16=True, batch_size=2, model=model)
    ops = [op for op in graph.get_operations() if op.name.startswith('tower_1/')]
    dtypes = collections.defaultdict(set)
    norm_scopes = ('tower_1/norm1/', 'tower_1/norm2/')
    for op in ops:
      if op.outputs and not op.name.startswith(('tower_1/gradients',) + norm_scopes):
        dtypes[op.type].add(op.outputs[0].dtype)
    grads = [op for op in graph.get_operations() if op.name.startswith('unscale/mul')]
    variables = tf.compat.v1.global_variables()

  compute = {'Conv2D', 'MatMul'} if model is cifar10 else {'MatMul'}
  for op_type in compute:
    assert dtypes[op_type] == {tf.float16}, (op_type, dtypes[op_type])
  if model is cifar10:  # the normalisation runs in float32 from its input's cast on
    norm_ops = [op for op in ops if op.name.startswith(norm_scopes) and op.outputs
                and op.type != 'Cast']
    assert {'MatMul', 'Rsqrt'} <= {op.type for op in norm_ops}
    assert {op.outputs[0].dtype for op in norm_ops
            if op.outputs[0].dtype.is_floating} == {tf.float32}
  assert dtypes['SparseSoftmaxCrossEntropyWithLogits'] == {tf.float32}
  # The weight decay reads the float32 variable, not its float16 cast.
  decay_inputs = [op.inputs[0].op for op in ops if op.type == 'L2Loss']
  assert decay_inputs and all(i.type == 'ReadVariableOp' and i.outputs[0].dtype == tf.float32
                              for i in decay_inputs), [i.type for i in decay_inputs]
  # The gradients leave the tower as float32: average and update see float32.
  assert grads and all(op.outputs[0].dtype == tf.float32 for op in grads)
  # Weights, their averages and the scale float32; the two counters int64.
  assert {v.op.name for v in variables if v.dtype.base_dtype != tf.float32} == {
      'global_step', 'loss_scale/good_steps', 'loss_scale/skipped_steps'}
  assert step.loss.dtype == tf.float32


def test_inference_float32_graph_unchanged_loss_equals_main():
  images, labels = _images(1, 4)
  with tf.Graph().as_default() as graph:
    tf.compat.v1.set_random_seed(1)
    total_loss = cifar10.loss(cifar10.inference(tf.constant(images)), tf.constant(labels))
    float_casts = [op.name for op in graph.get_operations()
                   if op.type == 'Cast' and op.outputs[0].dtype.is_floating]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      value = sess.run(total_loss)
  assert float_casts == []  # no round trip of the LRN or the logits in float32
  assert value == pytest.approx(FLOAT32_FRESH_LOSS, rel=1e-6)


def test_unscale_and_check_float32_towers_gradients_equal_unscaled_exactly():
  """Scaling by a power of two and dividing once on the average is exact in float32."""
  images, labels = _images(2, 2 * NUM_TOWERS)
  grads = {}
  for scale in (1.0, 1024.0):
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(1)
      loss_scale = mixed_precision.make_loss_scale(scale)
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()):
        tower_grads = []
        for i in range(NUM_TOWERS):
          with tf.name_scope('tower_%d' % i) as scope:
            loss = tower_loss(scope, tf.constant(images[2 * i:2 * i + 2]),
                              tf.constant(labels[2 * i:2 * i + 2]))
            tf.compat.v1.get_variable_scope().reuse_variables()
            tower_grads.append(tf.compat.v1.train.GradientDescentOptimizer(0.1)
                               .compute_gradients(mixed_precision.scale_loss(loss, loss_scale)))
      unscaled, all_finite = mixed_precision.unscale_and_check(average_gradients(tower_grads),
                                                               loss_scale)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        grads[scale], finite = sess.run([[g for g, _ in unscaled], all_finite])
      assert finite
  for g1, g1024 in zip(grads[1.0], grads[1024.0]):
    np.testing.assert_array_equal(g1, g1024)


def test_apply_or_skip_gradients_overflow_skips_step_and_halves_scale(tmp_path):
  images, labels = _images(3, 2 * NUM_TOWERS)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    # 2^30 times the logits' gradient (~0.1) overflows float16 (max 65504).
    step = _build(fp16=True, batch_size=2, initial_scale=2.0 ** 30)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = _values(sess)
      _, loss, applied, scale, new_scale = sess.run(
          [step.train_op, step.loss, step.update.applied, step.update.scale,
           step.update.new_scale], {step.images: images, step.labels: labels})
      after = _values(sess)
      path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / 'model.ckpt'))
  assert not applied
  assert np.isfinite(loss) and abs(loss - 4.68) < 0.1  # unscaled: an overflow, not divergence
  assert (scale, new_scale) == (2.0 ** 30, 2.0 ** 29)
  assert after.pop('loss_scale/scale') == 2.0 ** 29
  assert before.pop('loss_scale/scale') == 2.0 ** 30
  assert (before.pop('loss_scale/skipped_steps'), after.pop('loss_scale/skipped_steps')) == (0, 1)
  assert mixed_precision.checkpoint_skipped_steps(path) == 1  # the batch it consumed
  assert after.keys() == before.keys() and 'global_step' in after
  assert len([n for n in after if n.endswith('ExponentialMovingAverage')]) == 10
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_apply_or_skip_period_clean_steps_doubles_scale():
  images, labels = _images(4, 2 * NUM_TOWERS)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    step = _build(fp16=True, batch_size=2, initial_scale=8.0, period=2)
    feed = {step.images: images, step.labels: labels}
    seen = []
    with tf.compat.v1.Session(config=CONFIG) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        _, applied, scale, new_scale = sess.run(
            [step.train_op, step.update.applied, step.update.scale, step.update.new_scale],
            feed)
        seen.append((bool(applied), scale, new_scale,
                     sess.run(step.loss_scale.good_steps), sess.run(step.global_step)))
  assert seen == [(True, 8.0, 8.0, 1, 1), (True, 8.0, 16.0, 0, 2), (True, 16.0, 16.0, 1, 3)]


def test_apply_or_skip_shared_scale_overflow_halves_snapshot_never_raises_others_value():
  """Workers sharing one scale (dist_train.py async): a skip halves from the scale
  its gradients were taken at, keeping a lower value another worker set meanwhile;
  a clean step writes no scale, so it cannot undo another worker's halving."""
  with tf.Graph().as_default():
    loss_scale = mixed_precision.make_loss_scale(1024.0, period=100)
    snapshot = tf.compat.v1.placeholder(tf.float32, [])
    finite = tf.compat.v1.placeholder(tf.bool, [])
    update = mixed_precision.apply_or_skip(tf.no_op, finite, loss_scale, snapshot)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      seen = []
      for scale_now, taken_at, is_finite in [(1024.0, 1024.0, False),  # alone: halves
                                             (512.0, 1024.0, False),   # another halved first
                                             (128.0, 1024.0, False),   # another went lower
                                             (64.0, 1024.0, True)]:    # clean, stale snapshot
        loss_scale.scale.load(scale_now, sess)
        applied, new_scale = sess.run([update.applied, update.new_scale],
                                      {snapshot: taken_at, finite: is_finite})
        seen.append((bool(applied), new_scale, sess.run(loss_scale.scale)))
      counts = sess.run([loss_scale.skipped_steps, loss_scale.good_steps])
  assert seen == [(False, 512.0, 512.0), (False, 512.0, 512.0), (False, 128.0, 128.0),
                  (True, 64.0, 64.0)]
  assert counts == [3, 1]


def _train_and_save(fp16, path, seed, period=mixed_precision.LOSS_SCALE_PERIOD):
  """One step of a fresh float32 or fp16 graph, saved to path; returns the values saved."""
  images, labels = _images(seed, 2 * NUM_TOWERS)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(seed)
    step = _build(fp16, batch_size=2, initial_scale=64.0, period=period)
    saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables())
    with tf.compat.v1.Session(config=CONFIG) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(step.train_op, {step.images: images, step.labels: labels})
      saver.save(sess, path)
      return _values(sess)


def test_restore_float32_checkpoint_into_fp16_graph_starts_loss_scale_fresh(tmp_path):
  saved = _train_and_save(False, str(tmp_path / 'model.ckpt'), seed=5)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(6)  # other initial values: the restore must overwrite them
    _build(True, batch_size=2, initial_scale=64.0)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      fresh = mixed_precision.restore(sess, str(tmp_path / 'model.ckpt'),
                                      tf.compat.v1.global_variables())
      restored = _values(sess)
  assert fresh == ['loss_scale/good_steps', 'loss_scale/scale', 'loss_scale/skipped_steps']
  assert restored.pop('loss_scale/scale') == 64.0
  assert restored.pop('loss_scale/good_steps') == 0
  assert restored.pop('loss_scale/skipped_steps') == 0
  assert mixed_precision.checkpoint_skipped_steps(str(tmp_path / 'model.ckpt')) == 0
  assert restored.keys() == saved.keys() and saved['global_step'] == 1
  for name in saved:
    np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)


def test_restore_fp16_checkpoint_into_float32_fp16_and_eval_graphs_keeps_values(tmp_path):
  path = str(tmp_path / 'model.ckpt')
  saved = _train_and_save(True, path, seed=7, period=1)  # one clean step: the scale doubled
  assert saved['loss_scale/scale'] == 128.0 and saved['global_step'] == 1

  with tf.Graph().as_default():  # the float32 trainer's own restore
    tf.compat.v1.set_random_seed(8)
    _build(False, batch_size=2)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      tf.compat.v1.train.Saver(tf.compat.v1.global_variables()).restore(sess, path)
      as_float32 = _values(sess)
  with tf.Graph().as_default():  # an fp16 run resuming: the scale comes back too
    tf.compat.v1.set_random_seed(8)
    _build(True, batch_size=2, initial_scale=64.0)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      fresh = mixed_precision.restore(sess, path, tf.compat.v1.global_variables())
      as_fp16 = _values(sess)
  with tf.Graph().as_default():  # evaluation.py's restore of the shadow values
    cifar10.inference(tf.zeros([1, 24, 24, 3]))
    ema = tf.compat.v1.train.ExponentialMovingAverage(cifar10.MOVING_AVERAGE_DECAY)
    with tf.compat.v1.Session() as sess:
      tf.compat.v1.train.Saver(ema.variables_to_restore()).restore(sess, path)
      as_eval = _values(sess)

  assert fresh == []
  assert as_fp16.keys() == saved.keys()
  for name in saved:
    np.testing.assert_array_equal(as_fp16[name], saved[name], err_msg=name)
  assert set(as_float32) == set(saved) - {
      'loss_scale/scale', 'loss_scale/good_steps', 'loss_scale/skipped_steps'}
  for name in as_float32:
    np.testing.assert_array_equal(as_float32[name], saved[name], err_msg=name)
  for name in as_eval:  # each variable holds its saved shadow
    np.testing.assert_array_equal(as_eval[name], saved[name + '/ExponentialMovingAverage'],
                                  err_msg=name)


def _toy_run(fp16, steps, init_path, batch_size=8, lr=0.02):
  """SGD on 10 noisy prototype images, towers on /cpu:0 and /cpu:1, from the
  weights at init_path (float32 writes them, fp16 restores them).

  Returns:
    (cross-entropy per step, steps skipped, global step at the end).
  """
  rng = np.random.default_rng(0)
  prototypes = rng.standard_normal((10, 24, 24, 3)).astype(np.float32)
  labels = rng.integers(0, 10, 320).astype(np.int32)
  images = prototypes[labels] + rng.standard_normal((320, 24, 24, 3)).astype(np.float32)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    step = _build(fp16, batch_size, lr=lr)
    applied = step.update.applied if fp16 else tf.constant(True)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      if fp16:
        mixed_precision.restore(sess, init_path, tf.compat.v1.global_variables())
      else:
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, init_path)
      cross_entropies, skipped = [], 0
      for _ in range(steps):
        batch = rng.choice(320, batch_size * NUM_TOWERS, replace=False)
        _, cross_entropy, was_applied = sess.run(
            [step.train_op, step.cross_entropy, applied],
            {step.images: images[batch], step.labels: labels[batch]})
        cross_entropies.append(cross_entropy)
        skipped += not was_applied
      return cross_entropies, skipped, sess.run(step.global_step)


@pytest.mark.slow
def test_fp16_toy_run_two_towers_learns_like_float32(tmp_path):
  """The measurement: 120 steps of 2 x 8 images; about 65 s on 2 cores (float16 on a CPU is slow)."""
  steps = 120
  init_path = str(tmp_path / 'init.ckpt')
  float32, _, _ = _toy_run(False, steps, init_path)
  fp16, skipped, global_step = _toy_run(True, steps, init_path)
  means = {name: [float(np.mean(run[i:i + 10])) for i in range(0, steps, 10)]
           for name, run in (('float32', float32), ('fp16', fp16))}
  for name, curve in means.items():
    print('%-7s cross-entropy, mean of each 10 steps: %s' % (
        name, ' '.join('%.2f' % x for x in curve)))
  print('fp16: %d step(s) skipped, global step %d' % (skipped, global_step))
  assert means['float32'][0] > 2.2 and means['float32'][-1] < 1.8  # it is learnable
  assert means['fp16'][-1] < 1.8
  assert abs(means['fp16'][-1] - means['float32'][-1]) < 0.2
  assert skipped <= 3 and global_step == steps - skipped


# ---- multi_gpu_train.build's own graph, with use_fp16 and with use_bf16 ----------

def test_trainer_fp16_overflow_skips_step_variables_untouched_scale_halved(monkeypatch):
  """multi_gpu_train.build's own graph, one step at a scale that must overflow."""
  monkeypatch.setattr(mixed_precision, 'INITIAL_LOSS_SCALE', 2.0 ** 30)
  images, labels = _images(9, 2 * NUM_TOWERS)
  batches = iter([(images[:2], labels[:2]), (images[2:], labels[2:])])
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    graph = multi_gpu_train.build(lambda: tuple(map(tf.constant, next(batches))),
                                  ['/cpu:0', '/cpu:1'], 2,
                                  cifar10.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, summaries=True,
                                  use_fp16=True)
    with tf.compat.v1.Session(config=CONFIG) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = _values(sess)
      _, loss, (applied, scale, new_scale), _ = sess.run(
          [graph.train_op, graph.loss, list(graph.loss_scale_update[1:]), graph.summary_op])
      after = _values(sess)
  assert not applied and (scale, new_scale) == (2.0 ** 30, 2.0 ** 29)
  assert abs(loss - 4.68) < 0.1  # the loss is fine: only the scaled gradients overflowed
  assert (before.pop('loss_scale/scale'), after.pop('loss_scale/scale')) == (2.0 ** 30,
                                                                              2.0 ** 29)
  assert (before.pop('loss_scale/skipped_steps'), after.pop('loss_scale/skipped_steps')) == (
      0, 1)
  assert after.keys() == before.keys() and len(after) == 22  # 10 weights, 10 averages, ...
  for name in before:  # ... global_step, good_steps
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)


@pytest.mark.parametrize('model', [cifar10, mnist], ids=['cifar10', 'mnist'])
def test_trainer_bf16_graph_towers_bfloat16_lrn_loss_decay_variables_float32(model):
  """multi_gpu_train.build's own graph with use_bf16, and one step of it."""
  images, labels = _images(10, 2 * NUM_TOWERS, model)
  batches = iter([(images[:2], labels[:2]), (images[2:], labels[2:])])
  with tf.Graph().as_default() as graph:
    tf.compat.v1.set_random_seed(1)
    train = multi_gpu_train.build(lambda: tuple(map(tf.constant, next(batches))),
                                  ['/cpu:0', '/cpu:1'], 2,
                                  model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, model,
                                  summaries=True, use_bf16=True)
    ops = [op for op in graph.get_operations() if op.name.startswith('tower_1/')
           and op.outputs and not op.name.startswith('tower_1/gradients')]
    variables = tf.compat.v1.global_variables()
    with tf.compat.v1.Session(config=CONFIG) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = _values(sess)
      _, loss, _ = sess.run([train.train_op, train.loss, train.summary_op])
      after = _values(sess)
  dtypes = collections.defaultdict(set)
  for op in ops:
    dtypes[op.type, op.name.split('/')[1] in ('norm1', 'norm2')].add(op.outputs[0].dtype)
  for op_type in ('Conv2D', 'MatMul') if model is cifar10 else ('MatMul',):
    assert dtypes[op_type, False] == {tf.bfloat16}, (op_type, dtypes[op_type, False])
  if model is cifar10:  # the normalisation's band matmuls and rsqrt in float32
    assert dtypes['MatMul', True] == dtypes['Rsqrt', True] == {tf.float32}
  assert dtypes['SparseSoftmaxCrossEntropyWithLogits', False] == {tf.float32}
  decay_inputs = [op.inputs[0].op for op in ops if op.type == 'L2Loss']
  assert decay_inputs and all(i.type == 'ReadVariableOp' and i.outputs[0].dtype == tf.float32
                              for i in decay_inputs)
  layer = 'conv1' if model is cifar10 else 'layer1'
  cast = graph.get_tensor_by_name('%s/weights_bfloat16_1:0' % layer)  # tower 1's
  assert cast.dtype == tf.bfloat16 and cast.op.inputs[0].dtype == tf.float32
  # float32 variables and no loss scale: what a float32 graph holds, nothing more.
  assert {v.op.name for v in variables if v.dtype.base_dtype != tf.float32} == {'global_step'}
  assert train.loss_scale_update is None and train.update_op is not None
  assert np.isfinite(loss) and (model is mnist or abs(loss - 4.68) < 0.1)
  assert after.pop('global_step') == 1 and before.pop('global_step') == 0
  for name in before:
    assert np.isfinite(after[name]).all() and (after[name] != before[name]).any(), name


# ---- Where bfloat16 units are (elsewhere --use_bf16 is refused) ------------------

def test_bfloat16_units_fake_cpuinfo_without_avx512_bf16_has_none(tmp_path):
  cpuinfo = tmp_path / 'cpuinfo'
  flags = 'processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni%s\n'
  cpuinfo.write_text(flags % '')
  without = machine.cpu_flags(str(cpuinfo))
  cpuinfo.write_text(flags % ' avx512_bf16')
  with_bf16 = machine.cpu_flags(str(cpuinfo))
  units = machine.bfloat16_units
  assert units(False, [], without, True) == (False, 'this CPU has no bfloat16 units (no '
                                             'avx512_bf16 or amx_bf16 in /proc/cpuinfo), and '
                                             'emulated bfloat16 runs slower than float32')
  assert units(False, [], with_bf16, True) == (True, 'this CPU\'s AVX512_BF16 through oneDNN')
  assert units(False, [], {'amx_bf16'}, True).ok
  off = units(False, [], with_bf16, False)
  assert not off.ok and off.what.endswith('turn it on (--onednn=on)')
  # On GPUs, theirs decide: compute capability 8.0 or more, the CPU's flags aside.
  assert units(True, [(8, 0), (8, 6)], without, False) == (
      True, 'GPUs of compute capability 8.0, 8.6')
  assert units(True, [(8, 0), (7, 5)], with_bf16, True) == (
      False, 'GPU 1 has compute capability 7.5, and bfloat16 units came with 8.0 '
      '(--use_fp16 suits it)')
