"""cifar10/: the tutorial's network, its size, names and starting loss; and both model
packages (cifar10/, mnist/) standing alone, under v1 behaviour too."""
import os
import re
import sys

import numpy as np
import tensorflow as tf

import cifar10
import helpers

# TF1 code ported to TF2 starts with disable_v2_behavior(): shapes hold Dimensions,
# variables are ref variables. Each model builds and runs one forward pass in float32
# and under the float16 and bfloat16 getters (imported after the models: they must not
# need it).
V1_BEHAVIOUR_SCRIPT = r'''
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import cifar10
import mnist
from training import mixed_precision

rng = np.random.default_rng(1)
batches = {cifar10: rng.standard_normal((4, 24, 24, 3)), mnist: rng.integers(0, 256, (4, 784))}
for model, batch in batches.items():
  for dtype in (tf.float32, tf.float16, tf.bfloat16):
    with tf.Graph().as_default():
      images = tf.compat.v1.placeholder(tf.float32, batch.shape)
      labels = tf.compat.v1.placeholder(tf.int32, [4])
      getter = mixed_precision.cast_getter(dtype)
      with tf.compat.v1.variable_scope('', custom_getter=getter):
        total_loss = model.loss(model.inference(tf.cast(images, dtype)), labels)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        value = sess.run(total_loss, {images: batch, labels: [0, 1, 2, 3]})
    print('%s %s loss %r' % (model.__name__, dtype.name, float(value)))
'''

IMPORT_SCRIPT = r'''
import sys
import cifar10
import mnist
print(' '.join(sorted(sys.modules)))
'''


def test_inference_trainable_parameters_match_tutorial():
  with tf.Graph().as_default():
    logits = cifar10.inference(tf.zeros([2, 24, 24, 3]))
    shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
  assert logits.shape.as_list() == [2, 10]
  assert shapes == {
      'conv1/weights': [5, 5, 3, 64], 'conv1/biases': [64],
      'conv2/weights': [5, 5, 64, 64], 'conv2/biases': [64],
      'local3/weights': [2304, 384], 'local3/biases': [384],
      'local4/weights': [384, 192], 'local4/biases': [192],
      'softmax_linear/weights': [192, 10], 'softmax_linear/biases': [10]}
  assert sum(int(np.prod(s)) for s in shapes.values()) == 1068298


def test_loss_fresh_model_is_near_4_68_with_weight_decay():
  rng = np.random.default_rng(1)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    images = tf.constant(rng.standard_normal((128, 24, 24, 3)), tf.float32)
    labels = tf.constant(rng.integers(0, 10, 128), tf.int32)
    total_loss = cifar10.loss(cifar10.inference(images), labels)
    weight_decay = tf.add_n(tf.compat.v1.get_collection(cifar10.LOSSES)[:-1])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      total, decay = sess.run([total_loss, weight_decay])
  # Cross-entropy of near-uniform logits is ln(10) = 2.303; the two decayed
  # layers add 0.004 * sum(w^2)/2 over 958,464 weights of stddev ~0.035: ~2.37.
  assert abs(total - 4.68) < 0.04, total
  assert abs(decay - 2.37) < 0.03, decay
  assert abs((total - decay) - np.log(10)) < 0.02


def test_lrn_banded_matmul_equals_tf_nn_lrn_values_and_gradients():
  rng = np.random.default_rng(2)
  x = np.maximum(rng.standard_normal((4, 12, 12, 64)) * 30, 0).astype(np.float32)  # relu'd
  upstream = rng.standard_normal(x.shape).astype(np.float32)
  with tf.Graph().as_default():
    images = tf.constant(x)
    ours = cifar10.model.lrn(images, name='norm1')
    theirs = tf.nn.lrn(images, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)
    grads = [tf.gradients(tf.reduce_sum(out * upstream), images)[0] for out in (ours, theirs)]
    as_float16 = cifar10.model.lrn(tf.constant(x, tf.float16), name='norm2')
    with tf.compat.v1.Session() as sess:
      (ours, theirs), (our_grad, their_grad) = sess.run([(ours, theirs), grads])
  # Large inputs (30 x N(0,1)): the normalisation divides by up to ~2, not ~1.
  assert theirs.max() < 0.6 * x.max()
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(our_grad, their_grad, rtol=1e-5, atol=1e-6)
  assert as_float16.dtype == tf.float16


def test_models_under_disable_v2_behavior_build_and_give_finite_losses():
  run = helpers.run([sys.executable, '-c', V1_BEHAVIOUR_SCRIPT])
  assert run.code == 0, run.log()
  losses = {(m.group(1), m.group(2)): float(m.group(3))
            for m in re.finditer(r'^(\w+) (b?float\d+) loss (\S+)$', run.out, re.M)}
  assert set(losses) == {(model, dtype) for model in ('cifar10', 'mnist')
                         for dtype in ('float32', 'float16', 'bfloat16')}, run.log()
  assert all(np.isfinite(value) for value in losses.values()), losses
  # A fresh model: ln(10) = 2.30 of cross-entropy plus about 2.37 of weight decay.
  assert abs(losses['cifar10', 'float32'] - 4.68) < 0.1, losses
  assert abs(losses['cifar10', 'float16'] - 4.68) < 0.1, losses
  assert abs(losses['cifar10', 'bfloat16'] - 4.68) < 0.1, losses


def test_import_models_fresh_process_loads_no_training_distributed_or_program():
  run = helpers.run([sys.executable, '-c', IMPORT_SCRIPT], fresh=True)  # what it imports
  assert run.code == 0, run.log()
  loaded = set(run.out.split())
  # The project's top-level modules: each program or module at the root, each package.
  project = {name[:-3] if name.endswith('.py') else name for name in os.listdir(helpers.ROOT)
             if name.endswith('.py')
             or os.path.isfile(os.path.join(helpers.ROOT, name, '__init__.py'))}
  others = project - {'cifar10', 'cifar10_input', 'mnist', 'mnist_input'}
  assert {'training', 'distributed', 'multi_gpu_train', 'dist_train', 'cifar10_eval',
          'mnist_eval'} <= others, others
  assert {'cifar10.model', 'mnist.model'} <= loaded
  assert sorted(name for name in loaded if name.split('.')[0] in others) == []
