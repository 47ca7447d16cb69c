"""dist_train.py started as Kubernetes and Slurm start it: only the environment says who is who.

Every task is its own process with the TF_CONFIG or the SLURM_* variables the
operator or srun would give it, on free ports of 127.0.0.1, and every one must
end by itself: the ps tasks too, once the workers have said they finished.
No Kubernetes or Slurm runs here; these are their variables, written by hand.
"""
import json
import os
import random
import re
import signal
import socket

import pytest

import helpers
from helpers import DONE_LINE, SAVED_LINE, matches, tf_config
from distributed import local_cluster

MAX_STEPS = 4
# Tiny and quick: 4 images a step, no summaries, an evaluator that looks every second.
FLAGS = ['--batch_size=4', '--log_frequency=1', '--startup_timeout_secs=60',
         '--step_timeout_secs=60', '--summary_steps=0', '--max_steps=%d' % MAX_STEPS,
         '--eval_interval_secs=1']
PRECISION_LINE = r'precision @ 1 = \d\.\d{3} \(global step (\d+),'


def environment(**variables):
  """A user's environment without a GPU or an orchestrator's variables, and `variables`."""
  env = {k: v for k, v in helpers.user_env().items()
         if k != 'TF_CONFIG' and not k.startswith('SLURM_')}
  return dict(env, CUDA_VISIBLE_DEVICES='', **variables)


def loopback_hosts(count):
  return ['127.0.0.1:%d' % port for port in local_cluster.free_ports(count)]


def start_tf_config_cluster(tasks, cluster, flags):
  """One process per task of `cluster`, each told only its TF_CONFIG; {'ps0': Task, ...}."""
  started = {}
  for task_type, hosts in cluster.items():
    for index in range(len(hosts)):
      started['%s%d' % (task_type, index)] = tasks(
          ['dist_train.py'] + flags,
          env=environment(TF_CONFIG=tf_config(cluster, task_type, index)))
  return started


def finish_all(started):
  """{name: (exit code, log)} once every task has ended by itself (each bounded).

  The ps tasks last: they wait for the workers, whose logs say more when one fails.
  """
  ended = {}
  for name in sorted(started, key=lambda name: name.startswith('ps')):
    task = started[name]
    ended[name] = (task.finish(), task.text, task)
  return ended


def assert_every_task_exited_0(ended):
  for name, (code, log, task) in ended.items():
    assert code == 0, (name, task.log())
    assert 'Traceback' not in log, (name, task.log())


@pytest.mark.slow
@pytest.mark.parametrize('mode', [[], ['--sync_replicas']], ids=['async', 'sync'])
def test_tf_config_ps_chief_worker_evaluator_every_task_exits_0_by_itself(tasks, sample,
                                                                          tmp_path, mode):
  cluster = dict(zip(['ps', 'chief', 'worker', 'evaluator'], [[h] for h in loopback_hosts(4)]))
  started = start_tf_config_cluster(tasks, cluster, FLAGS + sample.flags + mode +
                                    ['--train_dir=%s' % tmp_path])
  ended = finish_all(started)
  assert_every_task_exited_0(ended)
  logs = {name: log for name, (_, log, _) in ended.items()}
  for name, this in (('chief0', 'chief 0 (dist_train.py\'s worker 0, the chief)'),
                     ('worker0', 'worker 0 (dist_train.py\'s worker 1)'),
                     ('ps0', 'ps 0'), ('evaluator0', 'evaluator 0')):
    assert ('cluster from TF_CONFIG: 1 ps, 1 chief, 1 worker, 1 evaluator; this task: %s'
            % this) in logs[name].splitlines(), name
  # The ps task ended because both workers said they had finished, not by a stop.
  assert 'ps task 0: worker 0 has finished' in logs['ps0']
  assert 'ps task 0: worker 1 has finished' in logs['ps0']
  assert 'ps task 0 done: training is over' in logs['ps0']
  # The chief trains and saves; TF_CONFIG's worker 0 only trains.
  assert matches(DONE_LINE, logs['chief0'].splitlines())[0].group(3) == str(MAX_STEPS)
  assert matches(DONE_LINE, logs['worker0'].splitlines())[0].group(3) == str(MAX_STEPS)
  assert matches(SAVED_LINE, logs['chief0'].splitlines())
  assert not matches(SAVED_LINE, logs['worker0'].splitlines())
  assert helpers.global_step(str(tmp_path)) == MAX_STEPS
  # The evaluator scored the last checkpoint, then ended.
  scored = [int(step) for step in re.findall(PRECISION_LINE, logs['evaluator0'])]
  assert scored and scored[-1] == MAX_STEPS, ended['evaluator0'][2].log()
  assert os.listdir(os.path.join(tmp_path, 'eval'))  # its event files, beside the chief's


@pytest.mark.slow
def test_tf_config_master_is_the_chief_every_task_exits_0(tasks, tmp_path):
  cluster = dict(zip(['ps', 'master'], [[h] for h in loopback_hosts(2)]))
  started = start_tf_config_cluster(tasks, cluster, FLAGS + ['--synthetic',
                                                             '--train_dir=%s' % tmp_path])
  ended = finish_all(started)
  assert_every_task_exited_0(ended)
  master_log = ended['master0'][1]
  assert ('cluster from TF_CONFIG: 1 ps, 1 master; this task: master 0 (dist_train.py\'s '
          'worker 0, the chief)') in master_log
  assert matches(SAVED_LINE, master_log.splitlines())
  assert 'ps task 0 done: training is over' in ended['ps0'][1]
  assert helpers.global_step(str(tmp_path)) == MAX_STEPS


@pytest.mark.slow
def test_tf_config_no_chief_worker_0_leads_every_task_exits_0(tasks, tmp_path):
  hosts = loopback_hosts(3)
  cluster = {'ps': hosts[:1], 'worker': hosts[1:]}
  started = start_tf_config_cluster(tasks, cluster, FLAGS + ['--synthetic',
                                                             '--train_dir=%s' % tmp_path])
  ended = finish_all(started)
  assert_every_task_exited_0(ended)
  logs = {name: log for name, (_, log, _) in ended.items()}
  assert ('cluster from TF_CONFIG: 1 ps, 2 workers; this task: worker 0 (the chief)'
          in logs['worker0'])
  assert matches(SAVED_LINE, logs['worker0'].splitlines())
  assert not matches(SAVED_LINE, logs['worker1'].splitlines())
  assert 'ps task 0 done: training is over' in logs['ps0']
  assert helpers.global_step(str(tmp_path)) == MAX_STEPS


def free_port_base(count):
  """A port p of 127.0.0.1 with p .. p + count - 1 all free (Slurm's port_base + i)."""
  for _ in range(100):
    base = random.randrange(20000, 60000)
    sockets = [socket.socket() for _ in range(count)]
    try:
      for i, s in enumerate(sockets):
        s.bind(('127.0.0.1', base + i))
      return base
    except OSError:
      continue
    finally:
      for s in sockets:
        s.close()
  raise AssertionError('no %d consecutive free ports on 127.0.0.1' % count)


@pytest.mark.slow
def test_slurm_one_node_three_tasks_every_task_exits_0(tasks, tmp_path):
  # A node with 3 GPUs, as nvidia-smi lists them: the resolver gives each task one
  # through CUDA_VISIBLE_DEVICES (this machine has none, so TensorFlow sees none).
  bin_dir = tmp_path / 'bin'
  helpers.fake_nvidia_smi(bin_dir, 3)
  base = free_port_base(3)
  started = {}
  for rank in range(3):
    env = environment(SLURM_PROCID=str(rank), SLURM_STEP_NUM_TASKS='3',
                      SLURM_STEP_NODELIST='127.0.0.1', SLURM_STEP_TASKS_PER_NODE='3',
                      PATH='%s:%s' % (bin_dir, os.environ['PATH']))
    del env['CUDA_VISIBLE_DEVICES']  # Slurm without --gpus-per-task: the resolver sets it
    started['rank%d' % rank] = tasks(
        ['dist_train.py', '--cluster=slurm', '--num_ps=1',
         '--slurm_port_base=%d' % base, '--synthetic', '--train_dir=%s' % (tmp_path / 'train')]
        + FLAGS, env=env)
  ended = finish_all(started)
  assert_every_task_exited_0(ended)
  logs = [ended['rank%d' % rank][1] for rank in range(3)]
  for rank, this in enumerate(['ps 0', 'worker 0, the chief', 'worker 1']):
    assert ('cluster from Slurm (SLURM_*): 1 ps, 2 workers on 1 node (127.0.0.1); this task: '
            '%s (SLURM_PROCID=%d); ports %d + the task\'s index on its node; '
            'CUDA_VISIBLE_DEVICES=%d set by the resolver'
            % (this, rank, base, rank)) in logs[rank].splitlines()
  assert 'TensorFlow sees 0 GPU(s) (CUDA_VISIBLE_DEVICES=2)' in logs[2]
  assert 'ps task 0 serving at grpc://127.0.0.1:%d' % base in logs[0]
  assert 'ps task 0 done: training is over' in logs[0]
  assert helpers.global_step(str(tmp_path / 'train')) == MAX_STEPS


# Runs a script as `python -u script flags...` would, but stops itself (SIGSTOP) once its
# prelude has imported TensorFlow, before the script's first line: a task held at a
# known point, whatever the load, with only its own start-up left to do when continued.
HELD_AFTER_IMPORT = ('import os, runpy, signal, sys\n'
                     'from training import prelude\n'
                     'prelude.start(sys.argv)\n'
                     'os.kill(os.getpid(), signal.SIGSTOP)\n'
                     'sys.argv = sys.argv[1:]\n'
                     'runpy.run_path(sys.argv[0], run_name="__main__")\n')


@pytest.mark.slow
def test_flag_started_ps_waits_for_late_worker_then_both_exit_0(tasks, tmp_path):
  ps_hosts, worker_hosts = (lambda h: (h[:1], h[1:]))(loopback_hosts(3))
  flags = FLAGS + ['--synthetic', '--train_dir=%s' % tmp_path]

  def start(job_name, task_index):
    return local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags)

  ps, chief = tasks(start('ps', 0)), tasks(start('worker', 0))
  late_argv = start('worker', 1)
  late = tasks(late_argv[:2] + ['-c', HELD_AFTER_IMPORT] + late_argv[2:])
  # Worker 1 holds itself before it reads --train_dir: late, whatever the load, with
  # no TensorFlow import left to do within the ps's grace period.
  helpers.wait_until(lambda: helpers.process_state(late.pid) == 'T', 'worker 1 held',
                     task=late)
  # Async: the chief alone makes every update; then it says it has finished.
  chief.wait_for(DONE_LINE, 'the chief done')
  assert ps.process.poll() is None  # still serving: worker 1 has not said so
  assert chief.finish() == 0, chief.log()
  late.send(signal.SIGCONT)
  assert late.finish() == 0, late.log()
  # It finds the job over (--train_dir at --max_steps), says so, and tells the ps.
  assert ('worker 1: the job is over: %s/model.ckpt-%d is at step %d, not below '
          '--max_steps=%d: nothing to do.' % (tmp_path, MAX_STEPS, MAX_STEPS, MAX_STEPS)
          in late.text), late.log()
  assert ('worker 1: telling the ps tasks at %s that it has finished, for at most 5 s'
          % ps_hosts[0] in late.text), late.log()  # said: a ps task answers
  assert ps.finish() == 0, ps.log()
  assert [line for line in ps.lines if line.startswith('ps task 0')][-3:] == [
      'ps task 0: worker 0 has finished (1 of 2)',
      'ps task 0: worker 1 has finished (2 of 2)', 'ps task 0 done: training is over']


# ---- Start-up refusals: one line, exit 1, before anything is served ---------------

GOOD = {'ps': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2']}
ONE_PORT = '127.0.0.1:%d' % local_cluster.free_ports(1)[0]  # two tasks at one host:port
SLURM_3_TASKS = dict(SLURM_PROCID='1', SLURM_STEP_NUM_TASKS='3', SLURM_STEP_NODELIST='127.0.0.1',
                     SLURM_STEP_TASKS_PER_NODE='3')
# Today's code would wait --startup_timeout_secs for the ps tasks, not refuse at once.
QUICK = ['--startup_timeout_secs=2']
REFUSED = [
    # (the environment's cluster variables, extra flags, the one line it prints)
    (dict(TF_CONFIG='{"cluster": '), [], r'^error: TF_CONFIG is not JSON \('),
    (dict(TF_CONFIG=json.dumps({'cluster': {'worker': ['127.0.0.1:2']},
                                'task': {'type': 'worker', 'index': 0}})), [],
     r'^error: the cluster has no ps task, and without --all_reduce the variables live on '
     r'ps tasks: give --all_reduce'),
    (dict(TF_CONFIG=tf_config(GOOD, 'worker', 3)), [],
     r'^error: TF_CONFIG\'s task is worker 3, but "cluster" lists 1 worker task\(s\) \(0\.\.0\)'),
    (dict(TF_CONFIG=tf_config(GOOD, 'worker', 0)), ['--task_index=1'],
     r'^error: --task_index=1 disagrees with TF_CONFIG, which makes this task worker 0; drop '
     r'--task_index$'),
    (dict(TF_CONFIG=''), ['--cluster=tf_config'],
     r'^error: TF_CONFIG is not set, and --cluster=tf_config'),
    # Every cluster description is checked before anything is locked, written or served.
    (dict(TF_CONFIG=tf_config({'ps': [], 'worker': ['127.0.0.1:2']}, 'worker', 0)), [],
     r'^error: TF_CONFIG\'s "cluster" job "ps" lists no task; give it its tasks\' '
     r'"host:port", or leave the job out$'),
    (dict(TF_CONFIG=tf_config({'ps': [ONE_PORT], 'worker': [ONE_PORT]}, 'worker', 0)), QUICK,
     r'^error: TF_CONFIG\'s "cluster": ps 0 and worker 0 are both at %s; each task listens '
     r'on a port of its own' % ONE_PORT),
    (dict(TF_CONFIG=tf_config({'ps': ['127.0.0.1:99999'], 'worker': [ONE_PORT]}, 'worker', 0)),
     QUICK, r'^error: TF_CONFIG\'s "cluster" job "ps" entry \'127\.0\.0\.1:99999\' is not '
            r'host:port with a port 1\.\.65535$'),
    (dict(TF_CONFIG=''), ['--job_name=worker', '--ps_hosts=' + ONE_PORT,
                          '--worker_hosts=' + ONE_PORT] + QUICK,
     r'^error: --ps_hosts and --worker_hosts: ps 0 and worker 0 are both at %s;' % ONE_PORT),
    # Slurm's 3 tasks on one node at 65534, 65535, 65536: this one is the chief.
    (SLURM_3_TASKS, ['--cluster=slurm', '--slurm_port_base=65534'] + QUICK,
     r'^error: --slurm_port_base=65534 puts a task at 127\.0\.0\.1:65536, past port 65535: '
     r'each task listens on the base \+ its index among its node\'s tasks \(up to \+2 here\); '
     r'give --slurm_port_base=65533 or lower$'),
    (dict(TF_CONFIG=''), ['--job_name=ps', '--ps_hosts=127.0.0.1:1', '--worker_hosts=127.0.0.1:2',
                          'extra'],
     r"^error: unexpected argument 'extra': dist_train\.py takes flags only \(--name=value; "
     r"a boolean: --name or --noname\)$"),
]


@pytest.mark.slow
def test_cluster_broken_or_disagreeing_flag_exits_1_one_line_writing_nothing(tasks, tmp_path):
  # All at once: each only imports TensorFlow and stops.
  runs = [tasks(['dist_train.py', '--synthetic', '--train_dir=%s' % tmp_path] + flags,
                env=environment(**variables)) for variables, flags, _ in REFUSED]
  for run, (variables, flags, expected) in zip(runs, REFUSED):
    assert run.finish() == 1, (variables, flags, run.log())
    errors = [line for line in run.err_lines if line.startswith('error: ')]
    assert len(errors) == 1 and re.search(expected, errors[0]), (variables, flags, run.log())
    assert 'Traceback' not in run.err
    assert 'serving' not in run.out and 'cluster from' not in run.out
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('signum, name, code', [(signal.SIGINT, 'Ctrl-C', 130),
                                                (signal.SIGTERM, 'SIGTERM', 143)])
def test_tf_config_evaluator_waiting_for_a_checkpoint_signal_stops_it_in_one_line(
    tasks, sample, tmp_path, signum, name, code):
  # SIGTERM was left to its default: death by the signal, and as a container's PID 1
  # (tests/test_containers.py) nothing at all until the grace period's SIGKILL.
  cluster = dict(zip(['ps', 'chief', 'evaluator'], [[h] for h in loopback_hosts(3)]))
  evaluator = tasks(['dist_train.py'] + FLAGS + sample.flags + ['--train_dir=%s' % tmp_path],
                    env=environment(TF_CONFIG=tf_config(cluster, 'evaluator', 0)))
  evaluator.wait_for(lambda line: line.startswith('No checkpoint in %s yet' % tmp_path),
                     'the evaluator waiting')
  evaluator.send(signum)
  assert evaluator.finish() == code, evaluator.log()
  assert 'Traceback' not in evaluator.text, evaluator.log()
  assert evaluator.err_lines[-1] == 'Stopped by %s.' % name, evaluator.log()
