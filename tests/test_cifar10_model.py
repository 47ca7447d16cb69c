"""cifar10/: the tutorial's network, its size, names and starting loss."""
import numpy as np
import tensorflow as tf

import cifar10


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
