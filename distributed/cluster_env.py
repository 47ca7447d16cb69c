"""The training cluster and this task: the Cluster every source of one makes, its one
check, the flags' own source, and the flags given beside another source.

dist_train.py's cluster is two jobs, 'ps' and 'worker', where worker 0 is the
chief. The engines users already run describe their clusters in their own words;
a module per engine reads them with TensorFlow's own resolvers (none reads a JobSet)
and says the same thing in dist_train.py's:

    cluster = cluster_env.from_flags('worker', 0, '127.0.0.1:2222', '127.0.0.1:2223')
    cluster = cluster_tf_config.from_tf_config()   # Kubernetes (Kubeflow TFJob): TF_CONFIG
    cluster = cluster_slurm.from_slurm(num_ps=1)   # Slurm: SLURM_PROCID, SLURM_STEP_*
    cluster = cluster_jobset.from_jobset()         # Kubernetes (JobSet): JOB_COMPLETION_INDEX...
    print(cluster.description)
    # cluster from TF_CONFIG: 1 ps, 1 chief, 2 workers, 1 evaluator; this task: worker 0
    #   (dist_train.py's worker 1)
    cluster_env.check_agrees(cluster, task_index=...)  # flags given as well must agree

distributed/task_cluster.py picks the source (--cluster). Every Cluster made passes
check() before it is returned: every job has a task, every task its own host:port
with a port 1..65535. Errors are ClusterError, one line naming the variable or flag,
what is wrong and what to do.
"""
import collections
import contextlib
import ipaddress
import os

from training.errors import ClusterError

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

def check(cluster, jobs=None, named=None, bad_port=None):
  """Raises ClusterError unless the cluster can start: the one check of every source.

  from_flags and the sources of cluster_tf_config, cluster_slurm and cluster_jobset all
  end here, so dist_train.py refuses a cluster before it locks, records, writes or serves
  anything. Every job has a task; every task a host:port with a port 1..65535; no two
  tasks one host:port, across jobs too (every loopback name is one host: TensorFlow's
  servers listen on every interface); and this task is one of its job's.

  Args:
    cluster: a Cluster.
    jobs: {job: ['host:port', ...]} as the source names them, where they are more
      than the Cluster's two lists (TF_CONFIG's chief, master, evaluator); by
      default the Cluster's (_jobs_of).
    named: how the source names a job's host list in a message: job -> str, job None
      naming them all; by default the flags' --<job>_hosts.
    bad_port: the message for a host whose port is not 1..65535, host -> str, where the
      source says more than that (Slurm: the port base); by default that alone.

  Raises:
    ClusterError: one line naming the flag or variable to fix, the value, and how.
  """
  jobs = jobs or _jobs_of(cluster)
  named = named or (lambda job: '--%s_hosts' % job)
  source = cluster.source
  seen = {}  # (host, port) -> (job, index) of the first task there
  for job, hosts in jobs.items():
    if not hosts and source == 'flags':
      raise ClusterError('--%s_hosts is empty; give comma-separated host:port entries, e.g. '
                         '--%s_hosts=127.0.0.1:2222' % (job, job))
    if not hosts:
      raise ClusterError('%s lists no task; give it its tasks\' "host:port", or leave the '
                         'job out' % named(job))
    for index, host in enumerate(hosts):
      name, _, port = host.rpartition(':')
      if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(bad_port(host) if bad_port else
                           '%s entry %r is not host:port with a port 1..65535'
                           % (named(job), host))
      place = ('loopback' if is_loopback(host) else name.lower(), int(port))
      if place in seen:
        first_job, first_index = seen[place]
        first_host = jobs[first_job][first_index]
        where = (' and '.join(dict.fromkeys(['--%s_hosts' % first_job, '--%s_hosts' % job]))
                 if source == 'flags' else named(None))
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
          named(cluster.job_name), len(hosts), len(hosts) - 1))


def _jobs_of(cluster):
  """{'ps': cluster.ps_hosts, 'worker': cluster.worker_hosts}, without 'ps' when it has
  no ps task (all-reduce's: task_cluster.refuse_misfits checks that the mode fits)."""
  jobs = {'ps': cluster.ps_hosts, 'worker': cluster.worker_hosts}
  if not cluster.ps_hosts:
    del jobs['ps']
  return jobs


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


# ---- Flags given alongside --------------------------------------------------------

def check_agrees(cluster, job_name=None, task_index=None, ps_hosts=None, worker_hosts=None):
  """Raises ClusterError when a flag given with an environment cluster contradicts it.

  Pass only the flags the user gave (None, '' or [] for the others): each is
  compared with what the environment says.

  Args:
    cluster: a Cluster from cluster_tf_config, cluster_slurm or cluster_jobset.
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
def environment(environ, names):
  """Gives os.environ environ's values of `names` for the block: TensorFlow's
  resolvers read os.environ only, and the sources read a mapping a test can write.
  Nothing changes when environ is os.environ."""
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


def mode_misfit(num_ps, all_reduce):
  """The message refusing ps tasks with --all_reduce, or none without it; or None."""
  if all_reduce and num_ps:
    return ('--all_reduce trains without ps tasks, and the cluster has %d: start the workers '
            'alone (no --ps_hosts, --num_ps=0, no PS replica, --local_cluster=0,W), or drop '
            '--all_reduce' % num_ps)
  if not all_reduce and not num_ps:
    return ('the cluster has no ps task, and without --all_reduce the variables live on ps '
            'tasks: give --all_reduce (the workers average by all-reduce), or add a ps task')
  return None


def too_many_replicas(replicas_to_aggregate, num_workers):
  """The message refusing a --replicas_to_aggregate above the workers there are, or None."""
  if (replicas_to_aggregate or 0) > num_workers:
    return ('--replicas_to_aggregate=%d is more than the %d workers: no update could ever '
            'gather that many gradients' % (replicas_to_aggregate, num_workers))
  return None
