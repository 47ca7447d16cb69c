"""The training cluster of a Kubernetes JobSet (sigs.k8s.io/jobset), from what each pod's
environment says: Kubeflow Trainer v2 runs no TensorFlow and sets no TF_CONFIG.

    cluster = cluster_jobset.from_jobset()
    print(cluster.description)
    # cluster from JobSet cifar10-dist: 1 ps, 3 workers at
    #   cifar10-dist-{ps,worker}-0-<index>.cifar10-dist:2222; this task: worker 0, the chief ...

One replicatedJob per role, 'ps' and 'worker', each 1 Indexed Job whose completion
index is the task's index; the pods' stable DNS names (the JobSet's
network.enableDNSHostnames) are the hosts. The labels JobSet puts on each pod reach
the task as variables through the downward API, as deploy/kubernetes/jobset.yaml sets
them; the sizes of both roles, which a pod cannot see, are given there too
(JOBSET_VARIABLES says where each comes from).
"""
import collections
import os

from distributed.cluster_env import Cluster, check
from training.errors import ClusterError

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

JobSetPod = collections.namedtuple('JobSetPod', [
    'jobset',  # str, the JobSet's name; also the pods' DNS subdomain
    'role',    # 'ps' or 'worker': this pod's replicatedJob
    'index',   # int, this task's index in its role (JOB_COMPLETION_INDEX)
    'sizes',   # {'ps': NUM_PS, 'worker': NUM_WORKERS}
    'port',    # int, the port of every task (TASK_PORT)
])


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
  jobset, role, index, sizes, port = _read_pod(environ)
  hosts = {job: ['%s-%s-0-%d.%s:%d' % (jobset, job, i, jobset, port)
                 for i in range(sizes[job])] for job in JOBSET_ROLES}
  description = (
      'cluster from JobSet %s: %d ps, %d worker%s at %s-{ps,worker}-0-<index>.%s:%d; this '
      'task: %s %d%s (pod %s)' % (
          jobset, sizes['ps'], sizes['worker'], 's' * (sizes['worker'] != 1), jobset, jobset,
          port, role, index, ', the chief' * (role == 'worker' and index == 0),
          hosts[role][index].partition('.')[0]))
  cluster = Cluster(hosts['ps'], hosts['worker'], role, index, 'JobSet', description)
  check(cluster, named=_named)
  return cluster


def _read_pod(environ):
  """This pod's variables (JOBSET_VARIABLES), checked: a JobSetPod, or a ClusterError
  naming the first variable that is unset, not a whole number, or out of range."""
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
    least = 0 if job == 'ps' else 1  # no ps: --all_reduce
    if sizes[job] < least:
      raise ClusterError('%s=%d: the cluster needs at least %d %s task%s; set it to the %s '
                         'replicatedJob\'s completions' % (name, sizes[job], least, job,
                                                           's' * (least != 1), job))
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
  return JobSetPod(jobset, role, index, sizes, port)


def _jobset_int(environ, name):
  """environ[name] as an int >= 0, or a ClusterError naming it."""
  value = environ[name].strip()
  if not value.isascii() or not value.isdigit():
    raise ClusterError('%s=%r is not a whole number; it comes from %s'
                       % (name, environ[name], JOBSET_VARIABLES[name]))
  return int(value)


def _named(job):
  """How the JobSet's job (None: all of them) is named in check()'s messages."""
  return 'the JobSet\'s %s (%s, TASK_PORT)' % (
      '%s tasks' % job if job else 'tasks', JOBSET_ROLES[job] if job else 'NUM_PS, NUM_WORKERS')
