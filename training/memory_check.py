"""Will one training step fit in memory? Asked before the session opens.

A step too large for the machine does not fail: it swaps, stalls, and is killed
by the kernel's OOM killer minutes later (exit 137), with no line saying why and
no chance for a SIGTERM to be acted on. Both trainers ask here first, once the
graph is built and before the session opens:

    estimate = estimate_step_bytes(fetches)     # from the graph's static shapes
    check_step_fits(estimate, memory_available(), batch_size, num_towers)

and a step that cannot fit stops the run with one line:

    error: one step at --batch_size=100000 x 1 towers needs about 124.3 GB of memory
    (activations and gradients, estimated from the graph), and this machine has
    21.3 GB available. Lower --batch_size.

Nothing here builds a model or reads flags; the error is errors.TrainingError,
which the trainers already print as one line.
"""
import os

import tensorflow as tf

from training import errors

# ---- The margin ----------------------------------------------------------------
USED_SHARE_OF_COUNTED = 0.6   # a large step was measured to use 0.25-0.35 (CIFAR-10) and
                              # 0.45-0.56 (MNIST) of what estimate_step_bytes counts (it
                              # counts every tensor as alive at once; TensorFlow frees them
                              # as they are used): the table in tests/test_memory_check.py.
                              # Above the largest share measured, so that a step is never
                              # said to need less than it does; for CIFAR-10 it says about
                              # 1.7x more
MEMINFO = '/proc/meminfo'
CGROUP_ROOT = '/sys/fs/cgroup'  # cgroup v2 here; v1 under memory/
PROC_CGROUP = '/proc/self/cgroup'
CGROUP_V1_UNLIMITED = 2 ** 60   # v1 writes "no limit" as a page-aligned 2**63 - 1

# Ops whose output is their input's buffer seen another way: no new memory.
VIEWS = frozenset(['Identity', 'IdentityN', 'Reshape', 'ExpandDims', 'Squeeze',
                   'StopGradient', 'PreventGradient', 'EnsureShape'])
# Ops whose output is a variable's own buffer, counted once at the variable.
VARIABLE_READS = frozenset(['ReadVariableOp'])
VARIABLES = frozenset(['VarHandleOp', 'VariableV2', 'Variable'])


def estimate_step_bytes(fetches, device_type=None):
  """Bytes one run of `fetches` needs, from the graph's static shapes: upper-ish.

  Counts, over the ops that one sess.run(fetches) runs (the fetches and everything
  they depend on, data and control inputs; with a tf.Graph, every op in it):
    - every output of a numeric dtype (float, int, bool) whose shape is fully
      defined, elements x dtype size: the forward activations, the gradients,
      the gradient average, the losses;
    - every variable once, at its own size; its reads are not counted again;
  and does not count: views of another tensor (Identity, Reshape, ExpandDims,
  Squeeze; VIEWS), resource handles, strings, and outputs whose shape is not
  fully defined (a batch dimension of None counts nothing).

  It is an upper-ish estimate of what the step allocates: TensorFlow frees a
  forward activation once the backward pass has used it, so not everything
  counted here is alive at once; and it leaves out what no graph shows: the
  session's runtime, its thread pools, and the scratch memory of kernels (a
  convolution's workspace). On a CPU it is 2.2-4x the measured rise in peak memory
  of a CIFAR-10 step of 128 images or more (1.4x at 32), and 1.6-2.2x of an MNIST
  step of 10,000 (tests/test_memory_check.py gives the table).

  Args:
    fetches: a tf.Graph, or a list of tf.Operation / tf.Tensor (the train op,
      the loss, the summary op: what the step loop passes to sess.run).
    device_type: None counts every op; 'CPU' or 'GPU' only the ops placed on a
      device of that type. An op with no device counts as CPU: in the trainers
      every op of a tower is placed, and what is not runs on the host.

  Returns:
    int, bytes.
  """
  if isinstance(fetches, tf.Graph):
    ops = fetches.get_operations()
  else:
    ops = _ops_run_by(fetches)
  total = 0
  for op in ops:
    if device_type is not None and _device_type(op) != device_type.upper():
      continue
    if op.type in VARIABLES:
      total += variable_bytes(op)
    elif op.type not in VIEWS and op.type not in VARIABLE_READS:
      total += sum(_bytes(t.shape, t.dtype) for t in op.outputs)
  return total


def _ops_run_by(fetches):
  """The ops one sess.run(fetches) runs: the fetches and all they depend on."""
  graph = tf.compat.v1.get_default_graph()
  # as_graph_element: a tensor, an op, or what stands for one (a resource
  # variable's assign, which SyncReplicasOptimizer's train op is).
  found, todo = set(), [getattr(element, 'op', element) for element in
                        (graph.as_graph_element(f) for f in fetches if f is not None)]
  while todo:
    op = todo.pop()
    if op not in found:
      found.add(op)
      todo.extend(t.op for t in op.inputs)
      todo.extend(op.control_inputs)
  return sorted(found, key=lambda op: op.name)


def _device_type(op):
  return (tf.DeviceSpec.from_string(op.device).device_type or 'CPU').upper()


def variable_bytes(op):
  """The bytes of the variable an op of VARIABLES makes (from its attributes); 0 for
  any other op (replica_device_setter also places hash tables on the ps tasks)."""
  if getattr(op, 'type', None) not in VARIABLES:
    return 0
  return _bytes(tf.TensorShape(op.get_attr('shape')), op.get_attr('dtype'))


def _bytes(shape, dtype):
  """Elements x bytes per element; 0 for a shape not fully defined or a non-numeric dtype."""
  dtype = tf.as_dtype(dtype).base_dtype
  if not (dtype.is_floating or dtype.is_integer or dtype.is_bool or dtype.is_complex):
    return 0  # resource handles, variants, strings: no fixed size per element
  if shape.rank is None or not shape.is_fully_defined():
    return 0
  return shape.num_elements() * dtype.size


def memory_available(meminfo=MEMINFO, cgroup_root=CGROUP_ROOT, proc_cgroup=PROC_CGROUP):
  """Bytes this process can still allocate: the smaller of what the machine has
  free and what its memory cgroup (a container's limit) still allows.

  The machine: MemAvailable of /proc/meminfo (free memory plus the page cache
  the kernel can drop). The cgroup, v2 (memory.max) or v1 (memory/
  memory.limit_in_bytes): the limit minus the working set (usage minus the
  inactive page cache, as `docker stats` counts it), at this process's cgroup and
  each of its parents, whichever allows least. "max" and v1's 2**63 mean no limit.

  Args:
    meminfo, cgroup_root, proc_cgroup: paths, for tests.

  Returns:
    int bytes, or None when neither is known (not Linux).
  """
  found = []
  try:
    with open(meminfo) as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          found.append(int(line.split()[1]) * 1024)  # kB
  except (OSError, ValueError, IndexError):
    pass
  found += _cgroup_room(cgroup_root, proc_cgroup)
  return min(found) if found else None


def _cgroup_room(cgroup_root, proc_cgroup):
  """What each memory cgroup from this process's own up to the root still allows."""
  room = []
  for v2, base, limit_file, usage_file, inactive in (
      (True, cgroup_root, 'memory.max', 'memory.current', 'inactive_file'),
      (False, os.path.join(cgroup_root, 'memory'), 'memory.limit_in_bytes',
       'memory.usage_in_bytes', 'total_inactive_file')):
    for directory in _cgroup_dirs(base, _own_cgroup(proc_cgroup, v2)):
      limit = _read_number(os.path.join(directory, limit_file))
      if limit is None or limit >= CGROUP_V1_UNLIMITED:  # no file, or 'max': no limit
        continue
      working_set = ((_read_number(os.path.join(directory, usage_file)) or 0) -
                     _stat(os.path.join(directory, 'memory.stat'), inactive))
      room.append(max(limit - max(working_set, 0), 0))
  return room


def _own_cgroup(proc_cgroup, v2):
  """This process's cgroup path ('/user.slice/x') in the v2 or v1 memory hierarchy."""
  try:
    with open(proc_cgroup) as f:
      for line in f:
        _, controllers, path = line.rstrip('\n').split(':', 2)
        if (controllers == '') if v2 else ('memory' in controllers.split(',')):
          return path
  except (OSError, ValueError):
    pass
  return '/'


def _cgroup_dirs(base, own):
  """base/own and its parents up to base, those that exist. In a container that
  sees its own cgroup as the root (a cgroup namespace), that is base alone."""
  parts = [p for p in own.split('/') if p]
  dirs = [os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1)]
  return [d for d in dirs if os.path.isdir(d)]


def _read_number(path):
  """The int in a cgroup file; None for 'max', a missing file or anything else."""
  try:
    with open(path) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def _stat(path, key):
  """One value of a memory.stat file; 0 when absent."""
  try:
    with open(path) as f:
      for line in f:
        name, _, value = line.partition(' ')
        if name == key:
          return int(value)
  except (OSError, ValueError):
    pass
  return 0


def check_step_fits(estimate_bytes, available_bytes, batch_size, num_towers):
  """Stops the run, in one line, when one step cannot fit in the memory available.

  The step needs about USED_SHARE_OF_COUNTED x estimate_bytes; refused when that
  is more than available_bytes. With available_bytes None (not Linux) it checks
  nothing.

  On GPUs: pass the host's share only, estimate_step_bytes(fetches, 'CPU'),
  against memory_available(). The towers' activations then live in GPU memory,
  which this host figure does not describe, and running out of it fails fast
  and by name (TensorFlow's ResourceExhaustedError in the first step), not by a
  silent stall until the OOM killer comes, which is what this check is for. A
  GPU check would compare estimate_step_bytes(fetches, 'GPU') / num_towers with
  one GPU's free memory.

  Args:
    estimate_bytes: int, from estimate_step_bytes.
    available_bytes: int or None, from memory_available.
    batch_size: int, images per tower (the --batch_size flag).
    num_towers: int (the --num_gpus flag).

  Raises:
    errors.TrainingError: naming the batch, the estimate and what is available.
  """
  needed = int(USED_SHARE_OF_COUNTED * estimate_bytes)
  if available_bytes is None or needed <= available_bytes:
    return
  raise errors.TrainingError(
      'one step at --batch_size=%d x %d towers needs about %s of memory (activations and '
      'gradients, estimated from the graph), and this machine has %s available. Lower '
      '--batch_size%s.' % (batch_size, num_towers, _size(needed),
                           _size(available_bytes), ' or --num_gpus' if num_towers > 1 else ''))


def _size(num_bytes):
  """61200000000 -> '61.2 GB'; below 1 GB in MB."""
  if num_bytes >= 1e9:
    return '%.1f GB' % (num_bytes / 1e9)
  return '%.0f MB' % (num_bytes / 1e6)
