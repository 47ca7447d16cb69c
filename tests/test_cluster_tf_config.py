"""cluster_tf_config.py: the cluster from TF_CONFIG, as Kubeflow's TFJob sets it.

Each test hands the module a TF_CONFIG written by hand, the way TFJob would set it, and
checks the cluster dist_train.py would build from it, or the one line refusing it.
"""
import json

import pytest

from distributed import cluster_env, cluster_tf_config
from training import errors
import helpers

PS, CHIEF, W0, W1, EVAL = 'ps-0:2222', 'chief-0:2222', 'worker-0:2222', 'worker-1:2222', 'ev-0:2222'


def tf_config(cluster, task_type, index):
  return {'TF_CONFIG': helpers.tf_config(cluster, task_type, index)}


def test_from_tf_config_unset_or_empty_is_none():
  assert cluster_tf_config.from_tf_config({}) is None
  assert cluster_tf_config.from_tf_config({'TF_CONFIG': ''}) is None
  assert cluster_tf_config.from_tf_config({'TF_CONFIG': '  '}) is None


def test_from_tf_config_chief_and_workers_chief_is_worker_0():
  jobs = {'ps': [PS], 'chief': [CHIEF], 'worker': [W0, W1], 'evaluator': [EVAL]}
  cluster = cluster_tf_config.from_tf_config(tf_config(jobs, 'worker', 0))
  assert cluster == cluster_env.Cluster(
      [PS], [CHIEF, W0, W1], 'worker', 1, 'TF_CONFIG',
      'cluster from TF_CONFIG: 1 ps, 1 chief, 2 workers, 1 evaluator; this task: worker 0 '
      '(dist_train.py\'s worker 1)')
  chief = cluster_tf_config.from_tf_config(tf_config(jobs, 'chief', 0))
  assert (chief.job_name, chief.task_index) == ('worker', 0)
  assert chief.description.endswith('this task: chief 0 (dist_train.py\'s worker 0, the chief)')


def test_from_tf_config_master_is_the_chief():
  jobs = {'ps': [PS], 'master': [CHIEF], 'worker': [W0]}
  master = cluster_tf_config.from_tf_config(tf_config(jobs, 'master', 0))
  assert master[:4] == ([PS], [CHIEF, W0], 'worker', 0)
  worker = cluster_tf_config.from_tf_config(tf_config(jobs, 'worker', 0))
  assert worker[:4] == ([PS], [CHIEF, W0], 'worker', 1)


def test_from_tf_config_no_chief_worker_0_leads():
  jobs = {'ps': [PS], 'worker': [W0, W1]}
  first = cluster_tf_config.from_tf_config(tf_config(jobs, 'worker', 0))
  second = cluster_tf_config.from_tf_config(tf_config(jobs, 'worker', 1))
  assert first[:4] == ([PS], [W0, W1], 'worker', 0)
  assert second[:4] == ([PS], [W0, W1], 'worker', 1)
  assert first.description == ('cluster from TF_CONFIG: 1 ps, 2 workers; this task: '
                               'worker 0 (the chief)')


def test_from_tf_config_every_task_same_hosts_distinct_indexes():
  jobs = {'ps': [PS, 'ps-1:2222'], 'chief': [CHIEF], 'worker': [W0, W1]}
  tasks = [('ps', 0), ('ps', 1), ('chief', 0), ('worker', 0), ('worker', 1)]
  clusters = [cluster_tf_config.from_tf_config(tf_config(jobs, t, i)) for t, i in tasks]
  assert {(tuple(c.ps_hosts), tuple(c.worker_hosts)) for c in clusters} == {
      ((PS, 'ps-1:2222'), (CHIEF, W0, W1))}
  assert [(c.job_name, c.task_index) for c in clusters] == [
      ('ps', 0), ('ps', 1), ('worker', 0), ('worker', 1), ('worker', 2)]


@pytest.mark.parametrize('listed', [False, True], ids=['not_listed', 'listed'])
def test_from_tf_config_evaluator_outside_training_cluster(listed):
  # TFJob leaves the evaluator out of "cluster"; TensorFlow's own examples too.
  jobs = {'ps': [PS], 'chief': [CHIEF], 'worker': [W0]}
  if listed:
    jobs['evaluator'] = [EVAL]
  cluster = cluster_tf_config.from_tf_config(tf_config(jobs, 'evaluator', 0))
  assert cluster[:4] == ([PS], [CHIEF, W0], 'evaluator', 0)
  assert EVAL not in cluster.worker_hosts
  assert cluster.description.endswith('this task: evaluator 0')


GOOD = {'ps': [PS], 'worker': [W0]}


@pytest.mark.parametrize('text, named', [
    ('{"cluster": ', 'is not JSON'),
    ('["ps-0:2222"]', 'has no "cluster"'),
    (json.dumps({'task': {'type': 'worker', 'index': 0}}), 'has no "cluster"'),
    (json.dumps({'cluster': GOOD}), 'has no "task"'),
    (json.dumps({'cluster': GOOD, 'task': {'type': 'worker', 'index': 1}}),
     'task is worker 1, but "cluster" lists 1 worker task(s) (0..0)'),
    (json.dumps({'cluster': GOOD, 'task': {'type': 'ps', 'index': -1}}), 'task is ps -1'),
    (json.dumps({'cluster': GOOD, 'task': {'type': 'boss', 'index': 0}}),
     'task type \'boss\' is not one'),
    (json.dumps({'cluster': dict(GOOD, boss=['b:1']), 'task': {'type': 'worker', 'index': 0}}),
     'has a job \'boss\''),
    (json.dumps({'cluster': dict(GOOD, chief=['c:1'], master=['m:1']),
                 'task': {'type': 'worker', 'index': 0}}), 'names 2 chiefs (c:1, m:1)'),
    (json.dumps({'cluster': dict(GOOD, chief=['c:1', 'd:1']),
                 'task': {'type': 'chief', 'index': 0}}), 'names 2 chiefs'),
    (json.dumps({'cluster': GOOD, 'task': {'index': 0}}), 'lacks "type"'),
    (json.dumps({'cluster': GOOD, 'task': {'type': 'worker'}}), 'lacks "index"'),
    (json.dumps({'cluster': GOOD, 'task': {'type': 'worker', 'index': 'one'}}),
     'cannot be read as a cluster'),
    (json.dumps({'cluster': {'ps': [PS], 'worker': W0},
                 'task': {'type': 'worker', 'index': 0}}), 'cannot be read as a cluster'),
    (json.dumps({'cluster': {'ps': [PS], 'worker': {'0': W0, '2': W1}},
                 'task': {'type': 'worker', 'index': 0}}), 'skips task indexes'),
    (json.dumps({'cluster': {'ps': [], 'worker': [W0]}, 'task': {'type': 'worker',
                                                                 'index': 0}}),
     '"cluster" job "ps" lists no task; give it its tasks\' "host:port", or leave the job out'),
    (json.dumps({'cluster': {'ps': [PS], 'chief': [CHIEF], 'worker': []},
                 'task': {'type': 'chief', 'index': 0}}),
     '"cluster" job "worker" lists no task; give it its tasks\' "host:port", or leave the job '
     'out'),
    (json.dumps({'cluster': {'ps': ['ps-0:99999'], 'worker': [W0]},
                 'task': {'type': 'worker', 'index': 0}}),
     '"cluster" job "ps" entry \'ps-0:99999\' is not host:port with a port 1..65535'),
    (json.dumps({'cluster': {'ps': ['ps-0'], 'worker': [W0]},
                 'task': {'type': 'worker', 'index': 0}}),
     '"cluster" job "ps" entry \'ps-0\' is not host:port'),
    (json.dumps({'cluster': {'ps': [PS], 'chief': [CHIEF], 'worker': [W0, CHIEF]},
                 'task': {'type': 'worker', 'index': 0}}),
     '"cluster": chief 0 and worker 1 are both at chief-0:2222; each task listens on a port '
     'of its own: give every task its own host:port'),
    (json.dumps({'cluster': {'ps': ['127.0.0.1:2222'], 'worker': ['localhost:2222']},
                 'task': {'type': 'ps', 'index': 0}}),
     'ps 0 and worker 0 are both at 127.0.0.1:2222 and localhost:2222, one port of one '
     'machine'),
], ids=['not_json', 'not_object', 'no_cluster', 'no_task', 'index_past_end', 'index_negative',
        'unknown_type', 'unknown_job', 'chief_and_master', 'two_chiefs', 'no_type',
        'no_index', 'index_not_int', 'hosts_not_list', 'sparse_indexes', 'empty_ps',
        'empty_worker', 'port_past_65535', 'no_port', 'chief_and_worker_one_host_port',
        'ps_and_worker_one_loopback_port'])
def test_from_tf_config_broken_raises_one_line_naming_tf_config(text, named):
  with pytest.raises(errors.ClusterError) as raised:
    cluster_tf_config.from_tf_config({'TF_CONFIG': text})
  message = str(raised.value)
  assert message.startswith('TF_CONFIG')
  assert named in message
  assert '\n' not in message


@pytest.mark.parametrize('index', [0.5, True, '1', 1.0])
def test_from_tf_config_task_index_not_an_integer_refused_in_one_line(index):
  text = json.dumps({'cluster': {'ps': [PS], 'worker': [W0, W1]},
                     'task': {'type': 'worker', 'index': index}})
  with pytest.raises(errors.ClusterError) as raised:
    cluster_tf_config.from_tf_config({'TF_CONFIG': text})
  assert str(raised.value).startswith('TF_CONFIG cannot be read as a cluster (its "task" '
                                      '"index" is %s, not a whole number)' % json.dumps(index))


def test_from_tf_config_nested_200000_deep_is_one_line_not_a_recursion_error():
  text = '{"cluster": {"ps": [%s]}}' % ('[' * 200000 + ']' * 200000)
  with pytest.raises(errors.ClusterError) as raised:
    cluster_tf_config.from_tf_config({'TF_CONFIG': text})
  assert str(raised.value).startswith('TF_CONFIG is not JSON (nested more than 100 levels '
                                      'deep)')


# ---- Flags given alongside ------------------------------------------------------

def test_check_agrees_same_values_pass():
  cluster = cluster_tf_config.from_tf_config(
      tf_config({'ps': [PS], 'chief': [CHIEF], 'worker': [W0]}, 'worker', 0))
  cluster_env.check_agrees(cluster)
  cluster_env.check_agrees(cluster, job_name='worker', task_index=1, ps_hosts=PS,
                           worker_hosts=[CHIEF, W0])


@pytest.mark.parametrize('flag, expected', [
    (dict(job_name='ps'), '--job_name=ps disagrees with TF_CONFIG, which makes this task '
                          'worker 1; drop --job_name'),
    (dict(task_index=0), '--task_index=0 disagrees with TF_CONFIG, which makes this task '
                         'worker 1; drop --task_index'),
    (dict(ps_hosts='10.0.0.1:2222'), '--ps_hosts=10.0.0.1:2222 disagrees with TF_CONFIG, '
                                     'which gives ps-0:2222; drop --ps_hosts'),
    (dict(worker_hosts=[W0, CHIEF]), '--worker_hosts=worker-0:2222,chief-0:2222 disagrees '
                                     'with TF_CONFIG, which gives chief-0:2222,worker-0:2222; '
                                     'drop --worker_hosts'),
], ids=['job_name', 'task_index', 'ps_hosts', 'worker_hosts_order'])
def test_check_agrees_tf_config_disagreeing_flag_raises_naming_both(flag, expected):
  cluster = cluster_tf_config.from_tf_config(
      tf_config({'ps': [PS], 'chief': [CHIEF], 'worker': [W0]}, 'worker', 0))
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.check_agrees(cluster, **flag)
  assert str(raised.value) == expected


def test_from_tf_config_without_ps_is_a_cluster_of_workers_only():
  # --all_reduce's: dist_train.py says whether the mode fits (cluster_env.mode_misfit).
  cluster = cluster_tf_config.from_tf_config({'TF_CONFIG': json.dumps(
      {'cluster': {'chief': [W0], 'worker': [W1]}, 'task': {'type': 'worker', 'index': 0}})})
  assert (cluster.ps_hosts, cluster.worker_hosts, cluster.task_index) == ([], [W0, W1], 1)
