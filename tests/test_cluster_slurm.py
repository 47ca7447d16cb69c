"""cluster_slurm.py: the cluster of a Slurm job step, from srun's variables.

Each test hands the module the variables srun would set in one task, written by hand
(PATH holding a fake nvidia-smi or none), and checks the cluster dist_train.py would
build from it, or the one line refusing it.
"""
import os

import pytest

from distributed import cluster_env, cluster_slurm
from training import errors
import helpers


def slurm(procid, tmp_path, num_tasks=3, nodelist='node7', tasks_per_node='3', **more):
  """srun's variables for one task; PATH holds only tmp_path/bin (no nvidia-smi there)."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  env = {'SLURM_PROCID': str(procid), 'SLURM_STEP_NUM_TASKS': str(num_tasks),
         'SLURM_STEP_NODELIST': nodelist, 'SLURM_STEP_TASKS_PER_NODE': tasks_per_node,
         'PATH': str(bin_dir)}
  env.update(more)
  return env


def fake_nvidia_smi(tmp_path, num_gpus):
  """A `nvidia-smi` on tmp_path/bin that lists num_gpus GPUs, as --list-gpus does."""
  helpers.fake_nvidia_smi(tmp_path / 'bin', num_gpus)


def test_from_slurm_one_node_three_tasks_no_gpus_ps_then_chief_then_worker(tmp_path):
  environs = [slurm(rank, tmp_path) for rank in range(3)]
  before = os.environ.get('CUDA_VISIBLE_DEVICES')
  clusters = [cluster_slurm.from_slurm(1, environ=env) for env in environs]
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
  cluster = cluster_slurm.from_slurm(1, port_base=9000, environ=env)
  assert cluster[:4] == (['n1:9000'], ['n1:9001', 'n2:9000', 'n2:9001'], 'worker', 2)


def test_from_slurm_reserved_ports_every_node_takes_them_over_the_base(tmp_path):
  # srun --resv-ports: the same ports on every node of the step, so two jobs sharing
  # a node never listen on one port.
  environs = [dict(slurm(rank, tmp_path, num_tasks=4, nodelist='n[1-2]',
                         tasks_per_node='2(x2)'), SLURM_STEP_RESV_PORTS='12030-12031')
              for rank in range(4)]
  clusters = [cluster_slurm.from_slurm(1, port_base=9000, environ=env) for env in environs]
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
    cluster_slurm.from_slurm(1, environ=env)
  assert str(raised.value) == message


def test_from_slurm_port_base_plus_index_past_65535_raises_naming_the_flag(tmp_path):
  # 3 tasks on node7 listen on 65534, 65535 and 65536: the last is no port.
  with pytest.raises(errors.ClusterError) as raised:
    cluster_slurm.from_slurm(1, port_base=65534, environ=slurm(0, tmp_path))
  assert str(raised.value) == (
      '--slurm_port_base=65534 puts a task at node7:65536, past port 65535: each task listens '
      'on the base + its index among its node\'s tasks (up to +2 here); give '
      '--slurm_port_base=65533 or lower')
  assert cluster_slurm.from_slurm(1, port_base=65533, environ=slurm(0, tmp_path)).ps_hosts == [
      'node7:65533']


def test_from_slurm_nvidia_smi_finds_gpus_resolver_sets_this_tasks(tmp_path):
  fake_nvidia_smi(tmp_path, 4)
  env = slurm(2, tmp_path)
  before = os.environ.get('CUDA_VISIBLE_DEVICES')
  cluster = cluster_slurm.from_slurm(1, environ=env)
  # 4 GPUs // 3 tasks: one each, in rank order; this is rank 2.
  assert env['CUDA_VISIBLE_DEVICES'] == '2'
  assert cluster.description.endswith('CUDA_VISIBLE_DEVICES=2 set by the resolver')
  assert os.environ.get('CUDA_VISIBLE_DEVICES') == before


def test_from_slurm_fewer_gpus_than_tasks_raises_naming_tasks_per_node(tmp_path):
  fake_nvidia_smi(tmp_path, 2)
  with pytest.raises(errors.ClusterError, match=r'^SLURM_STEP_TASKS_PER_NODE puts 3 '
                     r'tasks on a node with 2 GPUs'):
    cluster_slurm.from_slurm(1, environ=slurm(0, tmp_path))


def test_from_slurm_cuda_visible_devices_set_by_slurm_kept(tmp_path):
  fake_nvidia_smi(tmp_path, 4)
  env = slurm(1, tmp_path, CUDA_VISIBLE_DEVICES='3')  # srun --gpus-per-task=1
  cluster = cluster_slurm.from_slurm(1, environ=env)
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
    cluster_slurm.from_slurm(num_ps, environ=env)
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
    helpers.returns_within(10, cluster_slurm.from_slurm, 1,
                           cluster_slurm.SLURM_PORT_BASE, env)
  assert str(raised.value).startswith(named) and '\n' not in str(raised.value)


def test_check_agrees_slurm_disagreeing_task_index_names_slurm_procid(tmp_path):
  cluster = cluster_slurm.from_slurm(1, environ=slurm(2, tmp_path))
  with pytest.raises(errors.ClusterError, match=r'^--task_index=0 disagrees with Slurm '
                     r'\(SLURM_PROCID\), which makes this task worker 1; drop --task_index$'):
    cluster_env.check_agrees(cluster, task_index=0)
  with pytest.raises(errors.ClusterError, match=r'SLURM_STEP_NODELIST'):
    cluster_env.check_agrees(cluster, ps_hosts='node7:2222')
