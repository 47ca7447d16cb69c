"""The SGD update around the gradient average: the tutorial's learning-rate schedule
and the moving averages that evaluation reads. Both trainers build these."""
import tensorflow as tf


def decay_steps(examples_per_update, examples_per_epoch, model):
  """Updates between two drops of the learning rate: NUM_EPOCHS_PER_DECAY epochs of
  examples_per_update images each."""
  return int(examples_per_epoch / examples_per_update * model.NUM_EPOCHS_PER_DECAY)


def learning_rate(global_step, examples_per_update, examples_per_epoch, model):
  """The tutorial's schedule: the rate drops by LEARNING_RATE_DECAY_FACTOR once per
  NUM_EPOCHS_PER_DECAY epochs, counted in updates of examples_per_update images.

  Returns:
    (float32 scalar learning rate, int decay_steps: updates between two drops).
  """
  steps = decay_steps(examples_per_update, examples_per_epoch, model)
  lr = tf.compat.v1.train.exponential_decay(model.INITIAL_LEARNING_RATE, global_step,
                                            steps, model.LEARNING_RATE_DECAY_FACTOR,
                                            staircase=model.STAIRCASE)
  return lr, steps


def moving_averages(num_updates, model):
  """The shadow copies evaluation reads: one per trainable variable, in every checkpoint.

  num_updates: the global step that the update being averaged makes (the global step
  variable, read after apply_gradients has counted the update; or that step, computed).
  While it is small the averages follow faster: the decay is min(MOVING_AVERAGE_DECAY,
  (1 + n) / (10 + n)).
  """
  return tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY,
                                                     num_updates=num_updates)


def then_average(update_op, ema):
  """update_op, then the moving averages of the variables it has just changed.

  Each average is computed beside its variable. Under dist_train.py's
  replica_device_setter the arithmetic of ema.apply() would otherwise land on the
  worker: every variable and its average read over the network, the new average sent
  back, three times the model's 4.3 MB per step (what it cost: docs/performance.md,
  "What distribution costs"). On one machine everything is on /cpu:0 either way.
  """
  averaged = []
  with tf.control_dependencies([update_op]):  # the averages read the updated values
    for var in tf.compat.v1.trainable_variables():
      with tf.device(var.device):
        averaged.append(ema.apply([var]))
  return tf.group(update_op, *averaged)


def apply_average_count(opt, grads, global_step, model):
  """One update whole before it is counted: opt applies grads, the moving averages step
  (then_average), and only then does global_step go up by one.

  Whoever reads global_step at n then finds n updates there, their averages included:
  the sync chief's StopAtStepHook, which reads it between its steps while its queue
  runner may be applying the next update, and saves once it reads max_steps.
  apply_gradients(global_step=) counts before the averages; the chief could then save
  them one update behind (CI's AVX2 pass, 2026-11-27). The averages' decay counts
  this update as it would there: num_updates is the step after it.
  """
  update_op = opt.apply_gradients(grads)
  with tf.control_dependencies([update_op]), tf.compat.v1.colocate_with(global_step):
    step_after = global_step.read_value() + 1
  averaged = then_average(update_op, moving_averages(step_after, model))
  with tf.control_dependencies([averaged]), tf.compat.v1.colocate_with(global_step):
    return global_step.assign_add(1, read_value=False)


def schedule_line(model, decay_steps):
  """The learning-rate schedule whole, from the model's constants, for start-up."""
  return 'learning rate %g, multiplied by %g every %d updates (%s); constants in %s/model.py' % (
      model.INITIAL_LEARNING_RATE, model.LEARNING_RATE_DECAY_FACTOR, decay_steps,
      'staircase' if model.STAIRCASE else 'smoothly', model.__name__)
