"""dist_train.py: real ps and worker processes on 127.0.0.1, each bounded in time.

The cluster tests start TensorFlow servers on free loopback ports and read the
tasks' logs as they come. Every process is killed when its test ends, pass or fail.
Where a test needs several workers to train side by side, it holds each worker
(SIGSTOP) as it says it is training and lets them all go together: a worker that
joins late (the others look for the chief's variables once a second) can then
never find the run already over.
"""
import io
import os
import re
import shutil
import signal
import socket
import time

import numpy as np
import pytest
import tensorflow as tf

import dist_train
import helpers
from helpers import (DONE_LINE, RESUMING_LINE, SAVED_LINE, SKIP_LINE, TASK_PREFIX,
                     WORKER_LOSS_LINE, matches)
from distributed import cluster_env, local_cluster, ps_placement, ps_task
import cifar10
import mnist
import multi_gpu_train
from training import checkpoints, updates
from training.settings import Settings

# Tiny and quick: 8 images a step, a loss line per step.
QUICK_FLAGS = ['--batch_size=8', '--log_frequency=1', '--startup_timeout_secs=60',
               '--step_timeout_secs=60']
# For runs of many async steps whose model does not matter: CIFAR-10 at its learning
# rate of 0.1 on one synthetic batch of 8, two async workers applying the same
# gradient, diverged (loss nan) in 2 of 33 runs of 200 steps, from step 62 on; the
# book's MNIST network at 0.001 settles at once (1 ms a step).
STEADY_FLAGS = ['--dataset=mnist', '--synthetic']


def local_cluster_task(start, num_ps, num_workers, train_dir, *flags, env=None):
  """Starts dist_train.py --local_cluster=P,W with QUICK_FLAGS; returns its Task."""
  return start(['dist_train.py', '--local_cluster=%d,%d' % (num_ps, num_workers),
                '--train_dir=%s' % train_dir] + QUICK_FLAGS + list(flags), env)


def run_local_cluster(start, num_ps, num_workers, train_dir, *flags):
  """Runs dist_train.py --local_cluster to the end; returns {task: [its lines]}."""
  launcher = local_cluster_task(start, num_ps, num_workers, train_dir, *flags)
  assert launcher.finish() == 0, launcher.log()
  return helpers.by_task(launcher.lines)


def start_together(launcher, num_workers):
  """Pauses each worker of a --local_cluster as it says it is training; then resumes all.

  Returns once every worker trains: none can have finished before the last joined.
  """
  waiting, paused = set(range(num_workers)), []

  def training(line):
    found = TASK_PREFIX.match(line)
    index = found and found.group(1).startswith('worker') and int(found.group(1)[6:])
    started = found and helpers.TRAINING_FROM.match(found.group(2))
    return started and index in waiting and (index,)
  while waiting:
    [index] = launcher.wait_for(training, 'worker(s) %s training' % sorted(waiting))
    pid = helpers.task_pid(launcher.pid, 'worker', index)
    os.kill(pid, signal.SIGSTOP)
    paused.append(pid)
    waiting.remove(index)
  for pid in paused:
    os.kill(pid, signal.SIGCONT)


# ---- Flags and hosts, in-process ------------------------------------------------


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


# ---- Flags, as a user runs them ---------------------------------------------------


def test_main_nonloopback_host_without_opt_in_exits_before_serving(tmp_path):
  done = helpers.run(['dist_train.py', '--job_name=ps', '--ps_hosts=10.1.2.3:2222',
                      '--worker_hosts=127.0.0.1:2223', '--train_dir=%s' % tmp_path])
  assert done.code == 1, done.log()
  assert ('error: --ps_hosts names 10.1.2.3:2222, which is not a loopback address'
          in done.err), done.log()
  assert '--allow_nonloopback_hosts' in done.err
  assert 'serving' not in done.out


def test_main_multi_gpu_train_only_flag_exits_naming_it(tmp_path):
  done = helpers.run(['dist_train.py', '--local_cluster=1,1', '--fresh',
                      '--train_dir=%s' % tmp_path])
  assert done.code == 1, done.log()
  assert ('error: --fresh is a multi_gpu_train.py flag that dist_train.py does not take'
          in done.err), done.log()
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('flags, message', [
    (['--local_cluster=1,2', '--sync_replicas', '--replicas_to_aggregate=3'],
     'error: --replicas_to_aggregate=3 is more than the 2 workers: no update could ever '
     'gather that many gradients'),
    (['--local_cluster=1,1', '--step_timeout_secs=%d' % 10 ** 13],
     'error: --step_timeout_secs must be at most 604800 (a week), got %d' % 10 ** 13),
], ids=['replicas', 'seconds'])
def test_main_value_out_of_range_exits_naming_it_before_any_task(tmp_path, flags, message):
  done = helpers.run(['dist_train.py', '--train_dir=%s' % tmp_path, '--synthetic', *flags])
  assert done.code == 1 and done.err.splitlines()[-1] == message, done.log()
  assert 'local cluster:' not in done.out and os.listdir(tmp_path) == []


@pytest.mark.xdist_group('helpshort')
def test_helpshort_lists_multi_gpu_train_flags_it_accepts_not_the_refused(helpshort):
  listed = helpers.listed_flags(helpshort('dist_train.py').out)
  for name in ('dataset', 'data_dir', 'max_steps', 'num_gpus', 'batch_size', 'train_dir',
               'save_every_n_steps', 'sync_replicas', 'local_cluster'):
    assert name in listed, (name, helpshort('dist_train.py').log())
  assert not listed & set(dist_train.REFUSED_FLAGS)


@pytest.mark.xdist_group('helpshort')
def test_helpshort_prints_the_docstring_verbatim(helpshort):
  out = helpshort('dist_train.py').out  # absl exits 1 after the help
  # Line breaks kept (the command lines end in a backslash), no % taken as a format.
  assert dist_train.__doc__.strip() in out
  assert '--task_index=0 \\\n        --ps_hosts=10.0.0.1:2222' in out


@pytest.mark.slow
def test_hand_started_task_warning_names_its_port_and_tensorflow_security_advice(tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  done = helpers.run(['dist_train.py', '--job_name=worker', '--task_index=0', '--synthetic',
                      '--ps_hosts=127.0.0.1:%d' % ps_port,
                      '--worker_hosts=127.0.0.1:%d' % worker_port,
                      '--startup_timeout_secs=1', '--train_dir=%s' % tmp_path])
  assert done.code == 138 and 'waited 1 s for the ps task(s)' in done.err, done.log()
  assert ('anyone who can reach port %d of this machine (this task, worker 0)' % worker_port
          in done.out), done.log()
  assert 'tensorflow/blob/master/SECURITY.md' in done.out


# ---- A worker that cannot start ---------------------------------------------------


@pytest.mark.slow
def test_worker_no_ps_reachable_exits_138_after_its_startup_deadline(tasks, sample, tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)  # nothing listens on ps_port
  worker = tasks(['dist_train.py', '--job_name=worker', '--task_index=0',
                  '--ps_hosts=127.0.0.1:%d' % ps_port,
                  '--worker_hosts=127.0.0.1:%d' % worker_port,
                  '--startup_timeout_secs=2', *sample.flags, '--train_dir=%s' % tmp_path])
  assert worker.finish() == 138, worker.log()  # a peer went away: restart this task (>= 128)
  ended = time.time()
  # The security warning comes once TensorFlow is imported, before the wait: then 2 s,
  # not the default 120.
  [warned] = [when for line, when in zip(worker.lines, worker.arrived)
              if 'anyone who can reach port %d' % worker_port in line]
  assert ended - warned < 30, worker.log()
  errors = [line for line in worker.err_lines if line.startswith('error')]
  assert errors == [
      'error: worker 0 waited 2 s for the ps task(s) at 127.0.0.1:%d: nothing accepts '
      'connections there. Start them first (python dist_train.py --job_name=ps '
      '--task_index=i with the same --ps_hosts and --worker_hosts), check --ps_hosts, or '
      'raise --startup_timeout_secs.' % ps_port], worker.log()
  assert 'Traceback' not in worker.text
  assert '--startup_timeout_secs' in worker.text


# A batch whose one step needs more memory than any machine has (about 2 MB an image).
HUGE_BATCH = 10 ** 7


@pytest.mark.slow
def test_worker_batch_too_large_for_memory_stops_in_one_line_before_the_session(tasks,
                                                                                tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  hosts = ['--ps_hosts=127.0.0.1:%d' % ps_port, '--worker_hosts=127.0.0.1:%d' % worker_port]
  tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  worker = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *hosts,
                  '--synthetic', '--batch_size=%d' % HUGE_BATCH, '--train_dir=%s' % tmp_path])
  assert worker.finish() == 1, worker.log()
  errors = [line for line in worker.err_lines if line.startswith('error')]
  assert len(errors) == 1 and errors[0].startswith(
      'error: one step at --batch_size=%d x 1 towers needs about ' % HUGE_BATCH), worker.log()
  assert 'Traceback' not in worker.text and 'Starting from step 0' not in worker.text
  assert not [name for name in os.listdir(tmp_path) if name.startswith('model.ckpt')]


# ---- Two workers, async and sync, against one process ------------------------------

MAX_STEPS = 40
# What TensorFlow's logging and Python tracebacks look like, and words that alarm.
ERROR_LOOKING = re.compile(r'^[EWF]\d{4} |error|cancel|abort|fail|exception|traceback|'
                           r'deprecat|warning', re.I)


def alarming_lines(lines):
  """Lines of a --local_cluster run a user would take for trouble: the tasks' own, and
  the launcher's but for its notices about what it quiets."""
  notices = re.compile('|'.join(local_cluster.QUIET_LINES + local_cluster.NO_GPU_LINES))
  alarming = []
  for line in lines:
    task_line = TASK_PREFIX.match(line)
    text = task_line.group(2) if task_line else line
    if ERROR_LOOKING.search(text) and (task_line or not notices.search(line)):
      alarming.append(line)
  return alarming


def two_worker_run(start, train_dir, *flags):
  """1 ps + 2 workers on the synthetic batch, as a user runs it (the default log level),
  the workers started together. Returns the launcher's lines."""
  launcher = local_cluster_task(start, 1, 2, train_dir, '--synthetic',
                                '--max_steps=%d' % MAX_STEPS, *flags, env=helpers.user_env())
  start_together(launcher, 2)
  assert launcher.finish() == 0, launcher.log()
  return launcher.lines


@pytest.fixture(scope='module')
def async_run(module_tasks, tmp_path_factory):
  """1 ps + 2 async workers on the same synthetic batch, from step 0 to MAX_STEPS."""
  train_dir = str(tmp_path_factory.mktemp('async'))
  return train_dir, two_worker_run(module_tasks, train_dir, '--summary_steps=10')


@pytest.fixture(scope='module')
def sync_run(module_tasks, async_run, tmp_path_factory):
  """1 ps + 2 sync workers, from the async run's first checkpoint to MAX_STEPS."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('sync')), 'train')
  helpers.copy_checkpoint(os.path.join(async_run[0], 'model.ckpt-0'), train_dir)
  return train_dir, two_worker_run(module_tasks, train_dir, '--summary_steps=0',
                                   '--sync_replicas', '--log_frequency=10')


@pytest.fixture(scope='module')
def one_process_run(async_run, tmp_path_factory):
  """multi_gpu_train.py, one tower, from the same checkpoint on the same batch."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('one_process')), 'train')
  helpers.copy_checkpoint(os.path.join(async_run[0], 'model.ckpt-0'), train_dir)
  multi_gpu_train.train(Settings(
      train_dir, '', synthetic=True, max_steps=MAX_STEPS, batch_size=8, summary_steps=0))
  return train_dir


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_async_two_workers_both_train_to_exactly_max_steps(async_run):
  train_dir, lines = async_run
  logs = helpers.by_task(lines)
  assert sorted(logs) == ['ps0', 'worker0', 'worker1']
  local_steps = {}
  for worker in ('worker0', 'worker1'):
    loss_lines = [line for line in logs[worker] if ': step ' in line]
    assert loss_lines and all(map(WORKER_LOSS_LINE.match, loss_lines)), loss_lines
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == MAX_STEPS
    local_steps[worker] = int(done.group(2))
    assert local_steps[worker] >= 1, 'worker %s did not contribute' % worker
  # Every update is one worker step; none past MAX_STEPS, none lost.
  assert sum(local_steps.values()) == MAX_STEPS
  assert helpers.global_step(train_dir) == MAX_STEPS
  assert tf.train.latest_checkpoint(train_dir).endswith('model.ckpt-%d' % MAX_STEPS)
  # Only the chief saves and writes summaries, into one event file.
  assert matches(SAVED_LINE, logs['worker0']) and not matches(SAVED_LINE, logs['worker1'])
  assert len(helpers.event_files(train_dir)) == 1
  assert {'1_loss/total_loss', '2_training/learning_rate'} <= helpers.summary_tags(train_dir)
  # As multi_gpu_train.py's, the run ends with a summary of where it stopped.
  assert max(helpers.scalars(train_dir, '1_loss/total_loss')) == MAX_STEPS


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_chief_tensorboard_examples_per_sec_is_a_rate_of_its_steps(async_run):
  # Timed, as multi_gpu_train.py's, on the chief's steps that computed no summary: each
  # value is a median of step rates the chief's loss lines show too (its hook's window
  # sits inside the loop's, a little shorter). Not a comparison of two medians: on two
  # shared cores, two workers' rates swing 10x within a run of 40 steps.
  train_dir, lines = async_run
  chief = matches(WORKER_LOSS_LINE, helpers.by_task(lines)['worker0'])
  summarised = sorted(helpers.scalars(train_dir, '1_loss/total_loss'))
  # A summary at step s was computed in the chief's first step shown past s: that
  # line's rate is a summary step's, 4-5x slower, which the value must not be.
  summary_lines = {next((i for i, m in enumerate(chief) if int(m.group(1)) > s), None)
                   for s in summarised}
  console = helpers.examples_per_sec(WORKER_LOSS_LINE, [
      m.group(0) for i, m in enumerate(chief) if i and i not in summary_lines])
  board = helpers.scalars(train_dir, '2_training/examples_per_sec')
  # How many summaries carry a rate depends on how the two workers' steps interleave:
  # the chief sums up only when its own step crosses a multiple of --summary_steps, and
  # a rate needs a step of its own without a summary before (a fresh-clone run saw 2).
  assert board, board
  for value in board.values():
    assert 0.9 * min(console) <= value <= 1.1 * max(console), (console, board)


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_local_cluster_normal_finish_prints_no_error_looking_line(async_run, sync_run, mode):
  _, lines = async_run if mode == 'async' else sync_run
  # The ps task ended by itself once both workers had said they finished.
  assert '[ps0] ps task 0 done: training is over' in lines
  assert lines[-1] == ('local cluster: all 2 workers finished, then the 1 ps task(s) by '
                       'themselves')
  assert alarming_lines(lines) == []


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_sync_loss_lines_name_the_global_step_first_then_every_log_frequency(sync_run):
  # As multi_gpu_train.py's: the global step after the update, at the first step,
  # then at the first global step past each multiple of --log_frequency=10 that this
  # worker sees: a worker whose gradients the other outpaced may see it several
  # updates late (measured: 14).
  logs = helpers.by_task(sync_run[1])
  for worker in ('worker0', 'worker1'):
    [first] = [int(m.group(2)) for m in matches(helpers.TRAINING_FROM, logs[worker])]
    steps = helpers.steps(WORKER_LOSS_LINE, logs[worker])
    assert steps[0] == first + 1, (worker, first, steps)
    decades = list(range((first + 1) // 10 + 1, MAX_STEPS // 10 + 1))  # past steps[0]'s
    assert [s // 10 for s in steps[1:]] == decades[:len(steps) - 1], (worker, steps)
    assert all(s <= MAX_STEPS for s in steps[1:]), (worker, steps)


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_sync_schedule_counts_the_examples_each_update_averages(async_run, sync_run):
  # An epoch is the same 50,000 examples however they are grouped: a sync update
  # averages 2 workers' batches of 8, so the rate drops after half as many updates as
  # async's, whose updates are one worker's batch each.
  schedule = re.compile(r'^\[worker[01]\] decay_steps (\d+) = 50000 examples \(.*\) / '
                        r'(\d+) per (worker step|update) x 350 epochs; input: synthetic$')
  found = {mode: {m.groups() for m in matches(schedule, run[1])}
           for mode, run in (('async', async_run), ('sync', sync_run))}
  assert found == {'async': {('%d' % (50000 / 8 * 350), '8', 'worker step')},
                   'sync': {('%d' % (50000 / 16 * 350), '16', 'update')}}, found


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.xdist_group('two_workers')
def test_sync_two_workers_equal_one_process_sgd_unlike_async(sync_run, one_process_run,
                                                             async_run):
  train_dir, lines = sync_run
  logs = helpers.by_task(lines)
  [resuming] = matches(RESUMING_LINE, logs['worker0'])
  start = int(resuming.group(2))  # the async run's first checkpoint, 0 or 1
  done = {w: matches(DONE_LINE, logs[w])[0] for w in ('worker0', 'worker1')}
  assert all(int(d.group(2)) >= 1 for d in done.values())
  # Each update averages 2 worker gradients: the global step counts updates, not steps.
  assert sum(int(d.group(2)) for d in done.values()) >= 2 * (MAX_STEPS - start)
  sync = helpers.checkpoint(train_dir)
  one_process = helpers.checkpoint(one_process_run)
  async_ = helpers.checkpoint(async_run[0])
  assert sync['global_step'] == one_process['global_step'] == MAX_STEPS
  # Same batch everywhere, stale gradients dropped: each update is one SGD step on
  # the current variables, as in one process. The moving averages, stepped once
  # per update by the chief, match too.
  assert sorted(sync) == sorted(one_process)
  for name in sync:
    np.testing.assert_allclose(sync[name], one_process[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert any(name.endswith('/ExponentialMovingAverage') for name in sync)
  # The async workers, started together, applied gradients of variables that had
  # changed meanwhile: they differ from one-process SGD by far more than sync's
  # tolerance (measured 8.3e-4 to above 1e-3).
  assert max(np.abs(async_[name] - sync[name]).max() for name in sync) > 1e-4


# ---- Workers and the chief killed and restarted ------------------------------------

def step_at_least(step):
  """A wait_for condition: a loss line at global step `step` or later."""
  def condition(line):
    found = WORKER_LOSS_LINE.match(line)
    return found and int(found.group(1)) >= step and int(found.group(1))
  return condition


def count_steps(task, at_least, start=0):
  """A wait_for condition: the task has logged `at_least` loss lines since lines[start]."""
  return lambda line: len(matches(WORKER_LOSS_LINE, task.lines[start:])) >= at_least


def training(task):
  task.wait_for(helpers.TRAINING_FROM, 'a session')


@pytest.mark.slow
def test_sync_backup_worker_and_chief_killed_and_restarted_reach_max_steps(tasks, sample,
                                                                           tmp_path):
  """Sync, 3 workers, updates of 2 gradients: one worker is a backup.

  Worker 2 is killed and the updates go on; it restarts and rejoins. The chief is
  killed; it restarts from its last checkpoint, rewinding the global step. The run
  still ends at exactly max_steps. The other workers are paused (SIGSTOP) while a
  task (re)starts: without the chief's queue runner no update lands, so the run
  waits for it, and worker 1 cannot take the tokens worker 2 needs for its step.
  Updates run free only while worker 2 is down (3 and more, while worker 1 takes
  its slow first step), while the chief alone waits with worker 2 for its first
  step after rejoining, and until the chief is 4 past a checkpoint (at most 9): a
  worker's first step is slow (1.8 s measured under load, 30 updates of the others),
  so no other phase waits for one while the others run.
  """
  max_steps, save_every = 50, 5
  ps_port, *worker_ports = local_cluster.free_ports(4)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + sample.flags + ['--train_dir=%s' % tmp_path,
                         '--sync_replicas', '--replicas_to_aggregate=2',
                         '--max_steps=%d' % max_steps, '--save_every_n_steps=%d' % save_every,
                         '--summary_steps=0']

  def start(job_name, task_index):
    return tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags))

  start('ps', 0)
  workers = [start('worker', i) for i in range(3)]
  chief = workers[0]
  chief.wait_for(WORKER_LOSS_LINE, 'first step')
  chief.send(signal.SIGSTOP)
  for worker in workers[1:]:
    training(worker)
  chief.send(signal.SIGCONT)

  # Worker 2 dies once in the run (its session open): the other two keep supplying
  # 2 gradients per update, and each update leaves one token more than they take.
  workers[2].kill()
  killed = [workers[2]]
  at_kill = max(helpers.steps(WORKER_LOSS_LINE, chief.lines))
  chief.wait_for(step_at_least(at_kill + 3), 'updates without worker 2',
                 start=len(chief.lines))
  for worker in workers[:2]:
    worker.send(signal.SIGSTOP)
  workers[2] = start('worker', 2)
  training(workers[2])
  # Its first step needs a token. With both others paused the queue may hold none:
  # they take the spare tokens as they come, and a gradient found stale spends one.
  # The chief runs on (worker 1 still paused): its queue runner lands updates of the
  # gradients in, each handing out tokens, so one reaches worker 2.
  workers[0].send(signal.SIGCONT)
  workers[2].wait_for(count_steps(workers[2], 1), 'a step after rejoining')
  workers[1].send(signal.SIGCONT)
  assert min(helpers.steps(WORKER_LOSS_LINE, workers[2].lines)) >= at_kill

  # The chief dies 4 steps past a checkpoint, 1 before the next one.
  saved = [max([0] + helpers.steps(SAVED_LINE, chief.lines))]

  def past_checkpoint(line):
    found = SAVED_LINE.match(line)
    if found:
      saved[0] = int(found.group(1))
    step = step_at_least(saved[0] + 4)(line)
    return saved[0] >= save_every and step and (saved[0], step)
  checkpoint_step, _ = chief.wait_for(
      past_checkpoint, 'the chief 4 steps past a checkpoint', start=len(chief.lines))
  chief.kill()
  killed.append(chief)
  chief = workers[0] = start('worker', 0)
  resuming = chief.wait_for(RESUMING_LINE, 'resuming')
  # It restores the last checkpoint, at the global step stored in it. In sync mode
  # the chief's queue runner may land an update while the saver writes, so the
  # file named model.ckpt-N can hold step N + 1 (TensorFlow's CheckpointSaverHook
  # reads the step for the name before it saves the variables).
  assert int(resuming.group(1)) == checkpoint_step
  restored = int(resuming.group(2))
  assert restored == helpers.global_step(tmp_path / ('model.ckpt-%d' % checkpoint_step))
  assert checkpoint_step <= restored <= checkpoint_step + 1
  # The checkpoint it resumed from is not written again (a rewrite that failed could
  # lose it): its first save is of a step past it.
  first_saved = chief.wait_for(SAVED_LINE, 'a checkpoint')
  assert restored < int(first_saved.group(1)), chief.log()
  assert not [line for line in chief.lines if line.startswith(
      'Saved checkpoint %s/model.ckpt-%d' % (tmp_path, checkpoint_step))], chief.log()

  local_steps = 0
  for worker in workers:
    assert worker.finish() == 0, worker.log()
    [done] = matches(DONE_LINE, worker.lines)
    assert int(done.group(3)) == max_steps
    local_steps += int(done.group(2))
  assert helpers.global_step(tmp_path) == max_steps
  # Each update averaged 2 gradients, each from one worker step (a killed task may
  # have sent one more than it logged).
  local_steps += sum(len(matches(WORKER_LOSS_LINE, task.lines)) + 1 for task in killed)
  assert local_steps >= 2 * max_steps


@pytest.mark.slow
def test_ps_killed_and_restarted_both_workers_say_so_and_finish(tasks, tmp_path):
  max_steps = 60
  ps_port, *worker_ports = local_cluster.free_ports(3)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + STEADY_FLAGS + ['--train_dir=%s' % tmp_path, '--summary_steps=0',
                                        '--max_steps=%d' % max_steps, '--save_every_n_steps=10']

  def start(job_name, task_index):
    return tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags))

  ps = start('ps', 0)
  workers = [start('worker', i) for i in range(2)]
  for worker in workers:  # each held after two steps: the ps goes away mid-run
    worker.wait_for(count_steps(worker, 2), 'two steps')
    worker.send(signal.SIGSTOP)
  ps.kill()
  ps = start('ps', 0)
  for worker in workers:
    worker.send(signal.SIGCONT)
  for worker in workers:
    assert worker.finish() == 0, worker.log()
    assert ('the session was aborted: a ps task (%s) went away or restarted' % ps_hosts[0]
            in worker.text), worker.log()
    assert matches(DONE_LINE, worker.lines)[0].group(3) == str(max_steps)
  assert helpers.global_step(tmp_path) == max_steps


# ---- Preemption: a task stopped by a signal, restarted with the same command -------
# docs/distributed.md's table "Preemption: a signal to any task, then a restart": its
# cells that failed before (sync: the chief's queue runner closed the token queue on
# the ps as it stopped), and the async chief beside them.

PREEMPT_STEPS = 60


def preempt_cluster(start, train_dir, *flags):
  """(start(job_name, task_index) -> Task, the ps host) of one cluster, 1 ps + 2 workers.

  Their waits are far above the test's: a worker waits for a stopped chief to come
  back (sync: for its token) up to --step_timeout_secs.
  """
  ps_port, *worker_ports = local_cluster.free_ports(3)
  ps_hosts, worker_hosts = ['127.0.0.1:%d' % ps_port], ['127.0.0.1:%d' % p for p in worker_ports]
  task_flags = QUICK_FLAGS + STEADY_FLAGS + [
      '--train_dir=%s' % train_dir, '--summary_steps=0', '--max_steps=%d' % PREEMPT_STEPS,
      '--save_every_n_steps=10', '--startup_timeout_secs=600', '--step_timeout_secs=600',
      *flags]
  return (lambda job_name, task_index: start(local_cluster.task_command(
      job_name, task_index, ps_hosts, worker_hosts, task_flags))), ps_hosts[0]


def chief_stopped_at_its_first_step(start, signum):
  """Starts the chief, signals it, then starts the ps: the chief stops before any step.

  Held without a sleep: the signal goes once the chief's own handlers are in place,
  and it cannot train before the ps task answers, which it starts only then. It
  opens its session (its variables initialised, checkpoint 0 saved, the sync
  chief's token queue filled), takes no step, and exits. Returns (chief, ps).
  """
  chief = start('worker', 0)
  helpers.wait_until(lambda: helpers.signal_caught(chief.pid, signal.SIGTERM),
                     'the chief\'s stop handlers', task=chief)
  chief.send(signum)
  return chief, start('ps', 0)


def assert_done_at_max_steps(task):
  [done] = matches(DONE_LINE, task.lines)
  assert int(done.group(3)) == PREEMPT_STEPS, task.log()
  assert 'Traceback' not in task.text, task.log()


@pytest.mark.slow
@pytest.mark.parametrize('signum, code, name', [(signal.SIGTERM, 143, 'SIGTERM'),
                                                (signal.SIGINT, 130, 'Ctrl-C')],
                         ids=['SIGTERM', 'Ctrl-C'])
def test_sync_chief_stopped_by_signal_restarted_with_ps_up_all_reach_max_steps(
    tasks, tmp_path, signum, code, name):
  start, _ = preempt_cluster(tasks, tmp_path, '--sync_replicas')
  chief, ps = chief_stopped_at_its_first_step(start, signum)
  assert chief.finish() == code, chief.log()
  assert matches(helpers.STOPPED_LINE, chief.lines)[0].groups() == (name, '0'), chief.log()
  # Worker 1 trains with what the chief left on the ps: its first tokens, then none.
  worker = start('worker', 1)
  worker.wait_for(WORKER_LOSS_LINE, 'a first step of worker 1')
  chief = start('worker', 0)  # the same command, the ps still up
  assert chief.finish() == 0, chief.log()
  assert matches(RESUMING_LINE, chief.lines)[0].groups() == ('0', '0'), chief.log()
  assert worker.finish() == 0, worker.log()  # once, at the end: it waited for the chief
  assert ps.finish() == 0, ps.log()
  for task in (chief, worker):
    assert_done_at_max_steps(task)
  assert helpers.global_step(tmp_path) == PREEMPT_STEPS


def close_token_queue(ps_host):
  """Closes the sync token queue on the ps task, as TensorFlow's queue runner does as a
  chief's session closes: SyncReplicasOptimizer's queue, found by its shared name."""
  with tf.Graph().as_default() as graph:
    with tf.device('/job:ps/task:0'):
      queue = tf.queue.FIFOQueue(-1, tf.int64, shapes=(), name='sync_token_q',
                                 shared_name='sync_token_q')
      close = queue.close(cancel_pending_enqueues=True)
  # Only the ps task: a session that also saw the workers would wait for the chief.
  config = tf.compat.v1.ConfigProto(device_filters=['/job:ps/task:0'])
  with tf.compat.v1.Session('grpc://' + ps_host, graph=graph, config=config) as sess:
    sess.run(close, options=tf.compat.v1.RunOptions(timeout_in_ms=60 * 1000))


@pytest.mark.slow
def test_sync_worker_whose_token_queue_closes_exits_138_without_reporting_finished(
    tasks, tmp_path):
  start, ps_host = preempt_cluster(tasks, tmp_path, '--sync_replicas')
  chief, ps = chief_stopped_at_its_first_step(start, signal.SIGTERM)
  assert chief.finish() == 143, chief.log()
  worker = start('worker', 1)
  worker.wait_for(WORKER_LOSS_LINE, 'a first step of worker 1')
  close_token_queue(ps_host)
  assert worker.finish() == 138, worker.log()  # "restart me", not 0: training is not over
  assert [line for line in worker.err_lines if line.startswith('error')] == [
      'error: worker 1: training ended at global step 0, below --max_steps=%d, and no '
      'signal stopped it: the token queue on the ps tasks was closed, so no averaged '
      'update can come (restart the ps tasks too: a restarted ps opens a new one). '
      'Restart this task with the same command; it rejoins.' % PREEMPT_STEPS], worker.log()
  assert not matches(DONE_LINE, worker.lines), worker.log()
  assert 'worker 1 has finished' not in ps.text, ps.log()


@pytest.mark.slow
def test_async_chief_stopped_worker_finishes_restarted_chief_resumes_all_exit_0(tasks,
                                                                                 tmp_path):
  start, _ = preempt_cluster(tasks, tmp_path)
  chief, ps = chief_stopped_at_its_first_step(start, signal.SIGTERM)
  assert chief.finish() == 143, chief.log()
  # Async, worker 1 needs no chief: it applies every update, to --max_steps.
  worker = start('worker', 1)
  assert worker.finish() == 0, worker.log()
  assert_done_at_max_steps(worker)
  # The restarted chief puts its last checkpoint back on the ps and trains the rest.
  chief = start('worker', 0)
  assert chief.finish() == 0, chief.log()
  assert matches(RESUMING_LINE, chief.lines)[0].groups() == ('0', '0'), chief.log()
  assert_done_at_max_steps(chief)
  assert ps.finish() == 0, ps.log()
  assert helpers.global_step(tmp_path) == PREEMPT_STEPS


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
  # Each task sleeps before it runs a line of dist_train.py, as one still importing
  # TensorFlow when its launcher is killed: Python runs sitecustomize at start-up.
  site = tmp_path / 'site'
  site.mkdir()
  (site / 'sitecustomize.py').write_text(
      'import os, time\nif os.environ.get(%r):  # a task, not the launcher\n  time.sleep(600)\n'
      % local_cluster.DIE_WITH_LAUNCHER_ENV)
  python_path = os.pathsep.join(filter(None, [str(site), os.environ.get('PYTHONPATH')]))
  launcher = local_cluster_task(tasks, 1, 2, tmp_path / 'train', '--synthetic',
                                env=helpers.user_env(PYTHONPATH=python_path))
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


# ---- The chief keeps multi_gpu_train.py's checkpoint promises (training.checkpoints) ---------

def train_in_process(train_dir, max_steps, save_every_n_steps):
  """multi_gpu_train's synthetic run: checkpoints the chief resumes like its own."""
  multi_gpu_train.train(Settings(
      str(train_dir), '', synthetic=True, batch_size=8, max_steps=max_steps, summary_steps=0,
      save_every_n_steps=save_every_n_steps))


def _state_file(train_dir, *paths):
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % paths[-1])
    for path in paths:
      f.write('all_model_checkpoint_paths: "%s"\n' % path)


@pytest.mark.slow
def test_chief_copied_dir_rotation_never_deletes_the_original(tasks, tmp_path):
  run1, run2 = str(tmp_path / 'run1'), str(tmp_path / 'run2')
  train_in_process(run1, max_steps=3, save_every_n_steps=1)
  shutil.copytree(run1, run2)
  # An older state file, written with absolute paths: it names run1's files.
  steps = sorted(checkpoints.checkpoint_step(name[:-len('.index')])
                 for name in os.listdir(run1) if name.endswith('.index'))
  assert steps[-3:] == [1, 2, 3]
  _state_file(run2, *[os.path.join(run1, 'model.ckpt-%d' % s) for s in steps])
  originals = sorted(os.listdir(run1))
  logs = run_local_cluster(tasks, 1, 1, run2, '--synthetic', '--summary_steps=0',
                           '--max_steps=12', '--save_every_n_steps=1')
  assert sorted(os.listdir(run1)) == originals  # 12 saves rotated in run2 alone
  assert matches(RESUMING_LINE, logs['worker0'])[0].group(2) == '3'
  kept = sorted(n for n in os.listdir(run2) if n.endswith('.index'))
  assert kept == ['model.ckpt-%d.index' % s for s in (10, 11, 12, 8, 9)]


@pytest.mark.slow
def test_chief_without_state_file_resumes_from_newest_checkpoint_not_step_0(tasks, tmp_path):
  train_dir = str(tmp_path)
  train_in_process(train_dir, max_steps=4, save_every_n_steps=2)
  os.remove(os.path.join(train_dir, 'checkpoint'))
  logs = run_local_cluster(tasks, 1, 1, train_dir, '--synthetic', '--summary_steps=0',
                           '--max_steps=6', '--save_every_n_steps=2')
  assert matches(RESUMING_LINE, logs['worker0'])[0].groups() == ('4', '4')
  assert 'worker 0: training from global step 4' in logs['worker0']
  assert not [line for line in logs['worker0'] if line.endswith('model.ckpt-0')]
  assert helpers.global_step(train_dir) == 6


@pytest.mark.slow
def test_chief_failed_checkpoint_write_exits_1_saying_so(tasks, tmp_path):
  # A file-size limit of 1 MB: the first checkpoint (4 MB of variables) cannot be written.
  launcher = tasks(['prlimit', '--fsize=1000000', *helpers.Task.python_argv('dist_train.py'),
                    '--local_cluster=1,1', '--train_dir=%s' % tmp_path, '--synthetic',
                    '--summary_steps=0', '--max_steps=6'] + QUICK_FLAGS)
  assert launcher.finish() == 1, launcher.log()
  assert re.search(r'\[worker0\] error: cannot write checkpoint \S+model\.ckpt-0: File too '
                   r'large', launcher.text), launcher.log()
  assert not [n for n in os.listdir(str(tmp_path)) if 'tempstate' in n or
              n.startswith('model.ckpt')]


@pytest.mark.slow
def test_chief_resumed_that_cannot_write_keeps_the_checkpoint_it_resumed_from(tasks, tmp_path):
  train_in_process(tmp_path, max_steps=4, save_every_n_steps=2)
  before = {n: os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)
            if n.startswith('model.ckpt-4')}
  # Resumed under a file-size limit of 1 MB: no checkpoint (4 MB) can be written.
  launcher = tasks(['prlimit', '--fsize=1000000', *helpers.Task.python_argv('dist_train.py'),
                    '--local_cluster=1,1', '--train_dir=%s' % tmp_path, '--synthetic',
                    '--summary_steps=0', '--max_steps=8', '--save_every_n_steps=2']
                   + QUICK_FLAGS)
  assert launcher.finish() == 1, launcher.log()
  assert re.search(r'\[worker0\] error: cannot write checkpoint \S+model\.ckpt-6: File too '
                   r'large.*the previous checkpoint, step 4, and the state file are untouched',
                   launcher.text), launcher.log()
  # It did not write the step it resumed from again, and what it says is so.
  assert {n: os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)
          if n.startswith('model.ckpt-4')} == before
  assert helpers.global_step(tmp_path) == 4
  assert not [n for n in os.listdir(tmp_path) if n.startswith('model.ckpt-6')]


@pytest.mark.parametrize('state, over', [
    ('model_checkpoint_path: "model.ckpt-4"\n', True),
    ('model_checkpoint_path: "model.ckpt-3"\n', False),
    ('model_checkpoint_path: "model.ckpt-5"\n', False),  # named, its files gone
    ('not a state file {\n', False),  # the chief's checks say what is wrong with it
    (None, False),
], ids=['at-max', 'below', 'named-but-gone', 'unreadable', 'none'])
def test_job_is_over_only_at_max_steps_read_by_the_state_file_reader(tmp_path, capsys,
                                                                     state, over):
  for step in (3, 4):  # the checkpoints on disk (their index files; nothing reads them)
    (tmp_path / ('model.ckpt-%d.index' % step)).write_text('')
  if state is not None:
    (tmp_path / 'checkpoint').write_text(state)
  ps = cluster_env.Cluster(['127.0.0.1:1'], ['127.0.0.1:2'], 'ps', 0, 'flags', '')
  settings = Settings(str(tmp_path), '', synthetic=True, max_steps=4)
  assert ps_task.job_is_over(ps, None, settings) == over
  said = capsys.readouterr().out
  assert said == ('ps 0: the job is over: %s/model.ckpt-4 is at step 4, not below '
                  '--max_steps=4: nothing to do. Raise --max_steps to train further.\n'
                  % tmp_path if over else ''), said


@pytest.mark.slow
def test_every_task_started_after_the_job_ended_says_so_and_exits_0(tasks, tmp_path):
  train_in_process(tmp_path, max_steps=2, save_every_n_steps=2)
  before = sorted(os.listdir(tmp_path))
  ps_hosts, worker_hosts = (lambda h: (h[:1], h[1:]))(
      ['127.0.0.1:%d' % p for p in local_cluster.free_ports(3)])
  flags = QUICK_FLAGS + ['--synthetic', '--train_dir=%s' % tmp_path, '--max_steps=2']
  # Each alone, as an orchestrator retrying a finished job starts them: none waits
  # for the others (a ps would serve forever, a worker wait for the ps tasks).
  for job_name, task_index in (('ps', 0), ('worker', 0), ('worker', 1)):
    task = tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts,
                                            flags))
    assert task.finish(timeout=60) == 0, task.log()
    assert ('%s %d: the job is over: %s/model.ckpt-2 is at step 2, not below '
            '--max_steps=2: nothing to do.' % (job_name, task_index, tmp_path)
            in task.text), task.log()
  assert sorted(os.listdir(tmp_path)) == before  # no record, no checkpoint, no lock


# ---- --use_fp16: the loss scale on the ps (MNIST: float16 is quick on this CPU) -----
# MNIST's pixels are 0..255: at the initial scale of 32768 the first gradients
# overflow float16, so every fresh fp16 run starts with a few skips.

FP16_STEPS = 12
LOSS_SCALE_VARIABLES = {'loss_scale/scale', 'loss_scale/good_steps',
                        'loss_scale/skipped_steps'}


@pytest.fixture(scope='module')
def mnist_flags(mnist_sample):
  return ['--dataset=mnist', '--data_dir=%s' % mnist_sample, '--summary_steps=0']


@pytest.fixture(scope='module')
def fp16_async_run(module_tasks, mnist_flags, tmp_path_factory):
  """1 ps + 2 async workers in fp16, from step 0 to FP16_STEPS."""
  train_dir = str(tmp_path_factory.mktemp('fp16_async'))
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--use_fp16',
                           '--max_steps=%d' % FP16_STEPS, *mnist_flags)
  return train_dir, logs


@pytest.fixture(scope='module')
def float32_after_fp16_run(module_tasks, mnist_flags, fp16_async_run, tmp_path_factory):
  """1 ps + 1 float32 worker, from the fp16 run's last checkpoint, 2 steps more."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('float32')), 'train')
  helpers.copy_checkpoint(tf.train.latest_checkpoint(fp16_async_run[0]), train_dir)
  logs = run_local_cluster(module_tasks, 1, 1, train_dir, '--max_steps=%d' % (FP16_STEPS + 2),
                           *mnist_flags)
  return train_dir, logs


@pytest.fixture(scope='module')
def fp16_sync_after_float32_run(module_tasks, mnist_flags, float32_after_fp16_run,
                                tmp_path_factory):
  """1 ps + 2 sync workers in fp16, from the float32 run's last checkpoint."""
  train_dir = os.path.join(str(tmp_path_factory.mktemp('fp16_sync')), 'train')
  helpers.copy_checkpoint(tf.train.latest_checkpoint(float32_after_fp16_run[0]), train_dir)
  logs = run_local_cluster(module_tasks, 1, 2, train_dir, '--use_fp16', '--sync_replicas',
                           '--max_steps=%d' % (FP16_STEPS + 12), *mnist_flags)
  return train_dir, logs


def assert_float32_variables(checkpoint):
  """Weights and their moving averages float32; only the counters are integers."""
  assert {n for n, v in checkpoint.items() if v.dtype != np.float32} <= {
      'global_step', 'loss_scale/good_steps', 'loss_scale/skipped_steps'}
  assert any(n.endswith('/ExponentialMovingAverage') for n in checkpoint)


@pytest.mark.slow
@pytest.mark.xdist_group('fp16_clusters')
def test_async_fp16_workers_skip_own_overflows_without_claiming_steps(fp16_async_run):
  train_dir, logs = fp16_async_run
  skips, local_steps = [], 0
  for worker in ('worker0', 'worker1'):
    skips += matches(SKIP_LINE, logs[worker])
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == FP16_STEPS
    local_steps += int(done.group(2))
  checkpoint = helpers.checkpoint(train_dir)
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
@pytest.mark.xdist_group('fp16_clusters')
def test_fp16_dist_checkpoint_resumed_by_float32_cluster_ignores_loss_scale(
    float32_after_fp16_run):
  train_dir, logs = float32_after_fp16_run
  assert matches(RESUMING_LINE, logs['worker0'])[0].group(2) == str(FP16_STEPS)
  assert re.search(r'^ps tasks \S+ hold 397510 trainable parameters$', '\n'.join(
      logs['worker0']), re.M)  # the book's network
  assert not [line for line in logs['worker0'] if 'float16' in line or 'skipped' in line]
  checkpoint = helpers.checkpoint(train_dir)
  assert checkpoint['global_step'] == FP16_STEPS + 2
  assert not LOSS_SCALE_VARIABLES & set(checkpoint)  # a float32 graph holds none
  assert_float32_variables(checkpoint)


@pytest.mark.slow
@pytest.mark.xdist_group('fp16_clusters')
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
  checkpoint = helpers.checkpoint(train_dir)
  assert len(skips) == checkpoint['loss_scale/skipped_steps'] > 0
  # The skipped updates left the global step where it was: the first ones all
  # name the next step. One halving per skip, from 32768.
  assert skips[0] == (str(start + 1), '32768', '16384')
  assert [float(s[1]) for s in skips] == [32768 / 2 ** i for i in range(len(skips))]
  assert checkpoint['loss_scale/scale'] == 32768 / 2 ** len(skips)
  assert checkpoint['global_step'] == end
  assert_float32_variables(checkpoint)


BF16_UNITS = helpers.bfloat16_units()


@pytest.mark.slow
@pytest.mark.skipif(not BF16_UNITS.ok, reason='--use_bf16 is refused here: %s' % BF16_UNITS.what)
def test_local_cluster_bf16_worker_says_bfloat16_towers_checkpoint_float32(tasks, tmp_path):
  logs = run_local_cluster(tasks, 1, 1, tmp_path, '--use_bf16', '--max_steps=5',
                           '--summary_steps=0', *STEADY_FLAGS)
  assert re.search(r'^bfloat16 towers on .+, float32 variables; LRN, softmax and loss in '
                   r'float32; no loss scale$', '\n'.join(logs['worker0']), re.M), logs
  assert int(matches(DONE_LINE, logs['worker0'])[0].group(3)) == 5
  checkpoint = helpers.checkpoint(tmp_path)
  assert checkpoint['global_step'] == 5 and not LOSS_SCALE_VARIABLES & set(checkpoint)
  assert_float32_variables(checkpoint)


def _diverging_copy(tmp_path):
  """A copy of the programs whose MNIST learning rate is 1e12: the loss diverges at once."""
  copy = tmp_path / 'diverging'
  shutil.copytree(helpers.ROOT, copy, ignore=shutil.ignore_patterns(
      '.git', 'tests', 'benchmarks', 'docs', 'deploy', '__pycache__'))
  model = copy / 'mnist' / 'model.py'
  text, edits = re.subn(r'^INITIAL_LEARNING_RATE = \S+', 'INITIAL_LEARNING_RATE = 1e12',
                        model.read_text(), flags=re.M)
  assert edits == 1
  model.write_text(text)
  return copy


@pytest.mark.slow
def test_chief_diverging_saves_no_non_finite_checkpoint_and_says_which_is_untouched(
    tasks, tmp_path):
  copy, train_dir = _diverging_copy(tmp_path), tmp_path / 'train'
  launcher = tasks([str(copy / 'dist_train.py'), '--local_cluster=1,1',
                    '--train_dir=%s' % train_dir, *QUICK_FLAGS, *STEADY_FLAGS,
                    '--save_every_n_steps=1', '--summary_steps=0', '--max_steps=1000'])
  assert launcher.finish() == 1, launcher.log()
  [error] = [line.partition('] ')[2] for line in launcher.lines if '] error: ' in line]
  said = re.search(r'(loss is nan at step \d+ on worker 0|a variable became NaN or '
                   r'infinite by step \d+).*the last checkpoint, step (\d+), is untouched\.$',
                   error)
  assert said, launcher.log()
  # What it says is so: that checkpoint is the newest, and no checkpoint holds a NaN.
  state = tf.train.get_checkpoint_state(str(train_dir))
  assert os.path.basename(state.model_checkpoint_path) == 'model.ckpt-%s' % said.group(2)
  for path in state.all_model_checkpoint_paths:
    for name, value in helpers.checkpoint(train_dir / path).items():
      assert np.isfinite(value).all(), (path, name)


@pytest.mark.parametrize('model_name', ['cifar10', 'mnist'])
def test_tower_reads_each_variable_from_the_ps_once_a_step(model_name):
  """A step's forward pass, weight decay and gradients share one read of each variable:
  under replica_device_setter every read consumed on the worker is one transfer of the
  whole variable from the ps (the decay's own read of local3's weights was 3.5 MB a step)."""
  model = {'cifar10': cifar10, 'mnist': mnist}[model_name]
  shape = [2, 24, 24, 3] if model_name == 'cifar10' else [2, 784]
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2']})
  with tf.Graph().as_default() as graph:
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device='/job:worker/task:0')):
      with tf.name_scope('tower_0') as scope:
        loss = multi_gpu_train.tower_loss(scope, tf.zeros(shape), tf.zeros([2], tf.int32),
                                          model=model)
      variables = tf.compat.v1.trainable_variables()
      tf.gradients(loss, variables)
  for var in variables:
    reads = [op.outputs[0] for op in graph.get_operations()
             if op.type == 'ReadVariableOp' and op.inputs[0] is var.handle]
    sent = [read for read in reads
            if any(c.device.startswith('/job:worker/') for c in read.consumers())]
    assert len(sent) == 1, (var.name, [(r.name, [c.name for c in r.consumers()]) for r in sent])


def test_variables_dealt_to_the_ps_tasks_by_size_and_said_at_start_up():
  """replica_device_setter's round robin put every weight of the model on ps 1 (4.27 of
  4.27 MB) and every bias on ps 0; by size, the task holding local3/weights (83% of the
  bytes) takes only what keeps it least loaded at the time."""
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1', '127.0.0.1:2'],
                                  'worker': ['127.0.0.1:3']})
  with tf.Graph().as_default():
    with tf.compat.v1.device(ps_placement.replica_devices(cluster, 0)):
      tf.compat.v1.train.get_or_create_global_step()
      with tf.name_scope('tower_0') as scope:
        multi_gpu_train.tower_loss(scope, tf.zeros([2, 24, 24, 3]), tf.zeros([2], tf.int32))
    placed = {var.op.name: var.device for var in tf.compat.v1.trainable_variables()}
    said = ps_placement.bytes_by_ps_task(2)
  assert {name for name, device in placed.items() if device == '/job:ps/task:1'} == {
      'conv1/weights', 'conv2/biases', 'local3/weights'}
  assert set(placed.values()) == {'/job:ps/task:0', '/job:ps/task:1'}
  assert said == ' (ps0 0.71 MB, ps1 3.56 MB)'


def test_moving_averages_computed_on_the_ps_task_of_their_variable():
  """Under replica_device_setter each average's arithmetic sits beside its variable;
  on the worker it would pull every variable and its average over the network and push
  the new average back, each step (updates.then_average)."""
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1', '127.0.0.1:2'],
                                  'worker': ['127.0.0.1:3']})
  with tf.Graph().as_default() as graph:
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device='/job:worker/task:0')):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      cifar10.inference(tf.zeros([1, 24, 24, 3]))
      ema = updates.moving_averages(global_step, cifar10)
      before = len(graph.get_operations())
      updates.then_average(tf.no_op(), ema)
    # NoOps group; a resource's reads carry no device, the placer puts them by it.
    made = [op for op in graph.get_operations()[before:]
            if op.type != 'NoOp' and not (op.type == 'ReadVariableOp' and not op.device)]
    variables = {v.device for v in tf.compat.v1.trainable_variables()}
  assert variables == {'/job:ps/task:0', '/job:ps/task:1'}
  assert made and all(op.device.startswith('/job:ps/') for op in made), sorted(
      (op.name, op.device) for op in made if not op.device.startswith('/job:ps/'))[:5]
  assign_subs = [op for op in made if op.type in ('AssignSub', 'AssignSubVariableOp')]
  assert len(assign_subs) == 10  # one per variable, on its average's task
  assert {op.device for op in assign_subs} == variables
  assert all(op.device == op.inputs[0].op.device for op in assign_subs)
