"""The training cluster from TF_CONFIG, as Kubeflow's TFJob sets it in every pod.

    cluster = cluster_tf_config.from_tf_config()
    print(cluster.description)
    # cluster from TF_CONFIG: 1 ps, 1 chief, 2 workers, 1 evaluator; this task: worker 0
    #   (dist_train.py's worker 1)

The chief (type 'chief', or 'master', TFJob's older name for it) comes first in
worker_hosts, then the 'worker' tasks, so that worker 0 is the chief; every task
computes the same order, so every task's cluster spec is the same. Without a chief,
TF_CONFIG's worker 0 leads. An 'evaluator' task only reads checkpoints: it is in no
job of the training cluster.
"""
import json
import os

import tensorflow as tf

from distributed.cluster_env import Cluster, check, environment
from training.directory import parse_json
from training.errors import ClusterError, one_line

TASK_TYPES = ('chief', 'master', 'worker', 'ps', 'evaluator')  # what TF_CONFIG may name
TF_CONFIG_EXAMPLE = ('{"cluster": {"ps": ["ps-0:2222"], "chief": ["chief-0:2222"], '
                     '"worker": ["worker-0:2222"]}, "task": {"type": "worker", "index": 0}}')


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
  check(cluster, jobs, named=_named)
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
  with environment(environ, ['TF_CONFIG']):
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
  return Cluster(jobs.get('ps', []), worker_hosts, job_name, task_index, 'TF_CONFIG',
                 description)


def _named(job):
  """How TF_CONFIG's job (None: all of them) is named in check()'s messages."""
  return 'TF_CONFIG\'s "cluster"' + (' job "%s"' % job if job else '')
