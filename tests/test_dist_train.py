"""dist_train.py: real ps and worker processes on 127.0.0.1, each bounded in time.

The cluster tests start TensorFlow servers on free loopback ports and read the
tasks' logs as they come. Every process is killed when its test ends, pass or fail.
"""
import glob
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import conftest
import dist_train
import local_cluster
import mnist_input

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_TRAIN = os.path.join(ROOT, 'dist_train.py')
STEP_LINE = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step (\d+), loss = \d+\.\d\d '
    r'\(\d+\.\d examples/sec; \d+\.\d{3} sec/batch\) \[worker (\d+), local step (\d+)\]$')
DONE_LINE = re.compile(r'^worker (\d+) done: (\d+) local steps, global step (\d+)$')
SAVED_LINE = re.compile(r'^Saved checkpoint .*model\.ckpt-(\d+)$')
RESUMING_LINE = re.compile(r'^Resuming from .*model\.ckpt-(\d+) at step (\d+)$')
TASK_PREFIX = re.compile(r'^\[(ps\d+|worker\d+)\] (.*)$')
RUN_TIMEOUT_SECS = 150   # one whole cluster run; a healthy one takes 10-40 s
WAIT_SECS = 60           # one awaited log line
# Tiny and quick: 8 images a step, a loss line per step.
QUICK_FLAGS = ['--batch_size=8', '--log_frequency=1', '--startup_timeout_secs=60',
               '--step_timeout_secs=60']


class Task:
  """One process, its merged stdout and stderr read line by line as they come."""

  def __init__(self, argv, env=None):
    self.argv = argv
    env = env or dict(os.environ, CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
    # Its own process group, so that killing it takes a launcher's tasks along.
    self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    start_new_session=True)
    self.lines = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.process.stdout:
      with self._changed:
        self.lines.append(line.rstrip('\n'))
        self._changed.notify_all()

  def wait_for(self, condition, what, start=0, timeout=WAIT_SECS):
    """Returns the first truthy condition(line) over lines[start:], as they come."""
    deadline = time.time() + timeout
    with self._changed:
      while True:
        for line in self.lines[start:]:
          found = condition(line)
          if found:
            return found
        start = len(self.lines)
        if not self._reader.is_alive() or time.time() > deadline:
          raise AssertionError('no %s within %d s from %s (exit code %s); its log ends:\n%s'
                               % (what, timeout, ' '.join(self.argv[3:5]),
                                  self.process.poll(), '\n'.join(self.lines[-30:])))
        self._changed.wait(0.5)

  def finish(self, timeout=RUN_TIMEOUT_SECS):
    """Waits for the exit; returns the exit code and the whole log."""
    try:
      code = self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise AssertionError('%s still running after %d s; its log ends:\n%s'
                           % (' '.join(self.argv[3:5]), timeout, '\n'.join(self.lines[-30:])))
    self._reader.join(10)
    return code, '\n'.join(self.lines)

  def send(self, signum):
    """Sends signum to the process (SIGSTOP pauses it, SIGCONT resumes it)."""
    os.kill(self.process.pid, signum)

  def kill(self):
    """Kills its process group (a launcher's tasks too), if anything is left of it."""
    try:
      os.killpg(self.process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.process.wait()


def _tasks():
  started = []

  def start(argv, env=None):
    started.append(Task(argv, env))
    return started[-1]
  yield start
  for task in started:
    task.kill()


@pytest.fixture
def tasks():
  """start(argv) -> Task; every task of the test is killed at its end."""
  yield from _tasks()


@pytest.fixture(scope='module')
def module_tasks():
  """start(argv) -> Task, for the clusters this module's tests share."""
  yield from _tasks()


@pytest.fixture(scope='module')
def sample(tmp_path_factory):
  return conftest.write_sample(tmp_path_factory.mktemp('data'), records_per_file=50)


def run_local_cluster(start, num_ps, num_workers, train_dir, *flags):
  """Runs dist_train.py --local_cluster to the end; returns {task: [its lines]}."""
  task = start([sys.executable, '-u', DIST_TRAIN, '--local_cluster=%d,%d' % (
      num_ps, num_workers), '--train_dir=%s' % train_dir] + QUICK_FLAGS + list(flags))
  code, log = task.finish()
  assert code == 0, log[-5000:]
  by_task = {}
  for line in log.splitlines():
    found = TASK_PREFIX.match(line)
    if found:
      by_task.setdefault(found.group(1), []).append(found.group(2))
  return by_task


def tasks_of(launcher):
  """PIDs of the processes a --local_cluster launcher started that are still alive."""
  marker = ('%s=%d' % (local_cluster.DIE_WITH_LAUNCHER_ENV, launcher.process.pid)).encode()
  pids = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open('/proc/%s/environ' % pid, 'rb') as f:
        if marker in f.read().split(b'\0'):
          pids.append(int(pid))
    except OSError:  # gone meanwhile
      pass
  return pids


def matches(pattern, lines):
  return [m for m in map(pattern.match, lines) if m]


def load(checkpoint_dir):
  """{variable name: value} of the latest checkpoint in checkpoint_dir."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoint_dir))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def start_from(checkpoint, train_dir):
  """Copies one checkpoint into an empty train_dir, as its only (latest) one."""
  os.makedirs(train_dir)
  for path in glob.glob(checkpoint + '.*'):
    shutil.copy(path, train_dir)
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % os.path.basename(checkpoint))


# ---- Flags and hosts, in-process ------------------------------------------------


def test_free_ports_distinct_and_bindable():
  ports = local_cluster.free_ports(3)
  assert len(set(ports)) == 3
  for port in ports:
    socket.create_server(('127.0.0.1', port)).close()


# ---- Flags, as a user runs them ---------------------------------------------------


def run_cli(*args, timeout=60):
  done = subprocess.run([sys.executable, DIST_TRAIN] + list(args), capture_output=True,
                        text=True, timeout=timeout, cwd=ROOT,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  return done.returncode, done.stdout, done.stderr


def test_main_nonloopback_host_without_opt_in_exits_before_serving(tmp_path):
  code, out, err = run_cli('--job_name=ps', '--ps_hosts=10.1.2.3:2222',
                           '--worker_hosts=127.0.0.1:2223', '--train_dir=%s' % tmp_path)
  assert code == 1
  assert 'error: --ps_hosts names 10.1.2.3:2222, which is not a loopback address' in err
  assert '--allow_nonloopback_hosts' in err
  assert 'serving' not in out


def test_main_multi_gpu_train_only_flag_exits_naming_it(tmp_path):
  code, _, err = run_cli('--local_cluster=1,1', '--fresh', '--train_dir=%s' % tmp_path)
  assert code == 1
  assert 'error: --fresh is a multi_gpu_train.py flag that dist_train.py does not take' in err
  assert os.listdir(tmp_path) == []


# ---- Clusters ---------------------------------------------------------------------


@pytest.mark.slow
def test_worker_no_ps_reachable_exits_138_within_startup_deadline(tasks, sample, tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)  # nothing listens on ps_port
  start = time.time()
  worker = tasks([sys.executable, '-u', DIST_TRAIN, '--job_name=worker', '--task_index=0',
                  '--ps_hosts=127.0.0.1:%d' % ps_port,
                  '--worker_hosts=127.0.0.1:%d' % worker_port,
                  '--startup_timeout_secs=2', *sample.flags,
                  '--train_dir=%s' % tmp_path])
  code, log = worker.finish(timeout=60)
  assert code == 138  # a peer went away: an orchestrator restarts this task (>= 128)
  assert time.time() - start < 45  # 2 s of waiting after TensorFlow's import
  errors = [line for line in log.splitlines() if line.startswith('error')]
  assert errors == [
      'error: worker 0 waited 2 s for the ps task(s) at 127.0.0.1:%d: nothing accepts '
      'connections there. Start them first (python dist_train.py --job_name=ps '
      '--task_index=i with the same --ps_hosts and --worker_hosts), check --ps_hosts, or '
      'raise --startup_timeout_secs.' % ps_port]
  assert 'Traceback' not in log
  assert '--startup_timeout_secs' in log


@pytest.mark.slow
def test_worker_batch_too_large_for_memory_stops_in_one_line_before_the_session(tasks,
                                                                                tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  hosts = ['--ps_hosts=127.0.0.1:%d' % ps_port, '--worker_hosts=127.0.0.1:%d' % worker_port]
  tasks([sys.executable, '-u', DIST_TRAIN, '--job_name=ps', '--task_index=0', *hosts])
  worker = tasks([sys.executable, '-u', DIST_TRAIN, '--job_name=worker', '--task_index=0',
                  *hosts, '--synthetic', '--batch_size=100000',
                  '--train_dir=%s' % tmp_path])
  code, log = worker.finish(timeout=90)
  assert code == 1, log
  errors = [line for line in log.splitlines() if line.startswith('error')]
  assert len(errors) == 1 and errors[0].startswith(
      'error: one step at --batch_size=100000 x 1 towers needs about '), log
  assert 'Traceback' not in log and 'Starting from step 0' not in log
  assert not [name for name in os.listdir(tmp_path) if name.startswith('model.ckpt')]


MAX_STEPS = 40           # enough for worker 1 to join the async chief well before the end


@pytest.fixture(scope='module')
def async_run(module_tasks, tmp_path_factory):
  """1 ps + 2 async workers on the same synthetic batch, from step 0 to MAX_STEPS."""
  train_dir = str(tmp_path_factory.mktemp('async'))
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--synthetic', '--summary_steps=10',
                       '--max_steps=%d' % MAX_STEPS)
  return train_dir, logs


@pytest.fixture(scope='module')
def sync_run(module_tasks, async_run, tmp_path_factory):
  """1 ps + 2 sync workers, from the async run's first checkpoint to MAX_STEPS."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('sync')), 'train')
  start_from(os.path.join(async_run[0], 'model.ckpt-0'), train_dir)
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--synthetic', '--summary_steps=0',
                       '--sync_replicas', '--max_steps=%d' % MAX_STEPS)
  return train_dir, logs


@pytest.fixture(scope='module')
def one_process_run(async_run, tmp_path_factory):
  """multi_gpu_train.py, one tower, from the same checkpoint on the same batch."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('one_process')), 'train')
  start_from(os.path.join(async_run[0], 'model.ckpt-0'), train_dir)
  done = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'multi_gpu_train.py'), '--synthetic',
       '--train_dir=%s' % train_dir, '--max_steps=%d' % MAX_STEPS, '--batch_size=8',
       '--summary_steps=0'], capture_output=True, text=True, timeout=RUN_TIMEOUT_SECS,
      cwd=ROOT, env=dict(os.environ, CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2'))
  assert done.returncode == 0, done.stderr[-3000:]
  return train_dir


@pytest.mark.slow
def test_async_two_workers_both_train_to_exactly_max_steps(async_run):
  train_dir, logs = async_run
  assert sorted(logs) == ['ps0', 'worker0', 'worker1']
  local_steps = {}
  for worker in ('worker0', 'worker1'):
    lines = [line for line in logs[worker] if ': step ' in line]
    assert lines and all(STEP_LINE.match(line) for line in lines), lines  # the known format
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == MAX_STEPS
    local_steps[worker] = int(done.group(2))
    assert local_steps[worker] >= 1, 'worker %s did not contribute' % worker
  # Every update is one worker step; none past MAX_STEPS, none lost.
  assert sum(local_steps.values()) == MAX_STEPS
  assert load(train_dir)['global_step'] == MAX_STEPS
  assert tf.train.latest_checkpoint(train_dir).endswith('model.ckpt-%d' % MAX_STEPS)
  # Only the chief saves and writes summaries, into one event file.
  assert matches(SAVED_LINE, logs['worker0']) and not matches(SAVED_LINE, logs['worker1'])
  [events] = glob.glob(os.path.join(train_dir, 'events.out.tfevents.*'))
  tags = {value.tag for event in tf.compat.v1.train.summary_iterator(events)
          for value in event.summary.value}
  assert {'1_loss/total_loss', '2_training/learning_rate'} <= tags


@pytest.mark.slow
def test_sync_two_workers_equal_one_process_sgd_unlike_async(sync_run, one_process_run,
                                                             async_run):
  train_dir, logs = sync_run
  [resuming] = matches(RESUMING_LINE, logs['worker0'])
  start = int(resuming.group(2))  # the async run's first checkpoint, 0 or 1
  done = {w: matches(DONE_LINE, logs[w])[0] for w in ('worker0', 'worker1')}
  assert all(int(d.group(2)) >= 1 for d in done.values())
  # Each update averages 2 worker gradients: the global step counts updates, not steps.
  assert sum(int(d.group(2)) for d in done.values()) >= 2 * (MAX_STEPS - start)
  sync, one_process, async_ = load(train_dir), load(one_process_run), load(async_run[0])
  assert sync['global_step'] == one_process['global_step'] == MAX_STEPS
  # Same batch everywhere, stale gradients dropped: each update is one SGD step on
  # the current variables, as in one process. The moving averages, stepped once
  # per update by the chief, match too.
  assert sorted(sync) == sorted(one_process)
  for name in sync:
    np.testing.assert_allclose(sync[name], one_process[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert any(name.endswith('/ExponentialMovingAverage') for name in sync)
  # Async workers applied gradients of variables that had changed meanwhile: they
  # differ from one-process SGD by far more than sync's tolerance (measured 8.3e-4 once,
  # above 1e-3 in other runs: it depends on how often the two workers overlapped).
  assert max(np.abs(async_[name] - sync[name]).max() for name in sync) > 1e-4


def step_at_least(step):
  """A wait_for condition: a loss line at global step `step` or later."""
  def condition(line):
    found = STEP_LINE.match(line)
    return found and int(found.group(1)) >= step and int(found.group(1))
  return condition


def count_steps(task, at_least, start=0):
  """A wait_for condition: the task has logged `at_least` loss lines since lines[start]."""
  return lambda line: len(matches(STEP_LINE, task.lines[start:])) >= at_least


@pytest.mark.slow
def test_sync_backup_worker_and_chief_killed_and_restarted_reach_max_steps(tasks, sample,
                                                                           tmp_path):
  """Sync, 3 workers, updates of 2 gradients: one worker is a backup.

  Worker 2 is killed and the updates go on; it restarts and rejoins. The chief is
  killed; it restarts from its last checkpoint, rewinding the global step. The run
  still ends at exactly max_steps. While a task (re)starts, the chief is paused
  (SIGSTOP): without its queue runner no update lands, so the run waits for it.
  """
  max_steps, save_every = 50, 10
  ps_port, *worker_ports = local_cluster.free_ports(4)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + sample.flags + ['--train_dir=%s' % tmp_path,
                         '--sync_replicas', '--replicas_to_aggregate=2',
                         '--max_steps=%d' % max_steps, '--save_every_n_steps=%d' % save_every,
                         '--summary_steps=0']

  def start(job_name, task_index):
    return tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags))

  def training(task):
    task.wait_for(lambda line: ': training from global step' in line, 'session')

  start('ps', 0)
  workers = [start('worker', i) for i in range(3)]
  chief = workers[0]
  chief.wait_for(STEP_LINE.match, 'first step')
  chief.send(signal.SIGSTOP)
  for worker in workers[1:]:
    training(worker)
  chief.send(signal.SIGCONT)
  for worker in workers:
    worker.wait_for(count_steps(worker, 2), 'two steps')

  # Worker 2 dies: the other two keep supplying 2 gradients per update.
  workers[2].kill()
  killed = [workers[2]]
  at_kill = max(int(m.group(1)) for w in workers for m in matches(STEP_LINE, w.lines))
  chief.wait_for(step_at_least(at_kill + 3), 'updates without worker 2',
                 start=len(chief.lines))
  chief.send(signal.SIGSTOP)
  workers[2] = start('worker', 2)
  training(workers[2])
  chief.send(signal.SIGCONT)
  workers[2].wait_for(count_steps(workers[2], 2), 'steps after rejoining')
  assert min(int(m.group(1)) for m in matches(STEP_LINE, workers[2].lines)) >= at_kill

  # The chief dies 4 steps past a checkpoint, 6 before the next one.
  saved = [max([0] + [int(m.group(1)) for m in matches(SAVED_LINE, chief.lines)])]

  def past_checkpoint(line):
    found = SAVED_LINE.match(line)
    if found:
      saved[0] = int(found.group(1))
    step = step_at_least(saved[0] + 4)(line)
    return saved[0] >= save_every and step and (saved[0], step)
  checkpoint_step, at_chief_kill = chief.wait_for(
      past_checkpoint, 'the chief 4 steps past a checkpoint', start=len(chief.lines))
  chief.kill()
  killed.append(chief)
  chief = workers[0] = start('worker', 0)
  resuming = chief.wait_for(RESUMING_LINE.match, 'resuming')
  # It restores the last checkpoint, at the global step stored in it. In sync mode
  # the chief's queue runner may land an update while the saver writes, so the
  # file named model.ckpt-N can hold step N + 1 (TensorFlow's CheckpointSaverHook
  # reads the step for the name before it saves the variables).
  assert int(resuming.group(1)) == checkpoint_step
  restored = int(resuming.group(2))
  stored = tf.train.load_checkpoint(str(tmp_path / ('model.ckpt-%d' % checkpoint_step)))
  assert restored == stored.get_tensor('global_step')
  assert checkpoint_step <= restored <= checkpoint_step + 1
  # Its first checkpoint, saved as the session opens: the global step went back
  # from at least at_chief_kill.
  first_saved = chief.wait_for(SAVED_LINE.match, 'a checkpoint')
  assert restored <= int(first_saved.group(1)) < at_chief_kill

  local_steps = 0
  for worker in workers:
    code, log = worker.finish()
    assert code == 0, log[-3000:]
    [done] = matches(DONE_LINE, log.splitlines())
    assert int(done.group(3)) == max_steps
    local_steps += int(done.group(2))
  assert load(str(tmp_path))['global_step'] == max_steps
  # Each update averaged 2 gradients, each from one worker step (a killed task may
  # have sent one more than it logged).
  local_steps += sum(len(matches(STEP_LINE, task.lines)) + 1 for task in killed)
  assert local_steps >= 2 * max_steps


@pytest.mark.slow
def test_local_cluster_chief_fails_stops_every_task_and_exits_1(tasks, tmp_path):
  with open(os.path.join(tmp_path, 'checkpoint'), 'w') as f:
    f.write('not a checkpoint state\n')  # the chief refuses to train over it
  launcher = tasks([sys.executable, '-u', DIST_TRAIN, '--local_cluster=1,2', '--synthetic',
                    '--train_dir=%s' % tmp_path] + QUICK_FLAGS)
  code, log = launcher.finish()
  assert code == 1
  assert '[worker0] error: %s cannot be read as a checkpoint state file' % os.path.join(
      tmp_path, 'checkpoint') in log
  assert 'local cluster: worker0 exited with 1; stopping the other tasks' in log
  assert tasks_of(launcher) == []  # the ps task and worker 1 are gone too


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


# ---- Help, stops, the train directory lock, the network ---------------------------


def test_helpshort_prints_the_docstring_verbatim():
  _, out, _ = run_cli('--helpshort')  # absl exits 1 after the help
  # Line breaks kept (the command lines end in a backslash), no % taken as a format.
  assert dist_train.__doc__.strip() in out
  assert '--task_index=0 \\\n        --ps_hosts=10.0.0.1:2222' in out


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
  launcher = module_tasks([sys.executable, '-u', DIST_TRAIN, '--local_cluster=1,1',
                           '--synthetic', '--train_dir=%s' % train_dir, '--max_steps=100000',
                           '--save_every_n_steps=100000', '--summary_steps=0'] + QUICK_FLAGS)
  found = launcher.wait_for(LOCAL_CLUSTER_LINE.match, 'the ports')
  ports = [int(h.rsplit(':', 1)[1]) for h in ','.join(found.groups()).split(',')]
  launcher.wait_for(lambda line: STEP_LINE.match(line.partition('] ')[2]), 'a first step')
  return launcher, train_dir, ports


@pytest.mark.slow
def test_local_cluster_ports_listen_only_in_its_private_network(long_cluster):
  launcher, _, ports = long_cluster
  refused = [line for line in launcher.lines if 'cannot have a private network' in line]
  if refused:
    pytest.skip('this machine refuses network namespaces: %s' % refused[0])
  # /proc/net is this test's namespace, the machine's; /proc/PID/net the launcher's.
  assert not set(ports) & listening_ports('/proc/net')
  assert set(ports) <= listening_ports('/proc/%d/net' % launcher.process.pid)
  assert (os.readlink('/proc/%d/ns/net' % launcher.process.pid)
          != os.readlink('/proc/self/ns/net'))


@pytest.mark.slow
def test_second_chief_same_train_dir_exits_naming_it_and_the_first(long_cluster):
  _, train_dir, _ = long_cluster
  before = sorted(os.listdir(train_dir))
  with open(os.path.join(train_dir, '.lock')) as f:
    holder = int(f.read())
  ps_port, worker_port = local_cluster.free_ports(2)
  start = time.time()
  code, out, err = run_cli('--job_name=worker', '--task_index=0', '--synthetic',
                           '--ps_hosts=127.0.0.1:%d' % ps_port,
                           '--worker_hosts=127.0.0.1:%d' % worker_port,
                           '--train_dir=%s' % train_dir)
  assert code == 1
  assert time.time() - start < 30  # at once, not after --startup_timeout_secs
  assert err.strip().splitlines()[-1] == (
      'error: %s is in use by another trainer (PID %d): two runs in one directory would '
      'overwrite each other\'s checkpoints. Stop that run, or give this one another '
      '--train_dir.' % (train_dir, holder))
  assert 'Traceback' not in err
  assert sorted(os.listdir(train_dir)) == before


@pytest.mark.slow
def test_local_cluster_sigterm_chief_saves_then_every_task_stops_143(long_cluster):
  launcher, train_dir, _ = long_cluster
  assert len(tasks_of(launcher)) == 2
  launcher.send(signal.SIGTERM)
  code, log = launcher.finish(timeout=60)
  assert code == 143
  [stopped] = re.findall(r'^\[worker0\] Stopped by SIGTERM at step (\d+); rerun the same '
                         r'command to resume\.$', log, re.M)
  assert load(train_dir)['global_step'] >= int(stopped) >= 1
  assert tf.train.latest_checkpoint(train_dir).endswith('model.ckpt-%s' % stopped)
  assert tasks_of(launcher) == []


@pytest.mark.slow
def test_local_cluster_sync_ctrl_c_chief_saves_then_every_task_stops_130(tasks, tmp_path):
  launcher = tasks([sys.executable, '-u', DIST_TRAIN, '--local_cluster=1,2', '--synthetic',
                    '--sync_replicas', '--train_dir=%s' % tmp_path, '--max_steps=100000',
                    '--summary_steps=0'] + QUICK_FLAGS)
  for worker in ('worker0', 'worker1'):
    launcher.wait_for(lambda line: line.startswith('[%s] ' % worker) and STEP_LINE.match(
        line.partition('] ')[2]), 'a step of %s' % worker)
  launcher.send(signal.SIGINT)  # what Ctrl-C sends; the tasks have a process group apart
  start = time.time()
  code, log = launcher.finish(timeout=60)
  assert code == 130, log[-3000:]
  assert time.time() - start < 20
  [stopped] = re.findall(r'^\[worker0\] Stopped by Ctrl-C at step (\d+); rerun the same '
                         r'command to resume\.$', log, re.M)
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith('model.ckpt-%s' % stopped)
  assert tasks_of(launcher) == []


# What TensorFlow's logging and Python tracebacks look like, and words that alarm.
ERROR_LOOKING = re.compile(r'^[EWF]\d{4} |error|cancel|abort|fail|exception|traceback|'
                           r'deprecat|warning', re.I)


@pytest.mark.slow
@pytest.mark.parametrize('mode', [['--sync_replicas'], []], ids=['sync', 'async'])
def test_local_cluster_normal_finish_prints_no_error_looking_line(tasks, tmp_path, mode):
  # As a user runs it: TensorFlow's default log level, no CUDA_VISIBLE_DEVICES.
  env = {k: v for k, v in os.environ.items()
         if k not in ('TF_CPP_MIN_LOG_LEVEL', 'CUDA_VISIBLE_DEVICES')}
  # Sync: enough steps that worker 1, which looks for the chief's variables once a
  # second, joins well before the end even on a fast machine (20 were over in under a
  # second). Async checks no worker's lines: 20, as it always ran.
  max_steps = 200 if mode else 20
  launcher = tasks([sys.executable, '-u', DIST_TRAIN, '--local_cluster=1,2', '--synthetic',
                    '--train_dir=%s' % tmp_path, '--max_steps=%d' % max_steps,
                    '--log_frequency=10', '--batch_size=8'] + mode, env=env)
  code, log = launcher.finish()
  assert code == 0, log[-3000:]
  # The ps task ended by itself once both workers had said they finished.
  assert '[ps0] ps task 0 done: training is over' in log.splitlines()
  assert log.splitlines()[-1] == ('local cluster: all 2 workers finished, then the 1 ps '
                                  'task(s) by themselves')
  launcher_notices = re.compile('|'.join(local_cluster.QUIET_LINES + local_cluster.NO_GPU_LINES))
  alarming = [line for line in log.splitlines() if ERROR_LOOKING.search(
      line.partition('] ')[2] if TASK_PREFIX.match(line) else line)
      and not (not TASK_PREFIX.match(line) and launcher_notices.search(line))]
  assert alarming == []
  # Sync: loss lines name the global step after the update, as multi_gpu_train.py's:
  # the first step, then every --log_frequency.
  for worker in ('worker0', 'worker1') if mode else ():
    lines = [line.partition('] ')[2] for line in log.splitlines()
             if line.startswith('[%s] ' % worker)]
    [first] = [int(line.rsplit(' ', 1)[1]) for line in lines
               if ': training from global step ' in line]
    steps = [int(m.group(1)) for m in matches(STEP_LINE, lines)]
    assert steps[0] == first + 1, (worker, first, steps)
    # Then one line per 10 steps, at the first global step past a multiple of 10 that
    # this worker sees: a worker whose gradients other workers outpaced may see it
    # several updates late (measured: 14).
    decades = list(range((first + 1) // 10 + 1, max_steps // 10 + 1))  # past steps[0]'s
    assert [s // 10 for s in steps[1:]] == decades[:len(steps) - 1], (worker, steps)
    assert all(s <= max_steps for s in steps[1:]), (worker, steps)


@pytest.mark.slow
def test_ps_killed_and_restarted_both_workers_say_so_and_finish(tasks, tmp_path):
  max_steps = 60
  ps_port, *worker_ports = local_cluster.free_ports(3)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + ['--synthetic', '--train_dir=%s' % tmp_path, '--summary_steps=0',
                         '--max_steps=%d' % max_steps, '--save_every_n_steps=10',
                         '--startup_timeout_secs=20', '--step_timeout_secs=20']

  def start(job_name, task_index):
    return tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags))

  ps = start('ps', 0)
  workers = [start('worker', i) for i in range(2)]
  for worker in workers:
    worker.wait_for(count_steps(worker, 2), 'two steps')
  ps.kill()
  ps = start('ps', 0)
  for worker in workers:
    code, log = worker.finish()
    assert code == 0, log[-3000:]
    assert ('the session was aborted: a ps task (%s) went away or restarted' % ps_hosts[0]
            in log)
    assert matches(DONE_LINE, log.splitlines())[0].group(3) == str(max_steps)
  assert load(str(tmp_path))['global_step'] == max_steps


# ---- The chief keeps multi_gpu_train.py's checkpoint promises (training_run) ---------

def _state_file(train_dir, *paths):
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % paths[-1])
    for path in paths:
      f.write('all_model_checkpoint_paths: "%s"\n' % path)


@pytest.mark.slow
def test_chief_copied_dir_rotation_never_deletes_the_original(module_tasks, tmp_path):
  run1, run2 = str(tmp_path / 'run1'), str(tmp_path / 'run2')
  run_local_cluster(module_tasks, 1, 1, run1, '--synthetic', '--summary_steps=0',
                '--max_steps=3', '--save_every_n_steps=1')
  shutil.copytree(run1, run2)
  # An older state file, written with absolute paths: it names run1's files.
  _state_file(run2, *[os.path.join(run1, 'model.ckpt-%d' % s) for s in (0, 1, 2, 3)])
  originals = sorted(os.listdir(run1))
  logs = run_local_cluster(module_tasks, 1, 1, run2, '--synthetic', '--summary_steps=0',
                       '--max_steps=12', '--save_every_n_steps=1')
  assert sorted(os.listdir(run1)) == originals  # 12 saves rotated in run2 alone
  assert matches(RESUMING_LINE, logs['worker0'])[0].group(2) == '3'
  kept = sorted(n for n in os.listdir(run2) if n.endswith('.index'))
  assert kept == ['model.ckpt-%d.index' % s for s in (10, 11, 12, 8, 9)]


@pytest.mark.slow
def test_chief_without_state_file_resumes_from_newest_checkpoint_not_step_0(module_tasks,
                                                                            tmp_path):
  train_dir = str(tmp_path)
  run_local_cluster(module_tasks, 1, 1, train_dir, '--synthetic', '--summary_steps=0',
                '--max_steps=4', '--save_every_n_steps=2')
  os.remove(os.path.join(train_dir, 'checkpoint'))
  logs = run_local_cluster(module_tasks, 1, 1, train_dir, '--synthetic', '--summary_steps=0',
                       '--max_steps=6', '--save_every_n_steps=2')
  assert matches(RESUMING_LINE, logs['worker0'])[0].groups() == ('4', '4')
  assert 'worker 0: training from global step 4' in logs['worker0']
  assert not [line for line in logs['worker0'] if line.endswith('model.ckpt-0')]
  assert tf.train.load_checkpoint(train_dir).get_tensor('global_step') == 6


@pytest.mark.slow
def test_chief_failed_checkpoint_write_exits_1_saying_so(tasks, tmp_path):
  # A file-size limit of 1 MB: the first checkpoint (4 MB of variables) cannot be written.
  launcher = tasks(['prlimit', '--fsize=1000000', sys.executable, '-u', DIST_TRAIN,
                    '--local_cluster=1,1', '--train_dir=%s' % tmp_path, '--synthetic',
                    '--summary_steps=0', '--max_steps=6'] + QUICK_FLAGS)
  code, log = launcher.finish()
  assert code == 1, log[-3000:]
  assert re.search(r'\[worker0\] error: cannot write checkpoint \S+model\.ckpt-0: File too '
                   r'large', log), log[-3000:]
  assert not [n for n in os.listdir(str(tmp_path)) if 'tempstate' in n or
              n.startswith('model.ckpt')]


def test_helpshort_lists_multi_gpu_train_flags_it_accepts_not_the_refused():
  code, out, _ = run_cli('--helpshort')
  listed = set(re.findall(r'^  --(?:\[no\])?(\w+)', out, re.M))
  for name in ('dataset', 'data_dir', 'max_steps', 'num_gpus', 'batch_size', 'train_dir',
               'save_every_n_steps', 'sync_replicas', 'local_cluster'):
    assert name in listed, (name, out[-2000:])
  assert not listed & set(dist_train.REFUSED_FLAGS)


def test_hand_started_task_warning_names_its_port_and_tensorflow_security_advice(tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  code, out, err = run_cli('--job_name=worker', '--task_index=0', '--synthetic',
                           '--ps_hosts=127.0.0.1:%d' % ps_port,
                           '--worker_hosts=127.0.0.1:%d' % worker_port,
                           '--startup_timeout_secs=1', '--train_dir=%s' % tmp_path)
  assert code == 138 and 'waited 1 s for the ps task(s)' in err, err
  assert ('anyone who can reach port %d of this machine (this task, worker 0)' % worker_port
          in out), out
  assert 'tensorflow/blob/master/SECURITY.md' in out


# ---- --use_fp16: the loss scale on the ps (MNIST: float16 is quick on this CPU) -----
# MNIST's pixels are 0..255: at the initial scale of 32768 the first gradients
# overflow float16, so every fresh fp16 run starts with a few skips.

SKIP_LINE = re.compile(r'^\S+ \S+: step (\d+) skipped: gradients overflowed at loss scale '
                       r'(\S+); scale now (\S+)$')
FP16_STEPS = 12
LOSS_SCALE_VARIABLES = {'loss_scale/scale', 'loss_scale/good_steps',
                        'loss_scale/skipped_steps'}


@pytest.fixture(scope='module')
def mnist_sample(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('mnist'))
  mnist_input.write_sample(path, train_records=2000, test_records=500)
  return ['--dataset=mnist', '--data_dir=%s' % path, '--summary_steps=0']


@pytest.fixture(scope='module')
def fp16_async_run(module_tasks, mnist_sample, tmp_path_factory):
  """1 ps + 2 async workers in fp16, from step 0 to FP16_STEPS."""
  train_dir = str(tmp_path_factory.mktemp('fp16_async'))
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--use_fp16',
                           '--max_steps=%d' % FP16_STEPS, *mnist_sample)
  return train_dir, logs


@pytest.fixture(scope='module')
def float32_after_fp16_run(module_tasks, mnist_sample, fp16_async_run, tmp_path_factory):
  """1 ps + 1 float32 worker, from the fp16 run's last checkpoint, 2 steps more."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('float32')), 'train')
  start_from(tf.train.latest_checkpoint(fp16_async_run[0]), train_dir)
  logs = run_local_cluster(module_tasks, 1, 1, train_dir, '--max_steps=%d' % (FP16_STEPS + 2),
                           *mnist_sample)
  return train_dir, logs


@pytest.fixture(scope='module')
def fp16_sync_after_float32_run(module_tasks, mnist_sample, float32_after_fp16_run,
                                tmp_path_factory):
  """1 ps + 2 sync workers in fp16, from the float32 run's last checkpoint."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('fp16_sync')), 'train')
  start_from(tf.train.latest_checkpoint(float32_after_fp16_run[0]), train_dir)
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--use_fp16', '--sync_replicas',
                           '--max_steps=%d' % (FP16_STEPS + 12), *mnist_sample)
  return train_dir, logs


def assert_float32_variables(checkpoint):
  """Weights and their moving averages float32; only the counters are integers."""
  assert {n for n, v in checkpoint.items() if v.dtype != np.float32} <= {
      'global_step', 'loss_scale/good_steps', 'loss_scale/skipped_steps'}
  assert any(n.endswith('/ExponentialMovingAverage') for n in checkpoint)


@pytest.mark.slow
def test_async_fp16_workers_skip_own_overflows_without_claiming_steps(fp16_async_run):
  train_dir, logs = fp16_async_run
  skips, local_steps = [], 0
  for worker in ('worker0', 'worker1'):
    skips += matches(SKIP_LINE, logs[worker])
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == FP16_STEPS
    local_steps += int(done.group(2))
  checkpoint = load(train_dir)
  assert LOSS_SCALE_VARIABLES <= set(checkpoint) and checkpoint['global_step'] == FP16_STEPS
  assert_float32_variables(checkpoint)
  # The first worker to overflow halves 32768; each skip halves from the scale its
  # own gradients were taken at (or keeps a lower one another worker set).
  assert ('32768', '16384') in [s.groups()[1:] for s in skips]
  assert all(float(s.group(3)) <= float(s.group(2)) / 2 for s in skips)
  # Every worker step either claimed one global step or skipped and claimed none,
  # and every skip was said by its worker.
  assert len(skips) == checkpoint['loss_scale/skipped_steps'] > 0
  assert local_steps == FP16_STEPS + len(skips)
  assert checkpoint['loss_scale/scale'] < 32768


@pytest.mark.slow
def test_fp16_dist_checkpoint_resumed_by_float32_cluster_ignores_loss_scale(
    float32_after_fp16_run):
  train_dir, logs = float32_after_fp16_run
  assert matches(RESUMING_LINE, logs['worker0'])[0].group(2) == str(FP16_STEPS)
  assert not [line for line in logs['worker0'] if 'float16' in line or 'skipped' in line]
  checkpoint = load(train_dir)
  assert checkpoint['global_step'] == FP16_STEPS + 2
  assert not LOSS_SCALE_VARIABLES & set(checkpoint)  # a float32 graph holds none
  assert_float32_variables(checkpoint)


@pytest.mark.slow
def test_sync_fp16_from_float32_checkpoint_chief_says_skips_global_step_waits(
    fp16_sync_after_float32_run):
  train_dir, logs = fp16_sync_after_float32_run
  start, end = FP16_STEPS + 2, FP16_STEPS + 12
  assert ('model.ckpt-%d holds no loss scale (a float32 run\'s): it starts at 32768' % start
          in '\n'.join(logs['worker0']))
  for worker in ('worker0', 'worker1'):
    assert int(matches(DONE_LINE, logs[worker])[0].group(3)) == end
  # The chief's queue runner skips; the chief says each skip, the others none.
  skips = [s.groups() for s in matches(SKIP_LINE, logs['worker0'])]
  assert not matches(SKIP_LINE, logs['worker1'])
  checkpoint = load(train_dir)
  assert len(skips) == checkpoint['loss_scale/skipped_steps'] > 0
  # The skipped updates left the global step where it was: the first ones all
  # name the next step. One halving per skip, from 32768.
  assert skips[0] == (str(start + 1), '32768', '16384')
  assert [float(s[1]) for s in skips] == [32768 / 2 ** i for i in range(len(skips))]
  assert checkpoint['loss_scale/scale'] == 32768 / 2 ** len(skips)
  assert checkpoint['global_step'] == end
  assert_float32_variables(checkpoint)
