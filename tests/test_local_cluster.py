"""dist_train.py --local_cluster: the launcher of every task on this machine.

Its checks in-process (the memory the tasks need, free ports); then launchers that
start real ps and worker processes on 127.0.0.1, each bounded in time: too many tasks
for the memory, the launcher killed while its tasks start, its chief failing, its
relay of the tasks' lines; a long run's private network, its lock on --train_dir, and
its stop by SIGTERM or Ctrl-C. Every process is killed when its test ends, pass or fail.
"""
import io
import os
import re
import signal
import socket
import time

import pytest
import tensorflow as tf

import helpers
from helpers import STEADY_FLAGS, WORKER_LOSS_LINE, local_cluster_task
from distributed import local_cluster


# ---- The launcher's checks, in-process: memory and ports -----------------------


def test_check_memory_more_tasks_than_memory_holds_raises_naming_estimate_and_limit():
  with pytest.raises(ValueError) as raised:
    local_cluster.check_memory(1, 1000, available_bytes=24e9)
  assert str(raised.value) == (
      '--local_cluster=1,1000 starts 1001 TensorFlow tasks, about 480.9 GB of memory (1001 x '
      '480 MB of their own, what a CIFAR-10 worker was measured to use, and 430 MB of '
      'TensorFlow\'s library that they share), and this machine has 24.0 GB available; '
      'start at most 49 here, e.g. --local_cluster=1,48, or run the tasks on several machines '
      'with --job_name, --ps_hosts and --worker_hosts')
  local_cluster.check_memory(1, 48, available_bytes=24e9)  # 49 x 480 MB + 430 MB fit
  local_cluster.check_memory(1, 1000, available_bytes=None)  # not Linux: nothing known


def test_free_ports_distinct_and_bindable():
  ports = local_cluster.free_ports(3)
  assert len(set(ports)) == 3
  for port in ports:
    socket.create_server(('127.0.0.1', port)).close()


# ---- The launcher: too many tasks, killed as tasks start, its chief failing, its relay

@pytest.mark.slow
def test_local_cluster_more_tasks_than_memory_holds_exits_1_starting_none(tasks, tmp_path):
  launcher = tasks(['dist_train.py', '--local_cluster=1,100000', '--synthetic',
                    '--train_dir=%s' % (tmp_path / 'train')])
  # Watched as it runs: a launcher that starts its tasks is stopped at the first.
  helpers.wait_until(lambda: launcher.process.poll() is not None or
                     helpers.tasks_of(launcher.pid), 'the launcher to exit')
  started = helpers.tasks_of(launcher.pid)
  if started:
    launcher.kill()
    for pid in helpers.tasks_of(launcher.pid):
      os.kill(pid, signal.SIGKILL)
  assert not started, launcher.log()
  assert launcher.finish() == 1, launcher.log()
  assert [line for line in launcher.err_lines if line.startswith('error')] == [
      line for line in launcher.err_lines if line.strip()][-1:], launcher.log()
  assert re.match(r'^error: --local_cluster=1,100000 starts 100001 TensorFlow tasks, about '
                  r'48000\.9 GB of memory \(100001 x 480 MB of their own, .*\), and this '
                  r'machine has [\d.]+ GB available; start at most \d+ here',
                  launcher.err_lines[-1]), launcher.log()
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_local_cluster_launcher_killed_while_tasks_start_leaves_no_task(tasks, tmp_path):
  # Killed once its 3 tasks are there, at their first lines: each dies with it (asked of
  # Linux before a task's first line, distributed/local_cluster.py's die_with).
  launcher = local_cluster_task(tasks, 1, 2, tmp_path / 'train', '--synthetic')
  helpers.wait_until(lambda: len(helpers.tasks_of(launcher.pid)) == 3, 'the 3 tasks',
                     task=launcher)
  launcher.send(signal.SIGKILL)
  try:
    helpers.wait_until(lambda: not helpers.tasks_of(launcher.pid), 'the exit of every task',
                       timeout=10)
  finally:
    for pid in helpers.tasks_of(launcher.pid):
      os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_local_cluster_chief_fails_stops_every_task_and_exits_1(tasks, tmp_path):
  with open(os.path.join(tmp_path, 'checkpoint'), 'w') as f:
    f.write('not a checkpoint state\n')  # the chief refuses to train over it
  launcher = local_cluster_task(tasks, 1, 2, tmp_path, '--synthetic')
  assert launcher.finish() == 1, launcher.log()
  assert ('[worker0] error: %s cannot be read as a checkpoint state file'
          % os.path.join(tmp_path, 'checkpoint') in launcher.text), launcher.log()
  assert 'local cluster: worker0 exited with 1; stopping the other tasks' in launcher.lines
  assert helpers.tasks_of(launcher.pid) == {}  # the ps task and worker 1 are gone too


def test_relay_last_error_is_the_tasks_last_error_line_though_held_lines_follow(capsys):
  # An async worker that diverged said why in one line; then the lines held back
  # (thousands of characters) printed after it pushed it out of a log cut to its end.
  relay = local_cluster.Relay()
  relay.start('worker1', io.StringIO(
      'worker 1: training from global step 0\n'
      'error: loss is inf at step 82 on worker 1: the model diverged.\n'))
  relay.start('worker0', io.StringIO('worker 0: closing the session at global step 83\n'
                                     'error: not this task\'s\n'))
  assert relay.last_error('worker1') == ('error: loss is inf at step 82 on worker 1: the '
                                         'model diverged.')
  assert relay.last_error('worker0') == 'error: not this task\'s'
  relay.start('ps0', io.StringIO('ps task 0 serving\n'))
  assert relay.last_error('ps0') is None
  relay.join()
  assert '[worker1] error: loss is inf at step 82' in capsys.readouterr().out



# ---- A long run: its network, its lock, its stop -------------------------------------


def listening_ports(net_dir):
  """TCP ports in LISTEN state in the network namespace whose /proc net_dir is given."""
  ports = set()
  for name in ('tcp', 'tcp6'):
    with open(os.path.join(net_dir, name)) as f:
      for line in f.readlines()[1:]:
        local, _, state = line.split()[1:4]
        if state == '0A':  # TCP_LISTEN
          ports.add(int(local.rsplit(':', 1)[1], 16))
  return ports


LOCAL_CLUSTER_LINE = re.compile(r'^local cluster: ps (\S+), workers (\S+)$')


@pytest.fixture(scope='module')
def long_cluster(module_tasks, tmp_path_factory):
  """1 ps + 1 async worker training far beyond the test, once the first step is logged."""
  train_dir = str(tmp_path_factory.mktemp('long'))
  launcher = local_cluster_task(module_tasks, 1, 1, train_dir, *STEADY_FLAGS,
                                '--max_steps=10000000', '--save_every_n_steps=10000000',
                                '--summary_steps=0', '--log_frequency=1000')
  found = launcher.wait_for(LOCAL_CLUSTER_LINE, 'the ports')
  ports = [int(h.rsplit(':', 1)[1]) for h in ','.join(found.groups()).split(',')]
  launcher.wait_for(lambda line: WORKER_LOSS_LINE.match(line.partition('] ')[2]),
                    'a first step')
  return launcher, train_dir, ports


@pytest.mark.slow
@pytest.mark.xdist_group('long_cluster')
def test_local_cluster_ports_listen_only_in_its_private_network(long_cluster):
  launcher, _, ports = long_cluster
  refused = [line for line in launcher.lines if 'cannot have a private network' in line]
  if refused:
    pytest.skip('this machine refuses network namespaces: %s' % refused[0])
  # /proc/net is this test's namespace, the machine's; /proc/PID/net the launcher's.
  assert not set(ports) & listening_ports('/proc/net')
  assert set(ports) <= listening_ports('/proc/%d/net' % launcher.pid)
  assert os.readlink('/proc/%d/ns/net' % launcher.pid) != os.readlink('/proc/self/ns/net')


@pytest.mark.slow
@pytest.mark.xdist_group('long_cluster')
def test_second_chief_same_train_dir_exits_naming_it_and_the_first(long_cluster):
  _, train_dir, _ = long_cluster
  before = sorted(os.listdir(train_dir))
  with open(os.path.join(train_dir, '.lock')) as f:
    holder = int(f.read())
  ps_port, worker_port = local_cluster.free_ports(2)  # nothing listens on ps_port
  # Refused at once: had it looked for the ps tasks first, it would have exited 138
  # after --startup_timeout_secs, saying it waited for them.
  done = helpers.run(['dist_train.py', '--job_name=worker', '--task_index=0', '--synthetic',
                      '--ps_hosts=127.0.0.1:%d' % ps_port,
                      '--worker_hosts=127.0.0.1:%d' % worker_port,
                      '--startup_timeout_secs=1', '--train_dir=%s' % train_dir])
  assert done.code == 1, done.log()
  assert done.err.strip().splitlines()[-1] == (
      'error: %s is in use by another trainer (PID %d): two runs in one directory would '
      'overwrite each other\'s checkpoints. Stop that run, or give this one another '
      '--train_dir.' % (train_dir, holder)), done.log()
  assert 'Traceback' not in done.err and 'waited' not in done.err
  assert sorted(os.listdir(train_dir)) == before


@pytest.mark.slow
@pytest.mark.xdist_group('long_cluster')
def test_local_cluster_sigterm_chief_saves_then_every_task_stops_143(long_cluster):
  launcher, train_dir, _ = long_cluster
  assert len(helpers.tasks_of(launcher.pid)) == 2
  launcher.send(signal.SIGTERM)
  assert launcher.finish() == 143, launcher.log()
  [stopped] = re.findall(r'^\[worker0\] Stopped by SIGTERM at step (\d+); rerun the same '
                         r'command to resume\.$', launcher.text, re.M)
  assert helpers.global_step(train_dir) >= int(stopped) >= 1
  assert tf.train.latest_checkpoint(train_dir).endswith('model.ckpt-%s' % stopped)
  assert helpers.tasks_of(launcher.pid) == {}


@pytest.mark.slow
def test_local_cluster_sync_ctrl_c_chief_saves_then_every_task_stops_130(tasks, tmp_path):
  # Timeouts far above the 45 s allowed below, which is below the launcher's END_SECS
  # (60): a stop that waited for any of them fails.
  launcher = local_cluster_task(tasks, 1, 2, tmp_path, *STEADY_FLAGS, '--sync_replicas',
                                '--max_steps=10000000', '--summary_steps=0',
                                '--log_frequency=100', '--startup_timeout_secs=600',
                                '--step_timeout_secs=600')
  for worker in ('worker0', 'worker1'):
    launcher.wait_for(lambda line: line.startswith('[%s] ' % worker) and WORKER_LOSS_LINE.match(
        line.partition('] ')[2]), 'a step of %s' % worker)
  launcher.send(signal.SIGINT)  # what Ctrl-C sends; the tasks have a process group apart
  start = time.time()
  assert launcher.finish() == 130, launcher.log()
  assert time.time() - start < 45, launcher.log()  # about 3 s on an idle machine
  [stopped] = re.findall(r'^\[worker0\] Stopped by Ctrl-C at step (\d+); rerun the same '
                         r'command to resume\.$', launcher.text, re.M)
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith('model.ckpt-%s' % stopped)
  assert helpers.tasks_of(launcher.pid) == {}


@pytest.mark.slow
def test_local_cluster_chief_killed_ps_serves_its_wait_out_not_sigkilled(tasks, tmp_path):
  """The chief SIGKILL'd: the launcher stops the ps task, which serves a save that will
  not come for ps_shutdown.STOP_WAIT_SECS, then says it stopped and exits. The launcher
  SIGKILL'd it 5 s after its SIGTERM, before that line."""
  launcher = local_cluster_task(tasks, 1, 1, tmp_path, *STEADY_FLAGS, '--max_steps=10000000',
                                '--summary_steps=0', '--log_frequency=100')
  launcher.wait_for(lambda line: line.startswith('[worker0] ') and WORKER_LOSS_LINE.match(
      line.partition('] ')[2]), 'a step of worker0')
  os.kill(helpers.task_pid(launcher.pid, 'worker', 0), signal.SIGKILL)
  assert launcher.finish() == 1, launcher.log()
  assert '[ps0] ps task 0 stopped by SIGTERM' in launcher.lines, launcher.log()
  assert helpers.tasks_of(launcher.pid) == {}
