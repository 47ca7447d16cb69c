"""The CIFAR-10 network of the TensorFlow tutorial, in graph mode (tf.compat.v1).

Two convolutional layers with max-pooling and local response normalisation, two
fully connected layers with L2 weight decay, and a linear softmax layer:

    conv1 5x5x3->64, relu, max-pool 3x3/2, LRN
    conv2 5x5x64->64, relu, LRN, max-pool 3x3/2
    local3 2304->384 relu, local4 384->192 relu   (weight decay 0.004 each)
    softmax_linear 192->10                        (logits; softmax lives in the loss)

1,068,298 trainable parameters. A fresh model's total loss is about 4.68:
ln(10) = 2.30 of cross-entropy plus about 2.37 of weight decay.

No devices, flags, paths or printing here: the caller places the ops. Nothing of
the project is imported but cifar10_input.py (by the input functions of
cifar10/__init__.py, when called), and the model builds under the programs' own
settings and under tf.compat.v1.disable_v2_behavior() alike.

Mixed precision (training/mixed_precision.py, not imported here): called with
float16 or bfloat16 images under a variable scope whose custom getter returns casts
of the float32 variables to that dtype, the convolutions and matmuls run in it;
LRN, the weight decay (on the float32 variables, _float32_value) and the logits
stay float32, whatever the dtype. With float32 images and no getter the graph is
exactly the float32 one.
"""
import numpy as np
import tensorflow as tf

# ---- Data shape and schedule constants of the tutorial ---------------------
IMAGE_SIZE = 24                        # pixels; the readers crop 32x32 images to this
NUM_CLASSES = 10
CLASS_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse',
               'ship', 'truck')        # label i is CLASS_NAMES[i] (the archive's batches.meta.txt)
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 50000
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = 10000

MOVING_AVERAGE_DECAY = 0.9999     # decay of the shadow copies used for evaluation
NUM_EPOCHS_PER_DECAY = 350.0      # lr is multiplied by LEARNING_RATE_DECAY_FACTOR ...
LEARNING_RATE_DECAY_FACTOR = 0.1  # ... once per this many epochs (staircase)
INITIAL_LEARNING_RATE = 0.1       # SGD step size at global step 0
STAIRCASE = True                  # the decay comes in steps, not smoothly

LRN_DEPTH_RADIUS = 4              # channels on each side summed by the normalisation
LRN_BIAS = 1.0                    # x / (LRN_BIAS + LRN_ALPHA * sum of squares)^0.75
LRN_ALPHA = 0.001 / 9.0

TOWER_NAME = 'tower'              # name scope prefix of replica i: tower_0, tower_1, ...
LOSSES = 'losses'                 # collection: cross-entropy and weight-decay terms
ACTIVATIONS = 'activations'       # collection: each layer's output, for summaries
CROSS_ENTROPY = 'cross_entropy'   # collection: each tower's mean cross-entropy, for summaries


def _variable(name, shape, stddev, bias_init=None, wd=None):
  """Creates (or, under reuse, fetches) one weight or bias variable.

  Args:
    name: 'weights' or 'biases', created in the current variable scope.
    shape: list of ints.
    stddev: standard deviation of the truncated-normal initialiser (weights).
    bias_init: when given, a constant initialiser with this value (biases).
    wd: L2 weight decay factor; wd * l2_loss(var) is added to LOSSES in the
      current name scope, so each tower collects its own copy.

  Returns:
    float32 variable of `shape` (with wd, one read of it: a float32 tensor); under
    a casting custom getter (training/mixed_precision.py's float16_getter,
    bfloat16_getter), its cast.
  """
  if bias_init is None:
    initializer = tf.compat.v1.truncated_normal_initializer(stddev=stddev)
  else:
    initializer = tf.compat.v1.constant_initializer(bias_init)
  var = tf.compat.v1.get_variable(name, shape, tf.float32, initializer=initializer)
  if wd is not None:
    # The layer and its decay share one read: on a ps task each read is one more
    # transfer of the whole variable (local3's weights: 3.5 MB a step).
    var = tf.convert_to_tensor(var)
    weight_decay = tf.multiply(tf.nn.l2_loss(_float32_value(var)), wd, name='weight_loss')
    tf.compat.v1.add_to_collection(LOSSES, weight_decay)
  return var


def _float32_value(var):
  """The float32 value behind what get_variable returned, for the weight decay.

  Without a custom getter, what it was given (float32). Under a casting getter
  (training/mixed_precision.py's float16_getter, bfloat16_getter), get_variable
  returns tf.cast(variable, dtype), and the float32 read that cast was made from is
  its op's input: the decay taken on it rounds neither its value nor its gradient
  to the towers' dtype. That is the getter's side of the protocol: one tf.cast of
  the float32 variable, whatever the dtype. mnist/model.py has the same helper:
  each model stands alone.
  """
  if var.dtype.base_dtype == tf.float32:  # float32_ref under disable_v2_behavior()
    return var
  if var.op.type != 'Cast' or var.op.inputs[0].dtype.base_dtype != tf.float32:
    raise TypeError('%s is %s and not a cast of a float32 variable; a custom getter must '
                    'create the variables as float32 and return tf.cast(variable, dtype) '
                    '(training/mixed_precision.py\'s float16_getter and bfloat16_getter '
                    'do)'
                    % (var.name, var.dtype.name))
  return var.op.inputs[0]


def lrn(x, name):
  """The tutorial's local response normalisation, as a banded matmul.

  Equals tf.nn.lrn(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75): each
  value divided by t^0.75, t = 1 + alpha * the sum of squares over its channel and
  the 4 on each side. The sums are one matmul of the squares by a band of ones, and
  t^-0.75 is rsqrt(t * sqrt(t)). Forward and backward, it is several times faster
  than tf.nn.lrn (whose gradient runs Eigen's LRNGrad even with oneDNN on;
  docs/performance.md has the times) and agrees with it to 3e-7
  (tests/test_cifar10_model.py).

  Args:
    x: [batch, height, width, channels], float32, or float16 or bfloat16 (--use_fp16,
      --use_bf16): computed in float32 whatever the dtype (TensorFlow's LRN GPU kernel
      was float32 only, and the sums of squares want float32's precision).
    name: the name scope, 'norm1' or 'norm2'.

  Returns:
    x's shape and dtype.
  """
  with tf.name_scope(name):
    return tf.cast(_lrn_float32(tf.cast(x, tf.float32)), x.dtype)


@tf.custom_gradient
def _lrn_float32(x):
  """lrn on float32 x, with its gradient written out: 2 tensors of x's size fewer,
  and faster than TensorFlow's derivation of the same ops (docs/performance.md)."""
  depth = x.shape.as_list()[-1]  # an int; shape[-1] is a Dimension under v1 behaviour
  channel = np.arange(depth)
  within = np.abs(channel[:, None] - channel[None, :]) <= LRN_DEPTH_RADIUS

  def band_sums(values, factor, bias=None):  # factor * each channel's band sum (+ bias)
    band = tf.constant(factor * within, tf.float32)  # [depth, depth], symmetric
    sums = tf.matmul(tf.reshape(values, [-1, depth]), band)
    if bias is not None:  # one fused kernel with the matmul (grappler's remapper)
      sums = tf.nn.bias_add(sums, tf.fill([depth], bias))
    return tf.reshape(sums, tf.shape(x))

  t = band_sums(tf.square(x), LRN_ALPHA, bias=LRN_BIAS)
  scale = tf.math.rsqrt(t * tf.sqrt(t))  # t^-0.75: rsqrt is cheaper than pow
  y = x * scale

  def grad(upstream):
    # dL/dx_k = g_k scale_k - 1.5 x_k alpha (sum over |c - k| <= 4 of g_c y_c / t_c);
    # 1.5 alpha is the second band's: one pass over x's size fewer.
    return upstream * scale - x * band_sums(upstream * y / t, 1.5 * LRN_ALPHA)
  return y, grad


def inference(images):
  """Builds the network up to the logits.

  Args:
    images: float32 [batch, 24, 24, 3], standardised per image; or float16 or
      bfloat16, under training/mixed_precision.py's float16_getter or bfloat16_getter,
      to compute the layers in that dtype.

  Returns:
    logits: float32 [batch, 10], unnormalised (cast from the towers' dtype).
  """
  with tf.compat.v1.variable_scope('conv1') as scope:
    kernel = _variable('weights', [5, 5, 3, 64], stddev=5e-2)
    biases = _variable('biases', [64], stddev=None, bias_init=0.0)
    conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding='SAME')
    conv1 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    tf.compat.v1.add_to_collection(ACTIVATIONS, conv1)

  pool1 = tf.nn.max_pool2d(conv1, ksize=3, strides=2, padding='SAME', name='pool1')
  norm1 = lrn(pool1, name='norm1')

  with tf.compat.v1.variable_scope('conv2') as scope:
    kernel = _variable('weights', [5, 5, 64, 64], stddev=5e-2)
    biases = _variable('biases', [64], stddev=None, bias_init=0.1)
    conv = tf.nn.conv2d(norm1, kernel, [1, 1, 1, 1], padding='SAME')
    conv2 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    tf.compat.v1.add_to_collection(ACTIVATIONS, conv2)

  norm2 = lrn(conv2, name='norm2')
  pool2 = tf.nn.max_pool2d(norm2, ksize=3, strides=2, padding='SAME', name='pool2')

  with tf.compat.v1.variable_scope('local3') as scope:
    # 24x24 input, two stride-2 pools: 6 x 6 x 64 = 2304 features per image.
    _, height, width, channels = pool2.shape.as_list()  # ints, under v1 behaviour too
    dim = height * width * channels
    reshape = tf.reshape(pool2, [-1, dim])
    weights = _variable('weights', [dim, 384], stddev=0.04, wd=0.004)
    biases = _variable('biases', [384], stddev=None, bias_init=0.1)
    local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases, name=scope.name)
    tf.compat.v1.add_to_collection(ACTIVATIONS, local3)

  with tf.compat.v1.variable_scope('local4') as scope:
    weights = _variable('weights', [384, 192], stddev=0.04, wd=0.004)
    biases = _variable('biases', [192], stddev=None, bias_init=0.1)
    local4 = tf.nn.relu(tf.matmul(local3, weights) + biases, name=scope.name)
    tf.compat.v1.add_to_collection(ACTIVATIONS, local4)

  # Linear layer: tf.nn.sparse_softmax_cross_entropy_with_logits takes unscaled
  # logits and applies the softmax itself, more stably.
  with tf.compat.v1.variable_scope('softmax_linear') as scope:
    weights = _variable('weights', [192, NUM_CLASSES], stddev=1 / 192.0)
    biases = _variable('biases', [NUM_CLASSES], stddev=None, bias_init=0.0)
    softmax_linear = tf.add(tf.matmul(local4, weights), biases, name=scope.name)
    tf.compat.v1.add_to_collection(ACTIVATIONS, softmax_linear)

  # The softmax cross-entropy runs in float32.
  return tf.cast(softmax_linear, tf.float32)


def loss(logits, labels):
  """Adds the mean cross-entropy to LOSSES and returns the sum of LOSSES.

  Args:
    logits: float32 [batch, 10] from inference().
    labels: int32 [batch], class ids 0..9.

  Returns:
    total_loss: float32 scalar, cross-entropy plus every weight-decay term in
      LOSSES. With several towers in one graph, use tower_loss() in the trainer,
      which sums only the terms of one tower's name scope.
  """
  labels = tf.cast(labels, tf.int64)
  cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits, name='cross_entropy_per_example')
  cross_entropy_mean = tf.reduce_mean(cross_entropy, name='cross_entropy')
  tf.compat.v1.add_to_collection(LOSSES, cross_entropy_mean)
  tf.compat.v1.add_to_collection(CROSS_ENTROPY, cross_entropy_mean)
  return tf.add_n(tf.compat.v1.get_collection(LOSSES), name='total_loss')

