"""The trainer in this process: its settings and flags, its graph and one step of it.

TensorFlow and the project's modules are imported only once a test asks for them.
"""

def trainer_settings(train_dir, data_dir, **given):
  """A training.settings.Settings as multi_gpu_train.py's flags give it: its training
  knobs (those of --dataset, given or cifar10), but for the arguments given."""
  import multi_gpu_train
  from training.settings import Settings
  per_dataset = multi_gpu_train.DATASET_DEFAULTS[given.get('dataset', 'cifar10')]
  knobs = dict(num_gpus=multi_gpu_train.NUM_GPUS, batch_size=per_dataset['batch_size'],
               max_steps=per_dataset['max_steps'], log_frequency=multi_gpu_train.LOG_FREQUENCY,
               summary_steps=multi_gpu_train.SUMMARY_STEPS,
               save_every_n_steps=multi_gpu_train.SAVE_EVERY_N_STEPS)
  return Settings(str(train_dir), data_dir, **dict(knobs, **given))


def synthetic_settings(train_dir, **changes):
  """Settings of a short run on synthetic batches of 8, no summaries, a line every 10 steps."""
  return trainer_settings(str(train_dir), '', **dict(dict(
      synthetic=True, batch_size=8, summary_steps=0, log_frequency=10), **changes))


def input_main(module, *flags_given):
  """An input program's main (cifar10_input, mnist_input) in this process, as absl calls it:
  its flags parsed from flags_given onto a FlagValues of their own (absl refuses an
  unknown one with flags.Error)."""
  from absl import flags
  flag_values = flags.FlagValues()
  module.define_flags(flag_values)
  module.main(flag_values(['%s.py' % module.__name__] + list(flags_given)), flag_values)


def trainer_flags(*argv):
  """multi_gpu_train.py's flags parsed from argv, on flags of their own (not absl's
  global FLAGS), the data set's defaults applied: what check_trainer_flags reads."""
  from absl import flags
  import multi_gpu_train
  from training import settings
  flag_values = flags.FlagValues()
  settings.define_trainer_flags(multi_gpu_train.DATASET_DEFAULTS, 1, 10, 100, 1000,
                                flag_values=flag_values)
  flag_values(['multi_gpu_train.py', *argv])
  settings.apply_dataset_defaults(flag_values, multi_gpu_train.DATASET_DEFAULTS)
  return flag_values


# ---- One synchronous step of the trainer's own graph, in this process -------------------

def one_train_step(num_towers, images, labels, start_values=None, model=None):
  """Builds multi_gpu_train's graph over num_towers virtual CPUs and runs one step.

  images, labels: the global batch (numpy), split evenly over the towers in order.
  start_values: {variable name: value} to start from instead of fresh initial values.
  model: the model package (default cifar10).

  Returns:
    ({name: value} of every global variable before the step, and after it).
  """
  import tensorflow as tf
  import cifar10
  import multi_gpu_train
  from training import placement
  model = model or cifar10
  per_tower = len(images) // num_towers
  slices = iter([(images[i * per_tower:(i + 1) * per_tower],
                  labels[i * per_tower:(i + 1) * per_tower]) for i in range(num_towers)])
  with tf.Graph().as_default():
    graph = multi_gpu_train.build(
        lambda: tuple(map(tf.constant, next(slices))),
        ['/cpu:%d' % i for i in range(num_towers)], per_tower,
        model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, model=model, summaries=False)
    variables = tf.compat.v1.global_variables()
    start = [v.assign(start_values[v.op.name]) for v in variables] if start_values else []
    config = placement.session_config(num_cpu_devices=num_towers)
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(start)
      before = dict(zip([v.op.name for v in variables], sess.run(variables)))
      sess.run(graph.train_op)
      after = dict(zip([v.op.name for v in variables], sess.run(variables)))
  return before, after


def bfloat16_units():
  """training.machine.bfloat16_units_here(1): where it is not ok, --use_bf16
  is refused and the tests that train in bfloat16 are skipped, saying why."""
  from training import machine
  return machine.bfloat16_units_here(1)
