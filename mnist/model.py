"""The MNIST network of "TensorFlow: Practical Google deep learning", ch. 12.

The book's mnist_inference: 784 pixels -> 500 (ReLU) -> 10 logits, the weights
L2-regularised, the regulariser's terms in the LOSSES collection. The book's
reader casts the uint8 pixels to float without scaling them to 0..1, and its
learning rate (0.001) is tuned for that: mnist_input.py does the same.

Mixed precision (training/mixed_precision.py, not imported here): float16 or
bfloat16 pixels under its float16_getter or bfloat16_getter run the matmuls in that
dtype; the L2 terms (on the float32 weights, _float32_value) and the logits stay
float32, whatever the dtype.

Nothing of the project is imported here (the data is mnist_input.py's), and the
model builds under the programs' own settings and under
tf.compat.v1.disable_v2_behavior() alike.
"""
import tensorflow as tf

INPUT_NODE = 784                        # pixels of a 28x28 image, row-major
LAYER1_NODE = 500                       # hidden units
OUTPUT_NODE = 10                        # classes, digits 0..9
NUM_CLASSES = OUTPUT_NODE
CLASS_NAMES = tuple(str(digit) for digit in range(NUM_CLASSES))  # label i is the digit i
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 60000
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = 10000

REGULARIZATION_RATE = 0.0001      # L2: REGULARIZATION_RATE * sum(w^2) / 2 per weights matrix
MOVING_AVERAGE_DECAY = 0.99       # decay of the shadow copies used for evaluation
INITIAL_LEARNING_RATE = 0.001     # the book's LEARNING_RATE_BASE, for unscaled pixels 0..255
LEARNING_RATE_DECAY_FACTOR = 0.99  # lr is multiplied by this ...
NUM_EPOCHS_PER_DECAY = 1.0        # ... once per epoch, smoothly (not staircase)
STAIRCASE = False

TOWER_NAME = 'tower'              # name scope prefix of replica i: tower_0, tower_1, ...
LOSSES = 'losses'                 # collection: cross-entropy and regularisation terms
ACTIVATIONS = 'activations'       # collection: each layer's output, for summaries
CROSS_ENTROPY = 'cross_entropy'   # collection: each tower's mean cross-entropy, for summaries


def l2_regularizer(rate):
  """The book's tf.contrib.layers.l2_regularizer: w -> rate * sum(w^2) / 2."""
  return lambda weights: tf.multiply(rate, tf.nn.l2_loss(weights), name='weight_loss')


def get_weight_variable(shape, regularizer):
  """The book's helper: weights ~ truncated normal (stddev 0.1), their L2 term in LOSSES."""
  weights = tf.compat.v1.get_variable(
      'weights', shape, initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1))
  if regularizer is not None:
    # The layer and its L2 term share one read: on a ps task each read is a transfer.
    weights = tf.convert_to_tensor(weights)
    tf.compat.v1.add_to_collection(LOSSES, regularizer(_float32_value(weights)))
  return weights


def _float32_value(var):
  """The float32 value behind what get_variable returned, for the L2 terms.

  Without a custom getter, what it was given (float32). Under a casting getter
  (training/mixed_precision.py's float16_getter, bfloat16_getter), get_variable
  returns tf.cast(variable, dtype), and the float32 read that cast was made from is
  its op's input: the term taken on it rounds neither its value nor its gradient
  to the towers' dtype. That is the getter's side of the protocol: one tf.cast of
  the float32 variable, whatever the dtype. cifar10/model.py has the same helper:
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


def inference(input_tensor, regularizer='l2'):
  """The book's forward pass.

  Args:
    input_tensor: float32 [batch, 784], pixels 0..255 (exact in float16 and bfloat16);
      or float16 or bfloat16, under training/mixed_precision.py's float16_getter or
      bfloat16_getter, to compute in that dtype.
    regularizer: callable weights -> scalar loss term; 'l2' (the default, what the
      trainer uses): l2_regularizer(REGULARIZATION_RATE); None: no term (the
      book's evaluation passes None).

  Returns:
    logits: float32 [batch, 10] (cast from the towers' dtype).
  """
  if regularizer == 'l2':
    regularizer = l2_regularizer(REGULARIZATION_RATE)
  with tf.compat.v1.variable_scope('layer1'):
    weights = get_weight_variable([INPUT_NODE, LAYER1_NODE], regularizer)
    biases = tf.compat.v1.get_variable('biases', [LAYER1_NODE],
                                       initializer=tf.compat.v1.constant_initializer(0.0))
    layer1 = tf.nn.relu(tf.matmul(input_tensor, weights) + biases)
    tf.compat.v1.add_to_collection(ACTIVATIONS, layer1)
  with tf.compat.v1.variable_scope('layer2'):
    weights = get_weight_variable([LAYER1_NODE, OUTPUT_NODE], regularizer)
    biases = tf.compat.v1.get_variable('biases', [OUTPUT_NODE],
                                       initializer=tf.compat.v1.constant_initializer(0.0))
    layer2 = tf.matmul(layer1, weights) + biases
    tf.compat.v1.add_to_collection(ACTIVATIONS, layer2)
  return tf.cast(layer2, tf.float32)  # the softmax cross-entropy runs in float32


def loss(logits, labels):
  """Adds the mean cross-entropy to LOSSES; returns the sum of LOSSES (all towers').

  Args:
    logits: float32 [batch, 10].
    labels: int32 [batch].

  Returns:
    float32 scalar.
  """
  cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits, name='cross_entropy_per_example')
  cross_entropy_mean = tf.reduce_mean(cross_entropy, name='cross_entropy')
  tf.compat.v1.add_to_collection(LOSSES, cross_entropy_mean)
  tf.compat.v1.add_to_collection(CROSS_ENTROPY, cross_entropy_mean)
  return tf.add_n(tf.compat.v1.get_collection(LOSSES), name='total_loss')
