"""Where the variables live: dealt to the ps tasks by size, said at start-up."""
import tensorflow as tf

from training import startup


def replica_devices(cluster, task_index):
  """The device function a worker builds under: its ops on /job:worker/task:<index>,
  each variable on the ps task holding the fewest bytes so far.

  replica_device_setter's default deals the variables to the ps tasks in turn, in
  the order they are made: with 2 ps tasks every weight of this model went to one and
  every bias to the other. By size, the task holding local3/weights (83% of the
  model) gets little else.
  """
  loads = [0] * cluster.num_tasks('ps')

  def least_loaded(op):
    task = loads.index(min(loads))
    loads[task] += startup.variable_bytes(op)
    return task
  return tf.compat.v1.train.replica_device_setter(
      cluster=cluster, worker_device='/job:worker/task:%d' % task_index,
      ps_strategy=least_loaded)


def bytes_by_ps_task(num_ps):
  """' (ps0 0.71 MB, ps1 3.56 MB)': where the trainable variables landed; '' with one
  ps task."""
  if num_ps < 2:
    return ''
  found = [0] * num_ps
  for var in tf.compat.v1.trainable_variables():
    found[tf.DeviceSpec.from_string(var.device).task or 0] += startup.variable_bytes(var.op)
  return ' (%s)' % ', '.join('ps%d %.2f MB' % (task, size / 1e6)
                             for task, size in enumerate(found))
