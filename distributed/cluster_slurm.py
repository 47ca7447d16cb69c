"""The training cluster of a Slurm job step, from the variables srun sets in every task.

    cluster = cluster_slurm.from_slurm(num_ps=1)
    print(cluster.description)
    # cluster from Slurm (SLURM_*): 1 ps, 2 workers on 1 node (node7); this task: ...

One srun step starts every task; the first num_ps ranks (SLURM_PROCID) are the ps
tasks, the rest the workers, the first of them the chief. Each task listens on
port_base + its index among the tasks of its node.
"""
import os
import re
import shutil

import tensorflow as tf
# The resolver's own readers of Slurm's node and task lists, and its GPU count.
from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

from distributed.cluster_env import Cluster, check, environment
from training.errors import ClusterError, one_line

SLURM_PORT_BASE = 8888   # a Slurm task listens on this + its index among its node's tasks
SLURM_MAX_TASKS = 1 << 16  # more tasks in one step is a mistake, not a cluster to expand
SLURM_VARIABLES = ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS', 'SLURM_STEP_NODELIST',
                   'SLURM_STEP_TASKS_PER_NODE')


def from_slurm(num_ps, port_base=SLURM_PORT_BASE, environ=os.environ):
  """The cluster of this Slurm job step: num_ps ps tasks, then the workers.

  Read by TensorFlow's SlurmClusterResolver with jobs {'ps': num_ps, 'worker':
  SLURM_STEP_NUM_TASKS - num_ps}, from SLURM_PROCID, SLURM_STEP_NUM_TASKS,
  SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE. Ranks (SLURM_PROCID)
  0..num_ps-1 are the ps tasks, num_ps is worker 0, the chief. Slurm's default
  block distribution is assumed: consecutive ranks on a node, nodes in order.

  GPUs. The resolver pairs each task of a node with a slot of GPUs and sets
  CUDA_VISIBLE_DEVICES in the environment to this task's slot, counting a node's
  GPUs with nvidia-smi. So:
  - CUDA_VISIBLE_DEVICES unset and nvidia-smi found: the resolver shares the
    node's GPUs evenly among its tasks (the ps tasks too) and sets
    CUDA_VISIBLE_DEVICES. CALL THIS BEFORE ANYTHING ASKS TENSORFLOW FOR ITS
    DEVICES (machine.list_gpus(), tf.config, a Server, a Session): CUDA
    reads CUDA_VISIBLE_DEVICES once, when TensorFlow first touches a GPU.
  - CUDA_VISIBLE_DEVICES already set (srun --gpus-per-task, or by hand): Slurm
    has chosen this task's GPUs; they are kept as they are.
  - no nvidia-smi (a node without GPUs): nothing is set; the tasks use the CPU.

  Args:
    num_ps: int >= 1, ps tasks among the step's tasks.
    port_base: int, the first task of each node listens on this port, the next
      on port_base + 1, ...; unless srun reserved ports for the step (--resv-ports):
      then the first of SLURM_STEP_RESV_PORTS, which Slurm reserved on every node
      of the step, so that two jobs on one node never collide.
    environ: the environment to read (a mapping); os.environ by default. The
      CUDA_VISIBLE_DEVICES the resolver sets is written to it.

  Returns a Cluster with source 'Slurm'. Raises ClusterError: a variable is missing
  or malformed, the step has fewer than num_ps + 1 tasks, a node has fewer GPUs
  than tasks, or port_base + a task's index on its node passes 65535 (check()).
  """
  num_tasks, rank, nodes, tasks_per_node = _slurm_step(environ, num_ps)
  nodelist = environ['SLURM_STEP_NODELIST']
  gpus = _slurm_gpus(environ, max(tasks_per_node))
  port_base, ports_note = _slurm_port_base(environ, port_base, max(tasks_per_node))
  spec, job_name, task_index, visible = _resolve(environ, num_ps, num_tasks, port_base,
                                                   gpus)
  num_workers = num_tasks - num_ps
  description = ('cluster from Slurm (SLURM_*): %d ps, %d worker%s on %d node%s (%s); '
                 'this task: %s %d%s (SLURM_PROCID=%d); %s; %s' % (
                     num_ps, num_workers, 's' * (num_workers != 1), len(nodes),
                     's' * (len(nodes) != 1), nodelist, job_name, task_index,
                     ', the chief' * (job_name == 'worker' and task_index == 0), rank,
                     ports_note, _slurm_gpu_note(gpus, visible, environ)))
  cluster = Cluster(spec.job_tasks('ps') if num_ps else [], spec.job_tasks('worker'),
                    job_name, task_index,
                    'Slurm', description)
  check(cluster, named=_named, bad_port=lambda host: _slurm_port_message(cluster, host))
  return cluster


def _resolve(environ, num_ps, num_tasks, port_base, gpus):
  """TensorFlow's SlurmClusterResolver on environ: (its ClusterSpec, this task's job and
  index, the CUDA_VISIBLE_DEVICES it left or None), that variable written to environ."""
  per_node_text = environ['SLURM_STEP_TASKS_PER_NODE']
  with environment(environ, SLURM_VARIABLES + ('CUDA_VISIBLE_DEVICES', 'PATH')):
    try:
      resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
          jobs={'ps': num_ps, 'worker': num_tasks - num_ps}, port_base=port_base, **gpus)
      spec = resolver.cluster_spec()  # sets CUDA_VISIBLE_DEVICES when it shares out GPUs
    except (RuntimeError, ValueError) as e:
      raise ClusterError('SLURM_STEP_TASKS_PER_NODE=%r: TensorFlow\'s SlurmClusterResolver '
                         'cannot place the tasks (%s); run the tasks under one srun'
                         % (per_node_text, one_line(e))) from None
    job_name, task_index = resolver.get_task_info()
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if environ is not os.environ and visible is not None:
    environ['CUDA_VISIBLE_DEVICES'] = visible
  return spec, job_name, task_index, visible


def _slurm_port_base(environ, port_base, tasks_on_a_node):
  """(the port of each node's first task, a note for the description): the first of
  SLURM_STEP_RESV_PORTS ('12000-12003'; srun --resv-ports), else port_base.

  Raises ClusterError: malformed, or fewer reserved ports than a node's tasks.
  """
  text = environ.get('SLURM_STEP_RESV_PORTS', '').strip()
  if not text:
    return port_base, 'ports %d + the task\'s index on its node' % port_base
  found = re.fullmatch(r'(\d{1,5})(?:-(\d{1,5}))?', text.split(',')[0])
  first, last = (int(found.group(1)), int(found.group(2) or found.group(1))) if found else (0, -1)
  if not 0 < first <= last < 65536:
    raise ClusterError('SLURM_STEP_RESV_PORTS=%r is not a range of ports such as 12000-12003 '
                       '(srun --resv-ports sets it); run srun without --resv-ports to use '
                       '--slurm_port_base' % text)
  if last - first + 1 < tasks_on_a_node:
    raise ClusterError('SLURM_STEP_RESV_PORTS=%s reserves %d port(s), and %d tasks of this '
                       'step share a node: give srun --resv-ports=%d, or none' % (
                           text, last - first + 1, tasks_on_a_node, tasks_on_a_node))
  return first, 'ports %s reserved by srun (SLURM_STEP_RESV_PORTS)' % text


def _slurm_step(environ, num_ps):
  """The srun step's tasks from SLURM_*: (number of tasks, this rank, nodes, tasks per node).

  Raises:
    ClusterError: a variable missing or malformed, too few tasks for num_ps + 1.
  """
  if num_ps < 0:
    raise ClusterError('--num_ps must be at least 0 for a Slurm cluster (0: --all_reduce), '
                       'got %d' % num_ps)
  for name in SLURM_VARIABLES:
    if not environ.get(name, '').strip():
      raise ClusterError('%s is not set: start every task with one srun step inside the '
                         'allocation (see deploy/slurm/train.sbatch); sbatch alone or '
                         'salloc does not set it' % name)
  num_tasks = _slurm_int(environ, 'SLURM_STEP_NUM_TASKS')
  rank = _slurm_int(environ, 'SLURM_PROCID')
  if num_tasks < num_ps + 1:
    raise ClusterError('SLURM_STEP_NUM_TASKS is %d: too few tasks for --num_ps=%d ps tasks '
                       'and at least 1 worker; ask srun for --ntasks=%d or more, or lower '
                       '--num_ps' % (num_tasks, num_ps, num_ps + 1))
  if not 0 <= rank < num_tasks:
    raise ClusterError('SLURM_PROCID is %d, not a task of the step\'s '
                       'SLURM_STEP_NUM_TASKS=%d (0..%d)' % (rank, num_tasks, num_tasks - 1))
  if num_tasks > SLURM_MAX_TASKS:
    raise ClusterError('SLURM_STEP_NUM_TASKS is %d: more than the %d tasks dist_train.py '
                       'runs in one step (SLURM_MAX_TASKS in distributed/cluster_slurm.py); '
                       'ask srun for fewer --ntasks' % (num_tasks, SLURM_MAX_TASKS))
  nodelist = environ['SLURM_STEP_NODELIST']
  per_node_text = environ['SLURM_STEP_TASKS_PER_NODE']
  # Counted before either list is expanded: n[1-3000000000] would fill the memory.
  for name, count, what in (('SLURM_STEP_NODELIST', _hostlist_size(nodelist), 'nodes'),
                            ('SLURM_STEP_TASKS_PER_NODE', _tasks_per_node_size(per_node_text),
                             'node counts')):
    if count is not None and count > num_tasks:
      raise ClusterError('%s=%r lists %d %s, more than the step\'s SLURM_STEP_NUM_TASKS=%d '
                         'tasks (every node runs one at least); run the tasks under one '
                         'srun, which sets them together'
                         % (name, environ[name][:200], count, what, num_tasks))
  nodes = _slurm_list(environ, 'SLURM_STEP_NODELIST', slurm_cluster_resolver.expand_hostlist,
                      'a Slurm host list such as node[01-04],gpu7')
  tasks_per_node = _slurm_list(environ, 'SLURM_STEP_TASKS_PER_NODE',
                               slurm_cluster_resolver.expand_tasks_per_node,
                               'a Slurm task count list such as 2(x3),1')
  if (len(nodes) != len(tasks_per_node) or len(set(nodes)) != len(nodes) or
      sum(tasks_per_node) != num_tasks):
    raise ClusterError('SLURM_STEP_NODELIST=%r (%d nodes) and SLURM_STEP_TASKS_PER_NODE=%r '
                       '(%d tasks) do not describe the SLURM_STEP_NUM_TASKS=%d tasks of one '
                       'step; run the tasks under one srun, which sets them together' % (
                           nodelist, len(nodes), per_node_text, sum(tasks_per_node),
                           num_tasks))
  return num_tasks, rank, nodes, tasks_per_node


def _hostlist_size(hostlist):
  """How many hosts a Slurm host list (n[1-3,7],gpu[01-02]x) names, without naming
  them; None when it is malformed (expand_hostlist then says so)."""
  host = r'[^,\[\]]*(?:\[([^\]]+)\])?'  # a prefix, then a bracketed range list or none
  if not re.fullmatch(r'%s(?:,%s)*' % (host, host), hostlist):
    return None
  count = 0
  for found in re.finditer(host + r'(?:,|$)', hostlist):
    if not found.group():
      continue
    if found.group(1) is None:
      count += 1
      continue
    for item in found.group(1).split(','):
      ends = item.split('-')
      if len(ends) > 2 or not all(end.isdigit() for end in ends):
        return None
      count += max(0, int(ends[-1]) - int(ends[0]) + 1)
  return count


def _tasks_per_node_size(tasks_per_node):
  """How many node counts a Slurm task count list (2(x3),1) expands to; None when
  malformed (expand_tasks_per_node then says so)."""
  count = 0
  for part in tasks_per_node.split(','):
    found = re.fullmatch(r'\d+(?:\(x(\d+)\))?', part)
    if found is None:
      return None
    count += int(found.group(1) or 1)
  return count


def _slurm_list(environ, name, expand, what):
  """Slurm's compressed list in environ[name], expanded by the resolver's own reader."""
  try:
    return expand(environ[name])
  except ValueError:
    raise ClusterError('%s=%r is not %s; run the tasks under srun, which sets it'
                       % (name, environ[name], what)) from None


def _slurm_int(environ, name):
  try:
    return int(environ[name])
  except ValueError:
    raise ClusterError('%s=%r is not a whole number; run the tasks under srun, which sets '
                       'it' % (name, environ[name])) from None


def _slurm_gpus(environ, max_tasks_per_node):
  """SlurmClusterResolver's GPU arguments for this node: kwargs.

  The resolver pairs each task of a node with a slot of gpus_per_task GPUs, and
  drops the tasks left without one (or fails when gpus_per_task is 0). Where
  there is nothing to share out, one pretend slot per task keeps every task and
  auto_set_gpu=False leaves CUDA_VISIBLE_DEVICES alone.
  """
  slots_only = dict(gpus_per_node=max_tasks_per_node, gpus_per_task=1, auto_set_gpu=False)
  if 'CUDA_VISIBLE_DEVICES' in environ:  # Slurm's --gpus-per-task, or the user, chose
    return slots_only
  if not shutil.which('nvidia-smi', path=environ.get('PATH')):  # the resolver would fail
    return slots_only
  with environment(environ, ['PATH']):
    try:
      num_gpus = slurm_cluster_resolver.get_num_gpus()  # runs nvidia-smi --list-gpus
    except (OSError, RuntimeError) as e:
      raise ClusterError('nvidia-smi --list-gpus failed (%s); set CUDA_VISIBLE_DEVICES for '
                         'each task (srun --gpus-per-task=N does), or fix the driver'
                         % one_line(e)) from None
  if num_gpus == 0:
    return slots_only
  if num_gpus < max_tasks_per_node:
    raise ClusterError('SLURM_STEP_TASKS_PER_NODE puts %d tasks on a node with %d GPUs, and '
                       'TensorFlow\'s SlurmClusterResolver gives every task at least one; '
                       'run at most %d tasks per node (srun --ntasks-per-node), or let Slurm '
                       'choose each task\'s GPUs (srun --gpus-per-task=1)'
                       % (max_tasks_per_node, num_gpus, num_gpus))
  return dict(gpus_per_node=num_gpus)


def _slurm_gpu_note(gpus, visible, environ):
  """What from_slurm's description says of this task's GPUs."""
  if gpus.get('auto_set_gpu', True):
    return 'CUDA_VISIBLE_DEVICES=%s set by the resolver' % visible
  if 'CUDA_VISIBLE_DEVICES' in environ:
    return 'CUDA_VISIBLE_DEVICES=%s as Slurm set it' % environ['CUDA_VISIBLE_DEVICES']
  return 'no GPUs (no nvidia-smi)'


def _slurm_port_message(cluster, host):
  """A Slurm port past 65535: --slurm_port_base + a task's index on its node."""
  ports = [int(h.rpartition(':')[2]) for h in cluster.ps_hosts + cluster.worker_hosts]
  base = min(ports)  # every node's first task listens on the base itself
  return ('--slurm_port_base=%d puts a task at %s, past port 65535: each task listens on '
          'the base + its index among its node\'s tasks (up to +%d here); give '
          '--slurm_port_base=%d or lower' % (base, host, max(ports) - base,
                                             65535 - (max(ports) - base)))


def _named(job):
  """How Slurm's job (None: all of them) is named in check()'s messages."""
  return 'Slurm\'s %s (SLURM_STEP_NODELIST)' % ('%s tasks' % job if job else 'tasks')
