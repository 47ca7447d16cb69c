"""cluster_jobset.py: the cluster of a Kubernetes JobSet, from each pod's variables.

Each test hands the module a pod's variables written by hand, the way
deploy/kubernetes/jobset.yaml, JobSet's labels and Kubernetes would set them, and checks
the cluster dist_train.py would build from it, or the one line refusing it.
"""
import pytest

from distributed import cluster_env, cluster_jobset
from training import errors


def jobset(role, index, num_ps=1, num_workers=3, **change):
  """A JobSet pod's variables: deploy/kubernetes/jobset.yaml's env, JobSet's labels
  substituted, and the JOB_COMPLETION_INDEX Kubernetes sets; change=None unsets one."""
  env = {'JOBSET_NAME': 'cifar10-dist', 'REPLICATED_JOB_NAME': role,
         'REPLICATED_JOB_REPLICAS': '1', 'JOB_COMPLETION_INDEX': str(index),
         'NUM_PS': str(num_ps), 'NUM_WORKERS': str(num_workers), 'TASK_PORT': '2222'}
  for name, value in change.items():
    if value is None:
      del env[name]
    else:
      env[name] = value
  return env


JS_PS = ['cifar10-dist-ps-0-0.cifar10-dist:2222']
JS_WORKERS = ['cifar10-dist-worker-0-%d.cifar10-dist:2222' % i for i in range(3)]


def test_from_jobset_worker_index_0_is_the_chief_hosts_are_pod_dns_names():
  assert cluster_jobset.from_jobset(jobset('worker', 0)) == cluster_env.Cluster(
      JS_PS, JS_WORKERS, 'worker', 0, 'JobSet',
      'cluster from JobSet cifar10-dist: 1 ps, 3 workers at '
      'cifar10-dist-{ps,worker}-0-<index>.cifar10-dist:2222; this task: worker 0, the chief '
      '(pod cifar10-dist-worker-0-0)')


def test_from_jobset_without_ps_is_a_cluster_of_workers_only():
  # NUM_PS=0: --all_reduce's (dist_train.py says whether the mode fits).
  cluster = cluster_jobset.from_jobset(jobset('worker', 1, num_ps=0))
  assert (cluster.ps_hosts, cluster.worker_hosts, cluster.task_index) == ([], JS_WORKERS, 1)


def test_from_jobset_worker_and_ps_same_hosts_own_role_and_index():
  worker = cluster_jobset.from_jobset(jobset('worker', 2))
  ps = cluster_jobset.from_jobset(jobset('ps', 0))
  assert worker[:5] == (JS_PS, JS_WORKERS, 'worker', 2, 'JobSet')
  assert worker.description.endswith('this task: worker 2 (pod cifar10-dist-worker-0-2)')
  assert ps[:5] == (JS_PS, JS_WORKERS, 'ps', 0, 'JobSet')
  assert ps.description.endswith('this task: ps 0 (pod cifar10-dist-ps-0-0)')


def test_from_jobset_every_task_same_hosts_distinct_indexes():
  tasks = [('ps', 0), ('ps', 1), ('worker', 0), ('worker', 1)]
  clusters = [cluster_jobset.from_jobset(jobset(role, i, num_ps=2, num_workers=2,
                                             TASK_PORT='7070')) for role, i in tasks]
  assert {(tuple(c.ps_hosts), tuple(c.worker_hosts)) for c in clusters} == {(
      ('cifar10-dist-ps-0-0.cifar10-dist:7070', 'cifar10-dist-ps-0-1.cifar10-dist:7070'),
      ('cifar10-dist-worker-0-0.cifar10-dist:7070',
       'cifar10-dist-worker-0-1.cifar10-dist:7070'))}
  assert [(c.job_name, c.task_index) for c in clusters] == tasks


@pytest.mark.parametrize('role, index, change, expected', [
    ('worker', 0, {'JOB_COMPLETION_INDEX': None},
     'JOB_COMPLETION_INDEX is not set: --cluster=jobset reads it from Kubernetes, in every pod '
     'of a Job with completionMode: Indexed, as in deploy/kubernetes/jobset.yaml'),
    ('worker', 0, {'JOBSET_NAME': ' '},
     'JOBSET_NAME is not set: --cluster=jobset reads it from the downward API, '
     'metadata.labels[\'jobset.sigs.k8s.io/jobset-name\'], as in '
     'deploy/kubernetes/jobset.yaml'),
    ('ps', 0, {'TASK_PORT': None},
     'TASK_PORT is not set: --cluster=jobset reads it from the manifest: the containerPort '
     'every task listens on, as in deploy/kubernetes/jobset.yaml'),
    ('worker', 0, {'JOB_COMPLETION_INDEX': 'one'},
     'JOB_COMPLETION_INDEX=\'one\' is not a whole number; it comes from Kubernetes, in every '
     'pod of a Job with completionMode: Indexed'),
    ('worker', 0, {'JOB_COMPLETION_INDEX': '-1'},
     'JOB_COMPLETION_INDEX=\'-1\' is not a whole number; it comes from Kubernetes, in every '
     'pod of a Job with completionMode: Indexed'),
    ('worker', 3, {},
     'JOB_COMPLETION_INDEX=3 is past the NUM_WORKERS=3 worker tasks (0..2); set NUM_WORKERS to '
     'the worker replicatedJob\'s completions'),
    ('ps', 1, {},
     'JOB_COMPLETION_INDEX=1 is past the NUM_PS=1 ps tasks (0..0); set NUM_PS to the ps '
     'replicatedJob\'s completions'),
    ('chief', 0, {},
     'REPLICATED_JOB_NAME=\'chief\' is not a role dist_train.py runs; name the JobSet\'s '
     'replicatedJobs ps and worker (worker 0 is the chief)'),
    ('worker', 0, {'REPLICATED_JOB_REPLICAS': '2'},
     'REPLICATED_JOB_REPLICAS=2: the worker replicatedJob makes 2 Jobs; give it replicas: 1 '
     'and its tasks as completions and parallelism of one Indexed Job'),
    ('worker', 0, {'NUM_WORKERS': '0'},
     'NUM_WORKERS=0: the cluster needs at least 1 worker task; set it to the worker '
     'replicatedJob\'s completions'),
    ('ps', 0, {'NUM_WORKERS': 'three'},
     'NUM_WORKERS=\'three\' is not a whole number; it comes from the manifest: the worker '
     'replicatedJob\'s completions'),
    ('ps', 0, {'TASK_PORT': '70000'},
     'TASK_PORT=70000 is not a port 1..65535; set it to the containerPort of the tasks, '
     'e.g. 2222'),
    ('ps', 0, {'TASK_PORT': '2222/TCP'},
     'TASK_PORT=\'2222/TCP\' is not a whole number; it comes from the manifest: the '
     'containerPort every task listens on'),
], ids=['no_completion_index', 'blank_jobset_name', 'no_port', 'index_not_int',
        'index_negative', 'worker_index_past_count', 'ps_index_past_count', 'unknown_role',
        'two_jobs_per_role', 'no_worker', 'count_not_int', 'port_past_65535', 'port_not_int'])
def test_from_jobset_broken_raises_one_line_naming_variable_value_and_fix(role, index, change,
                                                                          expected):
  with pytest.raises(errors.ClusterError) as raised:
    cluster_jobset.from_jobset(jobset(role, index, **change))
  assert str(raised.value) == expected
  assert '\n' not in expected


def test_check_agrees_jobset_disagreeing_flag_names_the_jobset():
  cluster = cluster_jobset.from_jobset(jobset('worker', 1))
  cluster_env.check_agrees(cluster, job_name='worker', task_index=1, worker_hosts=JS_WORKERS)
  with pytest.raises(errors.ClusterError, match=r'^--task_index=0 disagrees with the '
                     r'JobSet \(REPLICATED_JOB_NAME, JOB_COMPLETION_INDEX\), which makes this '
                     r'task worker 1; drop --task_index$'):
    cluster_env.check_agrees(cluster, task_index=0)
