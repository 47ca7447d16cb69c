"""The training cluster and this task: from the flags, or the environment the job runs in.

dist_train.py's cluster is two jobs, 'ps' and 'worker', where worker 0 is the
chief. The engines users already run describe their clusters in their own words;
this module reads them with TensorFlow's own resolvers (none reads a JobSet) and
says the same thing in dist_train.py's:

    cluster = cluster_env.from_flags('worker', 0, '127.0.0.1:2222', '127.0.0.1:2223')
    cluster = cluster_env.from_tf_config()       # Kubernetes (Kubeflow TFJob): TF_CONFIG
    cluster = cluster_env.from_slurm(num_ps=1)   # Slurm: SLURM_PROCID, SLURM_STEP_*
    cluster = cluster_env.from_jobset()          # Kubernetes (JobSet): JOB_COMPLETION_INDEX...
    print(cluster.description)
    # cluster from TF_CONFIG: 1 ps, 1 chief, 2 workers, 1 evaluator; this task: worker 0
    #   (dist_train.py's worker 1)
    cluster_env.check_agrees(cluster, task_index=...)  # flags given as well must agree

TF_CONFIG: the chief (type 'chief', or 'master', TFJob's older name for it)
comes first in worker_hosts, then the 'worker' tasks, so that worker 0 is the
chief; every task computes the same order, so every task's cluster spec is the
same. Without a chief, TF_CONFIG's worker 0 leads. An 'evaluator' task only
reads checkpoints: it is in no job of the training cluster.

Slurm: one srun step starts every task; the first num_ps ranks (SLURM_PROCID) are
the ps tasks, the rest the workers, the first of them the chief. Each task
listens on port_base + its index among the tasks of its node.

JobSet: one replicatedJob per role, 'ps' and 'worker', each 1 Indexed Job whose
completion index is the task's index; the pods' stable DNS names (the JobSet's
network.enableDNSHostnames) are the hosts. The labels JobSet puts on each pod
reach the task as variables through the downward API, as
deploy/kubernetes/jobset.yaml sets them; the sizes of both roles, which a pod
cannot see, are given there too (JOBSET_VARIABLES says where each comes from).

Every Cluster made here passes check() before it is returned: every job has a
task, every task its own host:port with a port 1..65535. Errors are ClusterError,
one line naming the variable or flag, what is wrong and what to do.
"""
import collections
import contextlib
import ipaddress
import json
import os
import re
import shutil

import tensorflow as tf
# The resolver's own readers of Slurm's node and task lists, and its GPU count.
from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

from training.directory import parse_json
from training.errors import ClusterError, one_line

SLURM_PORT_BASE = 8888   # a Slurm task listens on this + its index among its node's tasks
SLURM_MAX_TASKS = 1 << 16  # more tasks in one step is a mistake, not a cluster to expand
TASK_TYPES = ('chief', 'master', 'worker', 'ps', 'evaluator')  # what TF_CONFIG may name
SLURM_VARIABLES = ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS', 'SLURM_STEP_NODELIST',
                   'SLURM_STEP_TASKS_PER_NODE')
# What from_jobset reads, and where from; deploy/kubernetes/jobset.yaml sets each.
JOBSET_VARIABLES = {
    'JOBSET_NAME': 'the downward API, metadata.labels[\'jobset.sigs.k8s.io/jobset-name\']',
    'REPLICATED_JOB_NAME': ('the downward API, '
                            'metadata.labels[\'jobset.sigs.k8s.io/replicatedjob-name\']'),
    'REPLICATED_JOB_REPLICAS': (
        'the downward API, metadata.labels[\'jobset.sigs.k8s.io/replicatedjob-replicas\']'),
    'JOB_COMPLETION_INDEX': 'Kubernetes, in every pod of a Job with completionMode: Indexed',
    'NUM_PS': 'the manifest: the ps replicatedJob\'s completions',
    'NUM_WORKERS': 'the manifest: the worker replicatedJob\'s completions',
    'TASK_PORT': 'the manifest: the containerPort every task listens on',
}
JOBSET_ROLES = {'ps': 'NUM_PS', 'worker': 'NUM_WORKERS'}  # replicatedJob -> its size
TF_CONFIG_EXAMPLE = ('{"cluster": {"ps": ["ps-0:2222"], "chief": ["chief-0:2222"], '
                     '"worker": ["worker-0:2222"]}, "task": {"type": "worker", "index": 0}}')

Cluster = collections.namedtuple('Cluster', [
    'ps_hosts',      # ['host:port', ...], ps task i at [i]
    'worker_hosts',  # ['host:port', ...], the chief first: worker 0
    'job_name',      # 'ps', 'worker' or 'evaluator' (no training job: reads checkpoints)
    'task_index',    # int: this task's index in job_name, in the numbering above
    'source',        # 'flags', 'TF_CONFIG', 'Slurm' or 'JobSet'
    'description',   # one line for start-up: the jobs, their sizes, this task
])


SECURITY_WARNING = (
    'WARNING: TensorFlow servers have no authentication and no encryption, and every '
    'task listens on all network interfaces of its machine on its port, whatever host '
    'the cluster spec names: anyone who can reach %s can run any graph there, '
    'reading and writing files as this user. Firewall the ports of --ps_hosts and '
    '--worker_hosts. TensorFlow\'s own advice on running graphs over gRPC: '
    'https://github.com/tensorflow/tensorflow/blob/master/SECURITY.md')


# ---- Every cluster: one check, before anything is locked, written or served ------

def check(cluster, jobs=None):
  """Raises ClusterError unless the cluster can start: the one check of every source.

  from_flags, from_tf_config, from_slurm and from_jobset all end here, so dist_train.py
  refuses a cluster before it locks, records, writes or serves anything. Every job has a
  task; every task a host:port with a port 1..65535 (under Slurm: --slurm_port_base
  + the task's index among its node's tasks); no two tasks one host:port, across
  jobs too (every loopback name is one host: TensorFlow's servers listen on every
  interface); and this task is one of its job's.

  Args:
    cluster: a Cluster.
    jobs: {job: ['host:port', ...]} as the source names them, where they are more
      than the Cluster's two lists (TF_CONFIG's chief, master, evaluator); by
      default {'ps': cluster.ps_hosts, 'worker': cluster.worker_hosts}.

  Raises:
    ClusterError: one line naming the flag or variable to fix, the value, and how.
  """
  if jobs is None:
    jobs = {'ps': cluster.ps_hosts, 'worker': cluster.worker_hosts}
  source = cluster.source
  seen = {}  # (host, port) -> (job, index) of the first task there
  for job, hosts in jobs.items():
    if not hosts and source == 'flags':
      raise ClusterError('--%s_hosts is empty; give comma-separated host:port entries, e.g. '
                         '--%s_hosts=127.0.0.1:2222' % (job, job))
    if not hosts:
      raise ClusterError('%s lists no task; give it its tasks\' "host:port", or leave the '
                         'job out' % _job_named(source, job))
    for index, host in enumerate(hosts):
      name, _, port = host.rpartition(':')
      if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(_slurm_port_message(cluster, host) if source == 'Slurm' else
                           '%s entry %r is not host:port with a port 1..65535'
                           % (_job_named(source, job), host))
      place = ('loopback' if is_loopback(host) else name.lower(), int(port))
      if place in seen:
        first_job, first_index = seen[place]
        first_host = jobs[first_job][first_index]
        where = (' and '.join(dict.fromkeys(['--%s_hosts' % first_job, '--%s_hosts' % job]))
                 if source == 'flags' else _job_named(source, None))
        at = (host if host == first_host else
              '%s and %s, one port of one machine' % (first_host, host))
        raise ClusterError('%s: %s %d and %s %d are both at %s; each task listens on a port '
                           'of its own: give every task its own host:port'
                           % (where, first_job, first_index, job, index, at))
      seen[place] = (job, index)
  if cluster.job_name in ('ps', 'worker'):  # an evaluator is in no job
    hosts = cluster.ps_hosts if cluster.job_name == 'ps' else cluster.worker_hosts
    if not 0 <= cluster.task_index < len(hosts):
      raise ClusterError('%s is not a %s task: %s lists %d (0..%d)' % (
          '--task_index=%d' % cluster.task_index if source == 'flags' else
          'this task, %s %d,' % (cluster.job_name, cluster.task_index), cluster.job_name,
          _job_named(source, cluster.job_name), len(hosts), len(hosts) - 1))


def _job_named(source, job):
  """How a source names a job's host list in check()'s messages; job None: all of them."""
  if source == 'flags':
    return '--%s_hosts' % job
  if source == 'TF_CONFIG':
    return 'TF_CONFIG\'s "cluster"' + (' job "%s"' % job if job else '')
  if source == 'JobSet':
    return 'the JobSet\'s %s (%s, TASK_PORT)' % (
        '%s tasks' % job if job else 'tasks',
        JOBSET_ROLES[job] if job else 'NUM_PS, NUM_WORKERS')
  return 'Slurm\'s %s (SLURM_STEP_NODELIST)' % ('%s tasks' % job if job else 'tasks')


def _slurm_port_message(cluster, host):
  """A Slurm port past 65535: --slurm_port_base + a task's index on its node."""
  ports = [int(h.rpartition(':')[2]) for h in cluster.ps_hosts + cluster.worker_hosts]
  base = min(ports)  # every node's first task listens on the base itself
  return ('--slurm_port_base=%d puts a task at %s, past port 65535: each task listens on '
          'the base + its index among its node\'s tasks (up to +%d here); give '
          '--slurm_port_base=%d or lower' % (base, host, max(ports) - base,
                                             65535 - (max(ports) - base)))


# ---- Flags ----------------------------------------------------------------------

def from_flags(job_name, task_index, ps_hosts, worker_hosts, allow_nonloopback=False):
  """The Cluster that --job_name, --task_index, --ps_hosts and --worker_hosts name.

  Raises:
    ClusterError: a host list check() refuses, a host other than loopback without
      allow_nonloopback, or a task index outside its job.
  """
  cluster = Cluster(parse_hosts(ps_hosts), parse_hosts(worker_hosts), job_name, task_index,
                    'flags', None)
  check(cluster)
  if not allow_nonloopback:
    check_loopback(cluster.ps_hosts, cluster.worker_hosts)
  return cluster


def exposure_warning(cluster):
  """SECURITY_WARNING for this task's port."""
  hosts = cluster.ps_hosts if cluster.job_name == 'ps' else cluster.worker_hosts
  return SECURITY_WARNING % ('port %s of this machine (this task, %s %d)' % (
      hosts[cluster.task_index].rpartition(':')[2], cluster.job_name, cluster.task_index))


def parse_hosts(value):
  """'h1:p1, h2:p2' -> ['h1:p1', 'h2:p2']; '' -> []. check() says what is wrong in them."""
  return [host.strip() for host in value.split(',')] if value.strip() else []


def is_loopback(host):
  """True for 'localhost:p', '127.x.y.z:p' and '[::1]:p'; a DNS name could be anywhere."""
  name = host.rpartition(':')[0].strip('[]')
  if name == 'localhost':
    return True
  try:
    return ipaddress.ip_address(name).is_loopback
  except ValueError:
    return False


def check_loopback(ps_hosts, worker_hosts):
  """Raises ClusterError naming the first host that is not loopback, and why it matters."""
  for flag_name, hosts in (('ps_hosts', ps_hosts), ('worker_hosts', worker_hosts)):
    for host in hosts:
      if not is_loopback(host):
        raise ClusterError(
            '--%s names %s, which is not a loopback address. TensorFlow servers have no '
            'authentication: anyone who can reach that port can run any code there as '
            'this user. If every machine that can reach these ports is trusted (a '
            'private cluster network, an SSH tunnel), pass --allow_nonloopback_hosts.'
            % (flag_name, host))


# ---- Kubernetes: TF_CONFIG ------------------------------------------------------

def from_tf_config(environ=os.environ):
  """The cluster TF_CONFIG describes, or None when TF_CONFIG is unset or empty.

  TF_CONFIG is JSON: {"cluster": {"ps": [...], "chief": [...], "worker": [...],
  "evaluator": [...]}, "task": {"type": "worker", "index": 0}}, set for every
  pod by Kubeflow's TFJob. Read by TensorFlow's TFConfigClusterResolver.

  Args:
    environ: the environment to read (a mapping); os.environ by default.

  Returns:
    A Cluster with source 'TF_CONFIG', or None.

  Raises:
    ClusterError: TF_CONFIG is not JSON, lacks "cluster" or "task", names an
      unknown task type, two chiefs (or a chief and a master), no ps task, a
      task that is not in its job, or a cluster check() refuses (an empty job, a
      port outside 1..65535, two tasks at one host:port).
  """
  text = environ.get('TF_CONFIG', '')
  if not text.strip():
    return None
  jobs, task_type, task_id = _read_tf_config(text, environ)
  _check_tf_config_task(jobs, task_type, task_id)
  cluster = _tf_config_cluster(jobs, task_type, task_id)
  check(cluster, jobs)
  return cluster


def _read_tf_config(text, environ):
  """TF_CONFIG through TFConfigClusterResolver: ({job: [host:port]}, task type, index).

  Raises:
    ClusterError: not JSON, no cluster or task, a job dist_train.py does not run,
      skipped indexes, two chiefs, no ps, no chief and no worker.
  """
  try:
    config = parse_json(text)  # its depth checked: 200,000 levels would recurse out
  except ValueError as e:
    raise ClusterError('TF_CONFIG is not JSON (%s); set it to JSON such as %s, or unset it '
                       'to give the cluster with flags' % (e, TF_CONFIG_EXAMPLE)) from None
  if not isinstance(config, dict) or not config.get('cluster'):
    raise ClusterError('TF_CONFIG has no "cluster": it must map each job to its host:port '
                       'list, as in %s' % TF_CONFIG_EXAMPLE)
  if not isinstance(config.get('task'), dict):
    raise ClusterError('TF_CONFIG has no "task" object: it must say which task this is, e.g. '
                       '"task": {"type": "worker", "index": 0}')
  index = config['task'].get('index')
  if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
    # The resolver takes int() of it: 0.5 would be task 0, "1" task 1.
    raise ClusterError('TF_CONFIG cannot be read as a cluster (its "task" "index" is %s, not '
                       'a whole number); give each job a list of "host:port" strings and the '
                       'task an integer "index", as in %s'
                       % (json.dumps(index), TF_CONFIG_EXAMPLE))
  with _environment(environ, ['TF_CONFIG']):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    try:
      spec = resolver.cluster_spec()
      task_type, task_id = resolver.task_type, resolver.task_id
    except (TypeError, ValueError) as e:
      raise ClusterError('TF_CONFIG cannot be read as a cluster (%s); give each job a list '
                         'of "host:port" strings and the task an integer "index", as in %s'
                         % (one_line(e), TF_CONFIG_EXAMPLE)) from None
  jobs = {}
  for job in spec.jobs:
    if job not in TASK_TYPES:
      raise ClusterError('TF_CONFIG\'s "cluster" has a job %r that dist_train.py does not '
                         'run; use %s' % (job, ', '.join(TASK_TYPES)))
    jobs[job] = spec.job_tasks(job) if spec.num_tasks(job) else []  # check() says it
    if None in jobs[job]:
      raise ClusterError('TF_CONFIG\'s "cluster" job %r skips task indexes (%s); list its '
                         'tasks 0, 1, ... in order' % (job, spec.as_dict()[job]))
  chiefs = jobs.get('chief', []) + jobs.get('master', [])
  if len(chiefs) > 1:
    raise ClusterError('TF_CONFIG names %d chiefs (%s); a job has one chief: give one '
                       'task of type "chief" (or "master", not both)'
                       % (len(chiefs), ', '.join(chiefs)))
  if not jobs.get('ps'):
    raise ClusterError('TF_CONFIG\'s "cluster" has no "ps" task; dist_train.py keeps the '
                       'variables on ps tasks: add a PS replica (at least 1)')
  if not chiefs and not jobs.get('worker'):
    raise ClusterError('TF_CONFIG\'s "cluster" has no "chief" and no "worker" task; add '
                       'a Chief replica, or Worker replicas, to train')
  return jobs, task_type, task_id


def _check_tf_config_task(jobs, task_type, task_id):
  """Raises ClusterError unless TF_CONFIG's task is one of its cluster's."""
  if task_type is None or task_id is None:
    raise ClusterError('TF_CONFIG\'s "task" lacks "%s": it must say which task this is, '
                       'e.g. "task": {"type": "worker", "index": 0}'
                       % ('type' if task_type is None else 'index'))
  if task_type not in TASK_TYPES:
    raise ClusterError('TF_CONFIG\'s task type %r is not one dist_train.py runs; use %s'
                       % (task_type, ', '.join(TASK_TYPES)))
  num_tasks = len(jobs.get(task_type, []))
  in_cluster = task_type != 'evaluator' or 'evaluator' in jobs  # TFJob lists it or not
  if task_id < 0 or (in_cluster and task_id >= num_tasks):
    raise ClusterError('TF_CONFIG\'s task is %s %d, but "cluster" lists %d %s task(s)%s; '
                       'fix the task index or the cluster' % (
                           task_type, task_id, num_tasks, task_type,
                           ' (0..%d)' % (num_tasks - 1) if num_tasks else ''))


def _tf_config_cluster(jobs, task_type, task_id):
  """dist_train.py's Cluster for a checked TF_CONFIG: the chief first among the workers."""
  chiefs = jobs.get('chief', []) + jobs.get('master', [])
  worker_hosts = chiefs + jobs.get('worker', [])
  if task_type in ('chief', 'master'):
    job_name, task_index = 'worker', 0
  elif task_type == 'worker':
    job_name, task_index = 'worker', len(chiefs) + task_id
  else:
    job_name, task_index = task_type, task_id
  counts = ['%d %s%s' % (len(jobs[job]), job, 's' * (job != 'ps' and len(jobs[job]) != 1))
            for job in ('ps', 'chief', 'master', 'worker', 'evaluator') if jobs.get(job)]
  this = '%s %d' % (task_type, task_id)
  if job_name == 'worker' and (task_type, task_id) != ('worker', task_index):
    this += ' (dist_train.py\'s worker %d%s)' % (task_index, ', the chief' * (task_index == 0))
  elif job_name == 'worker' and task_index == 0:
    this += ' (the chief)'
  description = 'cluster from TF_CONFIG: %s; this task: %s' % (', '.join(counts), this)
  return Cluster(jobs['ps'], worker_hosts, job_name, task_index, 'TF_CONFIG', description)


# ---- Kubernetes: JobSet ---------------------------------------------------------

def from_jobset(environ=os.environ):
  """The cluster of this JobSet (sigs.k8s.io/jobset): replicatedJobs 'ps' and 'worker'.

  The layout deploy/kubernetes/jobset.yaml gives: each role is one replicatedJob
  with replicas: 1, an Indexed Job of NUM_PS (NUM_WORKERS) completions run in
  parallel, and network.enableDNSHostnames with the default subdomain (the
  JobSet's name: leave network.subdomain unset). So task i of a role is the pod named
  <jobset>-<role>-0-<i>.<jobset>, listening on TASK_PORT; worker 0 is the chief.
  Every task computes the same lists, so every task's cluster spec is the same.

  Reads (JOBSET_VARIABLES says where each comes from):
    JOBSET_NAME              the JobSet's name; also the pods' DNS subdomain
    REPLICATED_JOB_NAME      this task's role: 'ps' or 'worker'
    REPLICATED_JOB_REPLICAS  Jobs of this replicatedJob; must be 1
    JOB_COMPLETION_INDEX     this task's index in its role, 0..NUM_PS-1 (NUM_WORKERS-1)
    NUM_PS, NUM_WORKERS      the ps and worker tasks (the replicatedJobs' completions),
                             at least 1 each
    TASK_PORT                the port of every task, 1..65535

  Args:
    environ: the environment to read (a mapping); os.environ by default.

  Returns:
    A Cluster with source 'JobSet'.

  Raises:
    ClusterError: one line naming the variable, its value and the fix: a variable
      unset or empty, a count or index that is not a whole number, a role other
      than ps and worker, a replicatedJob of more than one Job, no ps or no worker
      task, a port outside 1..65535, an index past its role's count.
  """
  for name, where in JOBSET_VARIABLES.items():
    if not environ.get(name, '').strip():
      raise ClusterError('%s is not set: --cluster=jobset reads it from %s, as in '
                         'deploy/kubernetes/jobset.yaml' % (name, where))
  jobset = environ['JOBSET_NAME'].strip()
  role = environ['REPLICATED_JOB_NAME'].strip()
  if role not in JOBSET_ROLES:
    raise ClusterError('REPLICATED_JOB_NAME=%r is not a role dist_train.py runs; name the '
                       'JobSet\'s replicatedJobs ps and worker (worker 0 is the chief)' % role)
  replicas = _jobset_int(environ, 'REPLICATED_JOB_REPLICAS')
  if replicas != 1:
    raise ClusterError('REPLICATED_JOB_REPLICAS=%d: the %s replicatedJob makes %d Jobs; give '
                       'it replicas: 1 and its tasks as completions and parallelism of one '
                       'Indexed Job' % (replicas, role, replicas))
  sizes = {job: _jobset_int(environ, name) for job, name in JOBSET_ROLES.items()}
  for job, name in JOBSET_ROLES.items():
    if sizes[job] < 1:
      raise ClusterError('%s=%d: the cluster needs at least 1 %s task; set it to the %s '
                         'replicatedJob\'s completions' % (name, sizes[job], job, job))
  port = _jobset_int(environ, 'TASK_PORT')
  if not 0 < port < 65536:
    raise ClusterError('TASK_PORT=%d is not a port 1..65535; set it to the containerPort '
                       'of the tasks, e.g. 2222' % port)
  index = _jobset_int(environ, 'JOB_COMPLETION_INDEX')
  if index >= sizes[role]:
    raise ClusterError('JOB_COMPLETION_INDEX=%d is past the %s=%d %s tasks (0..%d); set %s '
                       'to the %s replicatedJob\'s completions' % (
                           index, JOBSET_ROLES[role], sizes[role], role, sizes[role] - 1,
                           JOBSET_ROLES[role], role))
  hosts = {job: ['%s-%s-0-%d.%s:%d' % (jobset, job, i, jobset, port)
                 for i in range(sizes[job])] for job in JOBSET_ROLES}
  description = (
      'cluster from JobSet %s: %d ps, %d worker%s at %s-{ps,worker}-0-<index>.%s:%d; this '
      'task: %s %d%s (pod %s)' % (
          jobset, sizes['ps'], sizes['worker'], 's' * (sizes['worker'] != 1), jobset, jobset,
          port, role, index, ', the chief' * (role == 'worker' and index == 0),
          hosts[role][index].partition('.')[0]))
  cluster = Cluster(hosts['ps'], hosts['worker'], role, index, 'JobSet', description)
  check(cluster)
  return cluster


def _jobset_int(environ, name):
  """environ[name] as an int >= 0, or a ClusterError naming it."""
  value = environ[name].strip()
  if not value.isascii() or not value.isdigit():
    raise ClusterError('%s=%r is not a whole number; it comes from %s'
                       % (name, environ[name], JOBSET_VARIABLES[name]))
  return int(value)


# ---- Slurm ----------------------------------------------------------------------

def _slurm_gpu_note(gpus, visible, environ):
  """What from_slurm's description says of this task's GPUs."""
  if gpus.get('auto_set_gpu', True):
    return 'CUDA_VISIBLE_DEVICES=%s set by the resolver' % visible
  if 'CUDA_VISIBLE_DEVICES' in environ:
    return 'CUDA_VISIBLE_DEVICES=%s as Slurm set it' % environ['CUDA_VISIBLE_DEVICES']
  return 'no GPUs (no nvidia-smi)'


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
  per_node_text = environ['SLURM_STEP_TASKS_PER_NODE']
  gpus = _slurm_gpus(environ, max(tasks_per_node))
  port_base, ports_note = _slurm_port_base(environ, port_base, max(tasks_per_node))
  with _environment(environ, SLURM_VARIABLES + ('CUDA_VISIBLE_DEVICES', 'PATH')):
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
  num_workers = num_tasks - num_ps
  description = ('cluster from Slurm (SLURM_*): %d ps, %d worker%s on %d node%s (%s); '
                 'this task: %s %d%s (SLURM_PROCID=%d); %s; %s' % (
                     num_ps, num_workers, 's' * (num_workers != 1), len(nodes),
                     's' * (len(nodes) != 1), nodelist, job_name, task_index,
                     ', the chief' * (job_name == 'worker' and task_index == 0), rank,
                     ports_note, _slurm_gpu_note(gpus, visible, environ)))
  cluster = Cluster(spec.job_tasks('ps'), spec.job_tasks('worker'), job_name, task_index,
                    'Slurm', description)
  check(cluster)
  return cluster


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
  if num_ps < 1:
    raise ClusterError('--num_ps must be at least 1 for a Slurm cluster, got %d' % num_ps)
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
                       'runs in one step (SLURM_MAX_TASKS in distributed/cluster_env.py); '
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
  with _environment(environ, ['PATH']):
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


# ---- Flags given alongside --------------------------------------------------------

def check_agrees(cluster, job_name=None, task_index=None, ps_hosts=None, worker_hosts=None):
  """Raises ClusterError when a flag given with an environment cluster contradicts it.

  Pass only the flags the user gave (None, '' or [] for the others): each is
  compared with what the environment says.

  Args:
    cluster: a Cluster from from_tf_config(), from_slurm() or from_jobset().
    job_name: str or None, --job_name.
    task_index: int or None, --task_index.
    ps_hosts, worker_hosts: 'h:p,h:p' or ['h:p', ...], or None.
  """
  said = {'TF_CONFIG': {'task': 'TF_CONFIG', 'hosts': 'TF_CONFIG'},
          'Slurm': {'task': 'Slurm (SLURM_PROCID)',
                    'hosts': 'Slurm (SLURM_STEP_NODELIST)'},
          'JobSet': {'task': 'the JobSet (REPLICATED_JOB_NAME, JOB_COMPLETION_INDEX)',
                     'hosts': 'the JobSet (NUM_PS, NUM_WORKERS, TASK_PORT)'}}[cluster.source]
  if job_name and job_name != cluster.job_name:
    raise ClusterError('--job_name=%s disagrees with %s, which makes this task %s %d; drop '
                       '--job_name' % (job_name, said['task'], cluster.job_name,
                                       cluster.task_index))
  if task_index is not None and task_index != cluster.task_index:
    raise ClusterError('--task_index=%d disagrees with %s, which makes this task %s %d; '
                       'drop --task_index' % (task_index, said['task'], cluster.job_name,
                                              cluster.task_index))
  for flag_name, given, found in (('ps_hosts', ps_hosts, cluster.ps_hosts),
                                  ('worker_hosts', worker_hosts, cluster.worker_hosts)):
    if isinstance(given, str):
      given = [host.strip() for host in given.split(',') if host.strip()]
    if given and list(given) != list(found):
      raise ClusterError('--%s=%s disagrees with %s, which gives %s; drop --%s'
                         % (flag_name, ','.join(given), said['hosts'], ','.join(found),
                            flag_name))


# ---- Helpers --------------------------------------------------------------------

@contextlib.contextmanager
def _environment(environ, names):
  """Gives os.environ environ's values of `names` for the block; TensorFlow's
  resolvers read os.environ only. Nothing changes when environ is os.environ."""
  if environ is os.environ:
    yield
    return
  saved = {name: os.environ.get(name) for name in names}
  try:
    for name in names:
      if name in environ:
        os.environ[name] = environ[name]
      else:
        os.environ.pop(name, None)
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


def too_many_replicas(replicas_to_aggregate, num_workers):
  """The message refusing a --replicas_to_aggregate above the workers there are, or None."""
  if (replicas_to_aggregate or 0) > num_workers:
    return ('--replicas_to_aggregate=%d is more than the %d workers: no update could ever '
            'gather that many gradients' % (replicas_to_aggregate, num_workers))
  return None
