"""dist_train.py's tasks killed, stopped and restarted; the chief's checkpoint promises.

Real ps and worker processes on 127.0.0.1, each bounded in time: workers, the chief
and a ps task killed and restarted (sync with a backup worker, async); preemption, a
task stopped by SIGTERM or Ctrl-C and restarted with the same command (sync without
backup workers: test_dist_sync_faults.py); the chief's checkpoints as multi_gpu_train.py's
(rotation in a copied directory, no state file, a failed write, a job already over, a
diverging run). Every process is killed when its test ends, pass or fail.
"""
import os
import re
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

import helpers
from helpers import (DONE_LINE, PREEMPT_STEPS, QUICK_FLAGS, RESUMING_LINE, SAVED_LINE,
                     STEADY_FLAGS, WORKER_LOSS_LINE, assert_done_at_max_steps,
                     chief_stopped_at_its_first_step, matches, preempt_cluster, run_job,
                     step_at_least)
from distributed import cluster_env, local_cluster, ps_task
import multi_gpu_train
from training import checkpoints


# ---- Workers and the chief killed and restarted ------------------------------------

def count_steps(task, at_least, start=0):
  """A wait_for condition: the task has logged `at_least` loss lines since lines[start]."""
  return lambda line: len(matches(WORKER_LOSS_LINE, task.lines[start:])) >= at_least


TENSORFLOW_ERROR = re.compile(r'[EF]\d{4} |ERROR:tensorflow:|Additional GRPC error|Traceback')


def training(task):
  task.wait_for(helpers.TRAINING_FROM, 'a session')


def backup_worker_cluster(start, sample, train_dir, max_steps, save_every):
  """start(job_name, task_index) -> Task, for a hand-started sync job on the sample:
  1 ps task and 3 workers, each update averaging 2 gradients (one worker is a backup)."""
  ps_port, *worker_ports = local_cluster.free_ports(4)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + sample.flags + ['--train_dir=%s' % train_dir,
                         '--sync_replicas', '--replicas_to_aggregate=2',
                         '--max_steps=%d' % max_steps, '--save_every_n_steps=%d' % save_every,
                         '--summary_steps=0']
  return lambda job_name, task_index: start(local_cluster.task_command(
      job_name, task_index, ps_hosts, worker_hosts, flags))


def chief_held_until_all_train(workers):
  """Pauses the chief at its first step until the other workers train, then resumes it."""
  chief = workers[0]
  chief.wait_for(WORKER_LOSS_LINE, 'first step')
  chief.send(signal.SIGSTOP)
  for worker in workers[1:]:
    training(worker)
  chief.send(signal.SIGCONT)


def worker_2_killed_and_rejoined(start, workers):
  """Kills worker 2, restarts it once 3 updates landed without it, and returns once it
  has taken a step: (its new Task, the chief's last step before the kill)."""
  # Worker 2 dies once in the run (its session open): the other two keep supplying
  # 2 gradients per update, and each update leaves one token more than they take.
  chief = workers[0]
  workers[2].kill()
  at_kill = max(helpers.steps(WORKER_LOSS_LINE, chief.lines))
  chief.wait_for(step_at_least(at_kill + 3), 'updates without worker 2',
                 start=len(chief.lines))
  for worker in workers[:2]:
    worker.send(signal.SIGSTOP)
  rejoined = start('worker', 2)
  training(rejoined)
  # Its first step needs a token. With both others paused the queue may hold none:
  # they take the spare tokens as they come, and a gradient found stale spends one.
  # The chief runs on (worker 1 still paused): its queue runner lands updates of the
  # gradients in, each handing out tokens, so one reaches worker 2.
  chief.send(signal.SIGCONT)
  rejoined.wait_for(count_steps(rejoined, 1), 'a step after rejoining')
  workers[1].send(signal.SIGCONT)
  return rejoined, at_kill


def chief_killed_past_a_checkpoint(chief, save_every):
  """Kills the chief 4 steps past a checkpoint (of step save_every or later), 1 before
  the next one; returns that checkpoint's step."""
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
  return checkpoint_step


def assert_resumed_from(chief, checkpoint_step, train_dir):
  """The restarted chief resumes from the checkpoint of checkpoint_step and never writes
  that checkpoint again."""
  resuming = chief.wait_for(RESUMING_LINE, 'resuming')
  # It restores the last checkpoint, at the global step stored in it. In sync mode
  # the chief's queue runner may land an update while the saver writes, so the
  # file named model.ckpt-N can hold step N + 1 (TensorFlow's CheckpointSaverHook
  # reads the step for the name before it saves the variables).
  assert int(resuming.group(1)) == checkpoint_step
  restored = int(resuming.group(2))
  assert restored == helpers.global_step(train_dir / ('model.ckpt-%d' % checkpoint_step))
  assert checkpoint_step <= restored <= checkpoint_step + 1
  # The checkpoint it resumed from is not written again (a rewrite that failed could
  # lose it): its first save is of a step past it.
  first_saved = chief.wait_for(SAVED_LINE, 'a checkpoint')
  assert restored < int(first_saved.group(1)), chief.log()
  assert not [line for line in chief.lines if line.startswith(
      'Saved checkpoint %s/model.ckpt-%d' % (train_dir, checkpoint_step))], chief.log()


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
  start = backup_worker_cluster(tasks, sample, tmp_path, max_steps, save_every)
  start('ps', 0)
  workers = [start('worker', i) for i in range(3)]
  chief_held_until_all_train(workers)
  killed = [workers[2]]
  workers[2], at_kill = worker_2_killed_and_rejoined(start, workers)
  assert min(helpers.steps(WORKER_LOSS_LINE, workers[2].lines)) >= at_kill
  killed.append(workers[0])
  checkpoint_step = chief_killed_past_a_checkpoint(workers[0], save_every)
  workers[0] = start('worker', 0)
  assert_resumed_from(workers[0], checkpoint_step, tmp_path)

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
@pytest.mark.parametrize('mode_flags', [[], ['--sync_replicas']], ids=['async', 'sync'])
def test_ps_killed_and_restarted_both_workers_say_so_in_their_own_line_only_and_finish(
    tasks, tmp_path, mode_flags):
  max_steps = 60
  ps_port, *worker_ports = local_cluster.free_ports(3)
  ps_hosts = ['127.0.0.1:%d' % ps_port]
  worker_hosts = ['127.0.0.1:%d' % p for p in worker_ports]
  flags = QUICK_FLAGS + STEADY_FLAGS + mode_flags + [
      '--train_dir=%s' % tmp_path, '--summary_steps=0', '--max_steps=%d' % max_steps,
      '--save_every_n_steps=10']

  def start(job_name, task_index):
    return tasks(local_cluster.task_command(job_name, task_index, ps_hosts, worker_hosts, flags))

  ps = start('ps', 0)
  workers = [start('worker', i) for i in range(2)]
  # Each held after two steps: the ps goes away mid-run. Async, each as soon as it has
  # them (the chief alone would run to max_steps); sync, both once both have: each
  # update waits for both, and one held first left the other none (a race this test
  # lost under load, worker 1 exiting 138).
  for worker in workers:
    worker.wait_for(count_steps(worker, 2), 'two steps')
    if not mode_flags:
      worker.send(signal.SIGSTOP)
  for worker in workers if mode_flags else []:
    worker.send(signal.SIGSTOP)
  ps.kill()
  ps = start('ps', 0)
  for worker in workers:
    worker.send(signal.SIGCONT)
  for worker in workers:
    assert worker.finish() == 0, worker.log()
    assert ('the session was aborted: a ps task (%s) went away or restarted' % ps_hosts[0]
            in worker.text), worker.log()
    # Before, TensorFlow's own errors said it again, in 4-8 lines: "ERROR:tensorflow:An
    # error occurred when attempting to close the session" (the sync chief) and
    # "E... master_session.cc] Cleanup partition error: UNAVAILABLE" with gRPC's detail.
    assert not [line for line in worker.lines if TENSORFLOW_ERROR.match(line)], worker.log()
    assert matches(DONE_LINE, worker.lines)[0].group(3) == str(max_steps)
  # A ps task that restarted lost its variables: the chief says so, and restores them.
  assert re.search(r'^worker 0: the ps tasks restarted: restoring step \d+ from .*'
                   r'model\.ckpt-\d+$', workers[0].text, re.M), workers[0].log()
  assert 'the ps tasks still hold' not in workers[0].text, workers[0].log()
  assert helpers.global_step(tmp_path) == max_steps


# ---- Preemption: a task stopped by a signal, restarted with the same command -------
# docs/distributed.md's table "Preemption: a signal to any task, then a restart": its
# cells that failed before (sync: the chief's queue runner closed the token queue on
# the ps as it stopped), and the async chief beside them.

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


# ---- The chief keeps multi_gpu_train.py's checkpoint promises (training.checkpoints) ---------

def train_in_process(train_dir, max_steps, save_every_n_steps):
  """multi_gpu_train's synthetic run: checkpoints the chief resumes like its own."""
  multi_gpu_train.train(helpers.trainer_settings(
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
  logs = run_job(tasks, 1, 1, run2, '--synthetic', '--summary_steps=0',
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
  logs = run_job(tasks, 1, 1, train_dir, '--synthetic', '--summary_steps=0',
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
  settings = helpers.trainer_settings(str(tmp_path), '', synthetic=True, max_steps=4)
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
    # No ps task is up to be told that the worker has finished: it does not wait to
    # tell one (it waited 5 s, silently, before).
    assert 'telling the ps tasks' not in task.text, task.log()
  assert sorted(os.listdir(tmp_path)) == before  # no record, no checkpoint, no lock


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


@pytest.mark.slow
def test_data_file_cut_mid_run_chief_saves_then_each_worker_stops_in_one_line(tasks,
                                                                              tmp_path):
  # As multi_gpu_train.py's: the file cut as a copy in progress would leave it. Both
  # workers read the same copy; the other has nothing to save.
  data = helpers.write_sample(tmp_path / 'data', 40)  # 200 training records: 25 steps an epoch
  train_dir = tmp_path / 'train'
  ports = local_cluster.free_ports(3)
  hosts = ['--ps_hosts=127.0.0.1:%d' % ports[0],
           '--worker_hosts=127.0.0.1:%d,127.0.0.1:%d' % tuple(ports[1:])]
  flags = [*hosts, *QUICK_FLAGS, *data.flags, '--summary_steps=0', '--max_steps=100000']
  tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  chief = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *flags,
                 '--train_dir=%s' % train_dir, '--save_every_n_steps=5'])
  other = tasks(['dist_train.py', '--job_name=worker', '--task_index=1', *flags])
  for worker in (chief, other):
    worker.wait_for(lambda line: (m := WORKER_LOSS_LINE.match(line)) and int(m.group(1)) >= 6,
                    'the loss line of step 6')  # step 5 is saved
  path = os.path.join(data.dir, 'cifar-10-batches-bin', 'data_batch_3.bin')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 1000)
  for worker, then in ((chief, r'Saved step (\d+); rerun to resume once the file is whole\.'),
                       (other, r'This worker saves nothing \(the chief does\); rerun it once '
                               r'the file is whole\.')):
    assert worker.finish() == 1, worker.log()
    errors = [line for line in worker.err_lines if line.startswith('error')]
    assert len(errors) == 1 and 'Traceback' not in worker.err, worker.log()
    assert re.fullmatch(r'error: a data file changed during the run: %s has 121920 bytes.* %s'
                        % (re.escape(path), then), errors[0]), errors[0]
  step = int(re.search(r'Saved step (\d+)', chief.err).group(1))
  assert helpers.global_step(train_dir) == step > 5, chief.log()
