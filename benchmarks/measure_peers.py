"""Workers that time the Keras peers: the same model, the way Keras users train it.

peer: keras_peer's custom training loop, a tf.function step under MirroredStrategy,
  what an expert writes.
fit: model.compile with Keras defaults and model.fit under MirroredStrategy, what
  most Keras users write.
Both run on `towers` virtual CPU devices with the trainer's global batch, on
in-memory synthetic input; config['policy'] 'mixed_bfloat16' (optional) builds the
model under Keras' mixed_bfloat16 (keras_peer.build_model).
"""
import time

import tensorflow as tf
import keras

import cifar10_input
from benchmarks import keras_peer
from benchmarks.timing import (LAYERS, check_losses, load_weights, peak_mb, time_steps,
                               weight_stats)


def mirrored_strategy(config):
  """MirroredStrategy over config['towers'] virtual CPU devices, with the trainer's threads.

  Must run before TensorFlow initialises its devices, as the trainer's
  session_config does for its session.
  """
  tf.config.threading.set_intra_op_parallelism_threads(config['intra'])
  tf.config.threading.set_inter_op_parallelism_threads(config['inter'])
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * config['towers'])
  return tf.distribute.MirroredStrategy(
      devices=['/cpu:%d' % i for i in range(config['towers'])])


def peer(config):
  """The custom-loop peer: keras_peer.make_train_step, one call per step, timed."""
  strategy = mirrored_strategy(config)
  global_batch = config['batch_size'] * config['towers']
  seed(config)
  with strategy.scope():
    model = keras_peer.build_model(config.get('policy', 'float32'))
    optimizer = keras.optimizers.SGD(learning_rate=keras_peer.LEARNING_RATE)
    optimizer.build(model.trainable_variables)
  initial_weights = start_weights(model, config)
  # Each replica draws its own batch_size batch, as each tower does.
  dataset = strategy.distribute_datasets_from_function(
      lambda context: cifar10_input.synthetic_dataset(
          context.get_per_replica_batch_size(global_batch)))
  iterator = iter(dataset)
  train_step = keras_peer.make_train_step(strategy, model, optimizer, global_batch)
  losses = []
  # float() waits for the step to finish, as sess.run does.
  durations = time_steps(lambda: losses.append(float(train_step(iterator))),
                         config['warmup'], config['steps'])
  check_losses('custom-loop peer', losses)
  return dict(durations=durations, examples_per_step=global_batch,
              replicas=strategy.num_replicas_in_sync, first_loss=losses[0],
              last_loss=losses[-1], losses=losses, peak_mb=peak_mb(),
              initial_weights=initial_weights)


def start_weights(model, config):
  """Loads config['start_from'] (measure_ours.start_weights' file) into the model.

  Returns weight_stats of the fresh weights, what the Keras initialisers drew.
  """
  fresh = {layer: model.get_layer(layer).get_weights() for layer in LAYERS}
  if config.get('start_from'):
    for layer, values in load_weights(config['start_from']).items():
      model.get_layer(layer).set_weights(list(values))
  return weight_stats(fresh)


def seed(config):
  """Seeds Keras' initialisers with config['init_seed'], if given."""
  if config.get('init_seed') is not None:
    keras.utils.set_random_seed(config['init_seed'])


class BatchTimer(keras.callbacks.Callback):
  """Seconds of each training batch of model.fit, from its start to its loss."""

  def __init__(self):
    super().__init__()
    self.durations, self.losses, self._start = [], [], None

  def on_train_batch_begin(self, batch, logs=None):
    self._start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    # Keras hands callbacks Python numbers, so the step has finished by now, as
    # sess.run's has. The loss is fit's running mean over the epoch so far.
    self.losses.append(float(logs['loss']))
    self.durations.append(time.perf_counter() - self._start)


def fit(config):
  """The model.fit peer: compile with Keras defaults, fit, every batch timed.

  jit_compile is left at its default ('auto'), which Keras resolves to no XLA on
  a machine without GPUs. One global batch per step from an in-memory dataset;
  fit splits it over the replicas.
  """
  strategy = mirrored_strategy(config)
  global_batch = config['batch_size'] * config['towers']
  seed(config)
  with strategy.scope():
    model = keras_peer.build_model(config.get('policy', 'float32'))
    keras_peer.compile_with_defaults(model)
  initial_weights = start_weights(model, config)
  timer = BatchTimer()
  model.fit(cifar10_input.synthetic_dataset(global_batch), epochs=1, verbose=0,
            steps_per_epoch=config['warmup'] + config['steps'], callbacks=[timer])
  check_losses('model.fit peer', timer.losses)
  return dict(durations=timer.durations[config['warmup']:], examples_per_step=global_batch,
              replicas=strategy.num_replicas_in_sync, jit_compile=bool(model.jit_compile),
              first_loss=timer.losses[0], last_loss=timer.losses[-1], peak_mb=peak_mb(),
              initial_weights=initial_weights)
