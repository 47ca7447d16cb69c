"""cluster_env.py: the cluster from TF_CONFIG (Kubernetes), Slurm's variables and a JobSet's.

Each test hands the module an environment written by hand, the way TFJob, srun
or a JobSet pod (deploy/kubernetes/jobset.yaml) would set it, and checks the
cluster dist_train.py would build from it.
"""
import json
import os

import pytest

from distributed import cluster_env
from training import errors
import helpers

PS, CHIEF, W0, W1, EVAL = 'ps-0:2222', 'chief-0:2222', 'worker-0:2222', 'worker-1:2222', 'ev-0:2222'


def tf_config(cluster, task_type, index):
  return {'TF_CONFIG': helpers.tf_config(cluster, task_type, index)}


def slurm(procid, tmp_path, num_tasks=3, nodelist='node7', tasks_per_node='3', **more):
  """srun's variables for one task; PATH holds only tmp_path/bin (no nvidia-smi there)."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  env = {'SLURM_PROCID': str(procid), 'SLURM_STEP_NUM_TASKS': str(num_tasks),
         'SLURM_STEP_NODELIST': nodelist, 'SLURM_STEP_TASKS_PER_NODE': tasks_per_node,
         'PATH': str(bin_dir)}
  env.update(more)
  return env


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


def fake_nvidia_smi(tmp_path, num_gpus):
  """A `nvidia-smi` on tmp_path/bin that lists num_gpus GPUs, as --list-gpus does."""
  helpers.fake_nvidia_smi(tmp_path / 'bin', num_gpus)


# ---- TF_CONFIG ------------------------------------------------------------------

def test_from_tf_config_unset_or_empty_is_none():
  assert cluster_env.from_tf_config({}) is None
  assert cluster_env.from_tf_config({'TF_CONFIG': ''}) is None
  assert cluster_env.from_tf_config({'TF_CONFIG': '  '}) is None


def test_from_tf_config_chief_and_workers_chief_is_worker_0():
  jobs = {'ps': [PS], 'chief': [CHIEF], 'worker': [W0, W1], 'evaluator': [EVAL]}
  cluster = cluster_env.from_tf_config(tf_config(jobs, 'worker', 0))
  assert cluster == cluster_env.Cluster(
      [PS], [CHIEF, W0, W1], 'worker', 1, 'TF_CONFIG',
      'cluster from TF_CONFIG: 1 ps, 1 chief, 2 workers, 1 evaluator; this task: worker 0 '
      '(dist_train.py\'s worker 1)')
  chief = cluster_env.from_tf_config(tf_config(jobs, 'chief', 0))
  assert (chief.job_name, chief.task_index) == ('worker', 0)
  assert chief.description.endswith('this task: chief 0 (dist_train.py\'s worker 0, the chief)')


def test_from_tf_config_master_is_the_chief():
  jobs = {'ps': [PS], 'master': [CHIEF], 'worker': [W0]}
  master = cluster_env.from_tf_config(tf_config(jobs, 'master', 0))
  assert master[:4] == ([PS], [CHIEF, W0], 'worker', 0)
  worker = cluster_env.from_tf_config(tf_config(jobs, 'worker', 0))
  assert worker[:4] == ([PS], [CHIEF, W0], 'worker', 1)


def test_from_tf_config_no_chief_worker_0_leads():
  jobs = {'ps': [PS], 'worker': [W0, W1]}
  first = cluster_env.from_tf_config(tf_config(jobs, 'worker', 0))
  second = cluster_env.from_tf_config(tf_config(jobs, 'worker', 1))
  assert first[:4] == ([PS], [W0, W1], 'worker', 0)
  assert second[:4] == ([PS], [W0, W1], 'worker', 1)
  assert first.description == ('cluster from TF_CONFIG: 1 ps, 2 workers; this task: '
                               'worker 0 (the chief)')


def test_from_tf_config_every_task_same_hosts_distinct_indexes():
  jobs = {'ps': [PS, 'ps-1:2222'], 'chief': [CHIEF], 'worker': [W0, W1]}
  tasks = [('ps', 0), ('ps', 1), ('chief', 0), ('worker', 0), ('worker', 1)]
  clusters = [cluster_env.from_tf_config(tf_config(jobs, t, i)) for t, i in tasks]
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
  cluster = cluster_env.from_tf_config(tf_config(jobs, 'evaluator', 0))
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
    (json.dumps({'cluster': {'worker': [W0]}, 'task': {'type': 'worker', 'index': 0}}),
     'has no "ps" task'),
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
     'has no "ps" task'),
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
        'unknown_type', 'unknown_job', 'chief_and_master', 'two_chiefs', 'no_ps', 'no_type',
        'no_index', 'index_not_int', 'hosts_not_list', 'sparse_indexes', 'empty_ps',
        'empty_worker', 'port_past_65535', 'no_port', 'chief_and_worker_one_host_port',
        'ps_and_worker_one_loopback_port'])
def test_from_tf_config_broken_raises_one_line_naming_tf_config(text, named):
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_tf_config({'TF_CONFIG': text})
  message = str(raised.value)
  assert message.startswith('TF_CONFIG')
  assert named in message
  assert '\n' not in message


# ---- Slurm ----------------------------------------------------------------------

def test_from_slurm_one_node_three_tasks_no_gpus_ps_then_chief_then_worker(tmp_path):
  environs = [slurm(rank, tmp_path) for rank in range(3)]
  before = os.environ.get('CUDA_VISIBLE_DEVICES')
  clusters = [cluster_env.from_slurm(1, environ=env) for env in environs]
  hosts = (['node7:8888'], ['node7:8889', 'node7:8890'])
  assert [c[:5] for c in clusters] == [hosts + ('ps', 0, 'Slurm'),
                                       hosts + ('worker', 0, 'Slurm'),
                                       hosts + ('worker', 1, 'Slurm')]
  assert clusters[1].description == (
      'cluster from Slurm (SLURM_*): 1 ps, 2 workers on 1 node (node7); this task: '
      'worker 0, the chief (SLURM_PROCID=1); ports 8888 + the task\'s index on its node; no '
      'GPUs (no nvidia-smi)')
  # Without nvidia-smi nothing is set, here or in this process's environment.
  assert all('CUDA_VISIBLE_DEVICES' not in env for env in environs)
  assert os.environ.get('CUDA_VISIBLE_DEVICES') == before


def test_from_slurm_two_nodes_ports_count_per_node(tmp_path):
  env = slurm(3, tmp_path, num_tasks=4, nodelist='n[1-2]', tasks_per_node='2(x2)')
  cluster = cluster_env.from_slurm(1, port_base=9000, environ=env)
  assert cluster[:4] == (['n1:9000'], ['n1:9001', 'n2:9000', 'n2:9001'], 'worker', 2)


def test_from_slurm_reserved_ports_every_node_takes_them_over_the_base(tmp_path):
  # srun --resv-ports: the same ports on every node of the step, so two jobs sharing
  # a node never listen on one port.
  environs = [dict(slurm(rank, tmp_path, num_tasks=4, nodelist='n[1-2]',
                         tasks_per_node='2(x2)'), SLURM_STEP_RESV_PORTS='12030-12031')
              for rank in range(4)]
  clusters = [cluster_env.from_slurm(1, port_base=9000, environ=env) for env in environs]
  assert {(tuple(c.ps_hosts), tuple(c.worker_hosts)) for c in clusters} == {
      (('n1:12030',), ('n1:12031', 'n2:12030', 'n2:12031'))}
  assert ('(SLURM_PROCID=1); ports 12030-12031 reserved by srun (SLURM_STEP_RESV_PORTS); '
          in clusters[1].description)


@pytest.mark.parametrize('value, message', [
    ('12030', "SLURM_STEP_RESV_PORTS=12030 reserves 1 port(s), and 3 tasks of this step share "
              "a node: give srun --resv-ports=3, or none"),
    ('ports', "SLURM_STEP_RESV_PORTS='ports' is not a range of ports such as 12000-12003 (srun "
              "--resv-ports sets it); run srun without --resv-ports to use --slurm_port_base"),
    ('70000-70002', "SLURM_STEP_RESV_PORTS='70000-70002' is not a range of ports such as "
                    "12000-12003 (srun --resv-ports sets it); run srun without --resv-ports "
                    "to use --slurm_port_base")])
def test_from_slurm_reserved_ports_too_few_or_malformed_one_line_naming_value(
    tmp_path, value, message):
  env = dict(slurm(0, tmp_path), SLURM_STEP_RESV_PORTS=value)
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_slurm(1, environ=env)
  assert str(raised.value) == message


def test_from_slurm_port_base_plus_index_past_65535_raises_naming_the_flag(tmp_path):
  # 3 tasks on node7 listen on 65534, 65535 and 65536: the last is no port.
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_slurm(1, port_base=65534, environ=slurm(0, tmp_path))
  assert str(raised.value) == (
      '--slurm_port_base=65534 puts a task at node7:65536, past port 65535: each task listens '
      'on the base + its index among its node\'s tasks (up to +2 here); give '
      '--slurm_port_base=65533 or lower')
  assert cluster_env.from_slurm(1, port_base=65533, environ=slurm(0, tmp_path)).ps_hosts == [
      'node7:65533']


def test_from_slurm_nvidia_smi_finds_gpus_resolver_sets_this_tasks(tmp_path):
  fake_nvidia_smi(tmp_path, 4)
  env = slurm(2, tmp_path)
  before = os.environ.get('CUDA_VISIBLE_DEVICES')
  cluster = cluster_env.from_slurm(1, environ=env)
  # 4 GPUs // 3 tasks: one each, in rank order; this is rank 2.
  assert env['CUDA_VISIBLE_DEVICES'] == '2'
  assert cluster.description.endswith('CUDA_VISIBLE_DEVICES=2 set by the resolver')
  assert os.environ.get('CUDA_VISIBLE_DEVICES') == before


def test_from_slurm_fewer_gpus_than_tasks_raises_naming_tasks_per_node(tmp_path):
  fake_nvidia_smi(tmp_path, 2)
  with pytest.raises(errors.ClusterError, match=r'^SLURM_STEP_TASKS_PER_NODE puts 3 '
                     r'tasks on a node with 2 GPUs'):
    cluster_env.from_slurm(1, environ=slurm(0, tmp_path))


def test_from_slurm_cuda_visible_devices_set_by_slurm_kept(tmp_path):
  fake_nvidia_smi(tmp_path, 4)
  env = slurm(1, tmp_path, CUDA_VISIBLE_DEVICES='3')  # srun --gpus-per-task=1
  cluster = cluster_env.from_slurm(1, environ=env)
  assert env['CUDA_VISIBLE_DEVICES'] == '3'
  assert cluster.description.endswith('CUDA_VISIBLE_DEVICES=3 as Slurm set it')


@pytest.mark.parametrize('change, num_ps, named', [
    ({'SLURM_PROCID': None}, 1, 'SLURM_PROCID is not set'),
    ({'SLURM_STEP_NUM_TASKS': None}, 1, 'SLURM_STEP_NUM_TASKS is not set'),
    ({'SLURM_STEP_NODELIST': None}, 1, 'SLURM_STEP_NODELIST is not set'),
    ({'SLURM_STEP_TASKS_PER_NODE': None}, 1, 'SLURM_STEP_TASKS_PER_NODE is not set'),
    ({}, 3, 'SLURM_STEP_NUM_TASKS is 3: too few tasks for --num_ps=3'),
    ({'SLURM_STEP_NUM_TASKS': 'three'}, 1, 'SLURM_STEP_NUM_TASKS=\'three\' is not a whole'),
    ({'SLURM_PROCID': '5'}, 1, 'SLURM_PROCID is 5, not a task'),
    ({'SLURM_STEP_NODELIST': 'node[1-'}, 1, 'SLURM_STEP_NODELIST=\'node[1-\' is not'),
    ({'SLURM_STEP_TASKS_PER_NODE': 'x3'}, 1, 'SLURM_STEP_TASKS_PER_NODE=\'x3\' is not'),
    ({'SLURM_STEP_TASKS_PER_NODE': '2'}, 1, 'SLURM_STEP_NODELIST=\'node7\' (1 nodes) and '
     'SLURM_STEP_TASKS_PER_NODE=\'2\' (2 tasks)'),
], ids=['no_procid', 'no_num_tasks', 'no_nodelist', 'no_tasks_per_node', 'too_few_tasks',
        'num_tasks_not_int', 'procid_past_end', 'bad_nodelist', 'bad_tasks_per_node',
        'counts_disagree'])
def test_from_slurm_broken_raises_one_line_naming_variable(tmp_path, change, num_ps, named):
  env = slurm(0, tmp_path)
  for name, value in change.items():
    if value is None:
      del env[name]
    else:
      env[name] = value
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_slurm(num_ps, environ=env)
  message = str(raised.value)
  assert message.startswith(named)
  assert '\n' not in message


@pytest.mark.parametrize('change, named', [
    ({'SLURM_STEP_NODELIST': 'n[1-3000000000]'},
     "SLURM_STEP_NODELIST='n[1-3000000000]' lists 3000000000 nodes, more than the step's "
     'SLURM_STEP_NUM_TASKS=3 tasks'),
    ({'SLURM_STEP_TASKS_PER_NODE': '1(x3000000000)'},
     "SLURM_STEP_TASKS_PER_NODE='1(x3000000000)' lists 3000000000 node counts"),
    ({'SLURM_STEP_NUM_TASKS': '3000000000', 'SLURM_STEP_NODELIST': 'n[1-3000000000]',
      'SLURM_STEP_TASKS_PER_NODE': '1(x3000000000)'},
     'SLURM_STEP_NUM_TASKS is 3000000000: more than the 65536 tasks'),
], ids=['nodelist', 'tasks_per_node', 'num_tasks'])
def test_from_slurm_huge_lists_refused_in_one_line_before_expanding(tmp_path, change, named):
  env = dict(slurm(0, tmp_path), **change)
  with pytest.raises(errors.ClusterError) as raised:
    helpers.returns_within(10, cluster_env.from_slurm, 1, SLURM_PORT, env)
  assert str(raised.value).startswith(named) and '\n' not in str(raised.value)


SLURM_PORT = cluster_env.SLURM_PORT_BASE


@pytest.mark.parametrize('index', [0.5, True, '1', 1.0])
def test_from_tf_config_task_index_not_an_integer_refused_in_one_line(index):
  text = json.dumps({'cluster': {'ps': [PS], 'worker': [W0, W1]},
                     'task': {'type': 'worker', 'index': index}})
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_tf_config({'TF_CONFIG': text})
  assert str(raised.value).startswith('TF_CONFIG cannot be read as a cluster (its "task" '
                                      '"index" is %s, not a whole number)' % json.dumps(index))


def test_from_tf_config_nested_200000_deep_is_one_line_not_a_recursion_error():
  text = '{"cluster": {"ps": [%s]}}' % ('[' * 200000 + ']' * 200000)
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_tf_config({'TF_CONFIG': text})
  assert str(raised.value).startswith('TF_CONFIG is not JSON (nested more than 100 levels '
                                      'deep)')


# ---- JobSet ---------------------------------------------------------------------

JS_PS = ['cifar10-dist-ps-0-0.cifar10-dist:2222']
JS_WORKERS = ['cifar10-dist-worker-0-%d.cifar10-dist:2222' % i for i in range(3)]


def test_from_jobset_worker_index_0_is_the_chief_hosts_are_pod_dns_names():
  assert cluster_env.from_jobset(jobset('worker', 0)) == cluster_env.Cluster(
      JS_PS, JS_WORKERS, 'worker', 0, 'JobSet',
      'cluster from JobSet cifar10-dist: 1 ps, 3 workers at '
      'cifar10-dist-{ps,worker}-0-<index>.cifar10-dist:2222; this task: worker 0, the chief '
      '(pod cifar10-dist-worker-0-0)')


def test_from_jobset_worker_and_ps_same_hosts_own_role_and_index():
  worker = cluster_env.from_jobset(jobset('worker', 2))
  ps = cluster_env.from_jobset(jobset('ps', 0))
  assert worker[:5] == (JS_PS, JS_WORKERS, 'worker', 2, 'JobSet')
  assert worker.description.endswith('this task: worker 2 (pod cifar10-dist-worker-0-2)')
  assert ps[:5] == (JS_PS, JS_WORKERS, 'ps', 0, 'JobSet')
  assert ps.description.endswith('this task: ps 0 (pod cifar10-dist-ps-0-0)')


def test_from_jobset_every_task_same_hosts_distinct_indexes():
  tasks = [('ps', 0), ('ps', 1), ('worker', 0), ('worker', 1)]
  clusters = [cluster_env.from_jobset(jobset(role, i, num_ps=2, num_workers=2,
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
    ('worker', 0, {'NUM_PS': '0'},
     'NUM_PS=0: the cluster needs at least 1 ps task; set it to the ps replicatedJob\'s '
     'completions'),
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
        'two_jobs_per_role', 'no_ps', 'count_not_int', 'port_past_65535', 'port_not_int'])
def test_from_jobset_broken_raises_one_line_naming_variable_value_and_fix(role, index, change,
                                                                          expected):
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.from_jobset(jobset(role, index, **change))
  assert str(raised.value) == expected
  assert '\n' not in expected


def test_check_agrees_jobset_disagreeing_flag_names_the_jobset():
  cluster = cluster_env.from_jobset(jobset('worker', 1))
  cluster_env.check_agrees(cluster, job_name='worker', task_index=1, worker_hosts=JS_WORKERS)
  with pytest.raises(errors.ClusterError, match=r'^--task_index=0 disagrees with the '
                     r'JobSet \(REPLICATED_JOB_NAME, JOB_COMPLETION_INDEX\), which makes this '
                     r'task worker 1; drop --task_index$'):
    cluster_env.check_agrees(cluster, task_index=0)


# ---- Flags given alongside ------------------------------------------------------

def test_check_agrees_same_values_pass():
  cluster = cluster_env.from_tf_config(
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
  cluster = cluster_env.from_tf_config(
      tf_config({'ps': [PS], 'chief': [CHIEF], 'worker': [W0]}, 'worker', 0))
  with pytest.raises(errors.ClusterError) as raised:
    cluster_env.check_agrees(cluster, **flag)
  assert str(raised.value) == expected


def test_check_agrees_slurm_disagreeing_task_index_names_slurm_procid(tmp_path):
  cluster = cluster_env.from_slurm(1, environ=slurm(2, tmp_path))
  with pytest.raises(errors.ClusterError, match=r'^--task_index=0 disagrees with Slurm '
                     r'\(SLURM_PROCID\), which makes this task worker 1; drop --task_index$'):
    cluster_env.check_agrees(cluster, task_index=0)
  with pytest.raises(errors.ClusterError, match=r'SLURM_STEP_NODELIST'):
    cluster_env.check_agrees(cluster, ps_hosts='node7:2222')


# ---- Host flags ------------------------------------------------------------------

def test_from_flags_good_lists_keep_order():
  cluster = cluster_env.from_flags('worker', 1, '127.0.0.1:2222', '127.0.0.1:2223, localhost:2224')
  assert cluster[:4] == (['127.0.0.1:2222'], ['127.0.0.1:2223', 'localhost:2224'], 'worker', 1)


@pytest.mark.parametrize('value, named', [
    ('', 'is empty'), ('127.0.0.1', "'127.0.0.1'"), ('127.0.0.1:0', "'127.0.0.1:0'"),
    ('127.0.0.1:x', "'127.0.0.1:x'"), ('127.0.0.1:1,,127.0.0.1:2', "''"),
    ('127.0.0.1:65536', "'127.0.0.1:65536' is not host:port with a port 1..65535"),
    ('127.0.0.1:1,127.0.0.1:1', 'worker 0 and worker 1 are both at 127.0.0.1:1')])
def test_from_flags_bad_worker_hosts_raises_naming_it(value, named):
  with pytest.raises(errors.ClusterError, match='^--worker_hosts') as error:
    cluster_env.from_flags('ps', 0, '127.0.0.1:2222', value)
  assert named in str(error.value)


@pytest.mark.parametrize('ps, worker, expected', [
    ('127.0.0.1:2222', '127.0.0.1:2223,127.0.0.1:2222',
     '--ps_hosts and --worker_hosts: ps 0 and worker 1 are both at 127.0.0.1:2222; each task '
     'listens on a port of its own: give every task its own host:port'),
    # Every loopback name is this machine, whose servers listen on every interface.
    ('localhost:2222', '127.0.0.2:2222',
     '--ps_hosts and --worker_hosts: ps 0 and worker 0 are both at localhost:2222 and '
     '127.0.0.2:2222, one port of one machine; each task listens on a port of its own: give '
     'every task its own host:port'),
], ids=['same_entry', 'two_loopback_names'])
def test_from_flags_ps_and_worker_at_one_host_port_raises_naming_both(ps, worker, expected):
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.from_flags('worker', 0, ps, worker)
  assert str(error.value) == expected


@pytest.mark.parametrize('job_name, task_index', [('worker', 2), ('worker', -1), ('ps', 1)])
def test_from_flags_task_index_outside_its_job_raises_naming_it(job_name, task_index):
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.from_flags(job_name, task_index, '127.0.0.1:2222',
                           '127.0.0.1:2223,127.0.0.1:2224')
  count = 1 if job_name == 'ps' else 2
  assert str(error.value) == '--task_index=%d is not a %s task: --%s_hosts lists %d (0..%d)' % (
      task_index, job_name, job_name, count, count - 1)


def test_is_loopback_only_loopback_addresses_pass():
  assert all(cluster_env.is_loopback(h) for h in
             ['127.0.0.1:1', '127.8.9.10:1', 'localhost:1', '[::1]:1'])
  assert not any(cluster_env.is_loopback(h) for h in
                 ['10.0.0.5:1', '0.0.0.0:1', 'myhost:1', 'localhost.evil.com:1', '[::]:1'])


def test_check_loopback_remote_worker_raises_with_reason_and_opt_in():
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.check_loopback(['127.0.0.1:2222'], ['127.0.0.1:2223', '192.168.1.7:2222'])
  message = str(error.value)
  for part in ('--worker_hosts names 192.168.1.7:2222', 'no authentication',
               '--allow_nonloopback_hosts'):
    assert part in message
