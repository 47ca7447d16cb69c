"""Workers that time the trainer's own step: multi_gpu_train's graph, input and session.

ours: one sess.run of [train op, loss] per step, as train() runs it.
profile: the same step traced, op time by op type.
"""
import collections
import time

import tensorflow as tf

import data_sets
import multi_gpu_train
from training import input_data, placement
from benchmarks.timing import (LAYERS, busy_threads, check_losses, load_weights, peak_mb,
                               save_weights, time_steps, weight_stats)

BUSY_STEPS = 20                   # --profile: untraced steps, each thread's CPU time read over them

Trainer = collections.namedtuple('Trainer', [
    'graph',           # multi_gpu_train.build's TrainGraph: train_op, update_op, loss, ...
    'input_init',      # the op that starts the input, to run once in the session
    'session_config',  # the trainer's ConfigProto for these towers and threads
    'devices',         # one device string per tower
    'where',           # tower_devices' line saying where the towers run
])


def build_trainer(config):
  """train()'s input and graph, from the trainer's own functions, in the default graph.

  config keys: towers, batch_size, input ('synthetic' or 'real'), data_dir, intra,
  inter; optional: seed (real input through the trainer's --seed pipeline), dataset
  (a key of data_sets.DATASETS; default cifar10), use_fp16, use_bf16 (the trainer's
  --use_fp16 or --use_bf16 graph). No summary op: train()'s steps between two
  summary steps do not run it.

  Returns:
    a Trainer.
  """
  batch_size = config['batch_size']
  data = data_sets.DATASETS[config.get('dataset', 'cifar10')]
  devices, num_cpu_devices, where = placement.tower_devices(config['towers'])
  next_batch, input_init = input_data.input_pipeline(
      config['data_dir'], config['towers'], batch_size, data.input,
      synthetic=config['input'] == 'synthetic', seed=config.get('seed'))
  graph = multi_gpu_train.build(next_batch, devices, batch_size,
                                data.model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, data.model,
                                summaries=False,
                                use_fp16=config.get('use_fp16', False),
                                use_bf16=config.get('use_bf16', False))
  session_config = placement.session_config(num_cpu_devices, placement.SessionOptions(
      intra_op_threads=config['intra'], inter_op_threads=config['inter']))
  return Trainer(graph, input_init, session_config, devices, where)


def ours(config):
  """The trainer's step: [train op, loss] in one sess.run, timed.

  config: as build_trainer's, plus steps and warmup; optionally init_seed (the graph's
  seed: what the initialisers draw) and save_start or start_from (start_weights).
  """
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    if config.get('init_seed') is not None:
      tf.compat.v1.set_random_seed(config['init_seed'])
    trainer = build_trainer(config)
    fetches = [trainer.graph.train_op, trainer.graph.loss]
    init = tf.compat.v1.global_variables_initializer()
    result = dict(where=trainer.where,
                  examples_per_step=config['batch_size'] * len(trainer.devices))
    with tf.compat.v1.Session(config=trainer.session_config) as sess:
      sess.run([init, trainer.input_init])
      if config.get('save_start') or config.get('start_from'):
        result['initial_weights'] = start_weights(sess, config)
      losses = []
      result['durations'] = time_steps(lambda: losses.append(sess.run(fetches)[1]),
                                       config['warmup'], config['steps'])
  check_losses('ours', losses)
  result.update(first_loss=float(losses[0]), last_loss=float(losses[-1]),
                losses=[float(loss) for loss in losses], peak_mb=peak_mb())
  return result


def start_weights(sess, config):
  """Saves the fresh weights to config['save_start'], or loads config['start_from']'s.

  Runs that start from the same weights and batch have the same first loss, whatever
  trains them (a peer, oneDNN on or off). Returns weight_stats of the fresh weights,
  what this model's own initialisers drew.
  """
  by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
  variables = {layer: (by_name[layer + '/weights'], by_name[layer + '/biases'])
               for layer in LAYERS}
  fresh = sess.run(variables)
  if config.get('save_start'):
    save_weights(config['save_start'], fresh)
  if config.get('start_from'):
    for layer, values in load_weights(config['start_from']).items():
      for variable, value in zip(variables[layer], values):
        variable.load(value, sess)
  return weight_stats(fresh)


def profile(config):
  """Where one step's time goes: op time per step by op type, over traced steps, and
  how busy each thread was over BUSY_STEPS untraced steps before them.

  config: as build_trainer's, plus warmup and steps (the traced steps). Each traced
  step is one sess.run of [train op, loss] with RunOptions.FULL_TRACE; an op's time
  is its kernel's start to end, so ops that overlap on the cores add up to more than
  the step. The op type is the kernel's as it ran ('_MklNativeConv2DBackpropFilter'
  with oneDNN), read from each node's timeline label ('name = Type(inputs)').
  """
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    trainer = build_trainer(config)
    fetches = [trainer.graph.train_op, trainer.graph.loss]
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    micros_by_type = collections.Counter()
    with tf.compat.v1.Session(config=trainer.session_config) as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), trainer.input_init])
      for _ in range(config['warmup']):
        sess.run(fetches)
      threads = busy_threads(lambda: sess.run(fetches), BUSY_STEPS)
      durations = []
      for _ in range(config['steps']):
        metadata = tf.compat.v1.RunMetadata()
        start = time.perf_counter()
        sess.run(fetches, options=options, run_metadata=metadata)
        durations.append(time.perf_counter() - start)
        for device in metadata.step_stats.dev_stats:
          for node in device.node_stats:
            op_type = node.timeline_label.split(' = ', 1)[-1].split('(', 1)[0] or node.node_name
            micros_by_type[op_type] += node.all_end_rel_micros
  ms_per_step = {op: micros / 1000.0 / config['steps'] for op, micros in micros_by_type.items()}
  return dict(where=trainer.where, ms_per_step=ms_per_step, durations=durations,
              threads=threads, busy_steps=BUSY_STEPS,
              examples_per_step=config['batch_size'] * len(trainer.devices))
