"""Where the variables live: the large ones split, the parts dealt to the ps tasks by
size, said at start-up."""
import tensorflow as tf

from training import startup

MIN_PART_BYTES = 256 << 10  # a variable larger than this is split, a part per ps task at most


def replica_devices(cluster, task_index):
  """The device function a worker builds under: its ops on /job:worker/task:<index>,
  each variable on the ps task holding the fewest bytes so far (without ps tasks, on
  this worker's CPU: all-reduce's own copy).

  replica_device_setter's default deals the variables to the ps tasks in turn, in
  the order they are made: with 2 ps tasks every weight of this model went to one and
  every bias to the other. By size, and with local3/weights (83% of the model) split
  by partitioner(), no task holds much more than its share.
  """
  if 'ps' not in cluster.jobs:
    return _on_this_worker(task_index)
  loads = [0] * cluster.num_tasks('ps')

  def least_loaded(op):
    task = loads.index(min(loads))
    loads[task] += startup.variable_bytes(op)
    return task
  return tf.compat.v1.train.replica_device_setter(
      cluster=cluster, worker_device='/job:worker/task:%d' % task_index,
      ps_strategy=least_loaded)


def _on_this_worker(task_index):
  """Every op on /job:worker/task:<index>, variables on its CPU, a device given inside
  (the towers', the input's) merged into it."""
  worker = tf.DeviceSpec.from_string('/job:worker/task:%d' % task_index)
  cpu = worker.replace(device_type='CPU', device_index=0)

  def place(op):
    node_def = op if isinstance(op, tf.compat.v1.NodeDef) else op.node_def
    is_variable = node_def.op in ('VarHandleOp', 'VariableV2')
    inner = tf.DeviceSpec.from_string(node_def.device or '')
    return (cpu if is_variable and not inner.device_type else worker).make_merged_spec(
        inner).to_string()
  return place


def partitioner(num_ps):
  """Splits each variable larger than MIN_PART_BYTES along its first axis into up to
  num_ps parts, each its own variable on a ps task; None with one ps task.

  Pass as variable_scope(..., partitioner=...) around the towers. A tower reads a split
  variable as the concat of its parts; each part gets its slice of the gradient. The
  Saver writes the parts as slices of one tensor under the variable's own name, so a
  checkpoint is the model's whatever the ps count: multi_gpu_train.py, the evaluation
  and the export read it, and a job restarted with another ps count resumes from it.
  With 2 ps tasks the largest holds 51% of the bytes, with 4 ps tasks 26%.
  """
  if num_ps < 2:
    return None
  return tf.compat.v1.min_max_variable_partitioner(max_partitions=num_ps,
                                                   min_slice_size=MIN_PART_BYTES)


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
