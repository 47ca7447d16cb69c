"""The CIFAR-10 tutorial model in Keras, trained with tf.distribute.MirroredStrategy.

The benchmark's peers: the same layers, initialisers, weight decay and learning rate
as cifar10/model.py, written the way TensorFlow 2 recommends, so that the trainer's
examples/sec can be read against them. Two ways to train it: make_train_step, the
custom loop an expert writes, and compile_with_defaults for model.fit, what most
Keras users write. measure_peers.py times them; nothing here times.

Differences from the trainer, all cheap per step: a constant learning rate (the
trainer's decays once per 350 epochs, so it is constant here too) and no moving
averages of the weights (the trainer keeps them for evaluation; what they cost:
docs/performance.md).
"""
import tensorflow as tf
import keras

import cifar10.model as cifar10_model

# ---- The tutorial's hyper-parameters (cifar10/model.py) -----------------------
IMAGE_SIZE = 24                   # pixels; images arrive cropped to 24x24x3
NUM_CLASSES = 10
LEARNING_RATE = 0.1               # plain SGD, as INITIAL_LEARNING_RATE
WEIGHT_DECAY = 0.004              # on local3 and local4: adds WEIGHT_DECAY * sum(w^2) / 2


class LocalResponseNorm(keras.layers.Layer):
  """The tutorial's norm1/norm2 as the trainer computes them (cifar10.model.lrn, equal to
  tf.nn.local_response_normalization and faster): the peers train the same ops."""

  def call(self, inputs):
    return cifar10_model.lrn(inputs, name=self.name)

  def compute_output_shape(self, input_shape):
    return input_shape


def build_model(policy='float32'):
  """The tutorial's network up to the logits; build it inside strategy.scope().

  Args:
    policy: the layers' Keras dtype policy: 'float32', or 'mixed_bfloat16' (bfloat16
      compute over float32 variables, as the trainer's --use_bf16). The LRN and the
      logits stay float32 under either, as the trainer keeps them.

  Returns:
    keras.Model mapping float32 [batch, 24, 24, 3] to float32 logits [batch, 10].
  """
  layers, init = keras.layers, keras.initializers
  # keras' L2(l) adds l * sum(w^2); the tutorial's wd * tf.nn.l2_loss(w) adds
  # wd * sum(w^2) / 2, hence the half.
  decay = keras.regularizers.L2(WEIGHT_DECAY / 2)
  images = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3), name='images')
  x = layers.Conv2D(64, 5, padding='same', activation='relu', name='conv1', dtype=policy,
                    kernel_initializer=init.TruncatedNormal(stddev=5e-2),
                    bias_initializer=init.Constant(0.0))(images)
  x = layers.MaxPooling2D(3, strides=2, padding='same', name='pool1', dtype=policy)(x)
  x = LocalResponseNorm(name='norm1', dtype='float32')(x)  # Keras casts its input
  x = layers.Conv2D(64, 5, padding='same', activation='relu', name='conv2', dtype=policy,
                    kernel_initializer=init.TruncatedNormal(stddev=5e-2),
                    bias_initializer=init.Constant(0.1))(x)
  x = LocalResponseNorm(name='norm2', dtype='float32')(x)
  x = layers.MaxPooling2D(3, strides=2, padding='same', name='pool2', dtype=policy)(x)
  x = layers.Flatten(name='flatten', dtype=policy)(x)  # 6 x 6 x 64 = 2304 features
  x = layers.Dense(384, activation='relu', name='local3', kernel_regularizer=decay,
                   dtype=policy, kernel_initializer=init.TruncatedNormal(stddev=0.04),
                   bias_initializer=init.Constant(0.1))(x)
  x = layers.Dense(192, activation='relu', name='local4', kernel_regularizer=decay,
                   dtype=policy, kernel_initializer=init.TruncatedNormal(stddev=0.04),
                   bias_initializer=init.Constant(0.1))(x)
  logits = layers.Dense(NUM_CLASSES, name='softmax_linear', dtype=policy,
                        kernel_initializer=init.TruncatedNormal(stddev=1 / 192.0),
                        bias_initializer=init.Constant(0.0))(x)
  if policy != 'float32':  # the softmax and the loss in float32, as Keras' guide does it
    logits = layers.Activation('linear', dtype='float32', name='logits')(logits)
  return keras.Model(images, logits, name='cifar10')


def compile_with_defaults(model):
  """model.compile as most users call it before model.fit.

  SGD at the tutorial's rate and the cross-entropy on logits; every other argument
  (jit_compile, steps_per_execution, the loss reduction) at Keras' default. The weight
  decay joins the loss through the layers' regularisers.
  """
  model.compile(optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def make_train_step(strategy, model, optimizer, global_batch_size):
  """One synchronous SGD step over all replicas, compiled with tf.function.

  Each replica takes its own batch from the iterator (as each tower dequeues its
  own), computes its loss scaled so that the all-reduced SUM of the replicas'
  gradients is the gradient of the mean loss over the global batch: the same
  update as the trainer's average of tower gradients.

  Args:
    strategy: the tf.distribute.MirroredStrategy the model was built under.
    model, optimizer: from build_model() and keras.optimizers.SGD, both created
      inside strategy.scope().
    global_batch_size: int, images per step over all replicas.

  Returns:
    train_step(iterator) -> float32 scalar, the mean total loss over the global
    batch (cross-entropy plus weight decay).
  """
  def replica_step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=tf.cast(labels, tf.int64), logits=logits)
      loss = tf.nn.compute_average_loss(cross_entropy, global_batch_size=global_batch_size)
      loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (SUM)
    return loss

  @tf.function
  def train_step(iterator):
    images, labels = next(iterator)
    losses = strategy.run(replica_step, args=(images, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  return train_step
