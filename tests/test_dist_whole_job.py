"""dist_train.py stopped whole, as cluster managers stop a job: every task at once.

Slurm's scancel, a partition's preemption and a job's time limit, and a Kubernetes job
deleted or preempted, send SIGTERM to every task together; srun --kill-on-bad-exit
sends a second one to the tasks still running once any task has exited. The
promises: the chief finishes its step and saves it (its variables live on the ps
tasks, which serve on until it has), says `Stopped by SIGTERM at step N`; every task
exits 143 within the 30 s grace period, none 0 or 1, none with a traceback; the same
command started again resumes from step N and trains to --max_steps.
"""
import os
import random
import re
import signal
import time

import pytest
import tensorflow as tf

import helpers
from helpers import RESUMING_LINE, SAVED_LINE, STOPPED_LINE, matches

MAX_STEPS = 60    # the stops land at steps 11-14 (this project's 2-core EPYC, 2026-11-28,
                  # `python -m pytest tests/test_dist_whole_job.py -n 0 -s` with the step
                  # printed in assert_chief_stopped_and_saved)
GRACE_SECS = 30   # Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds
# MNIST at 2,000 images a step: about 30 ms a step on 2 cores, so the job trains for
# seconds past its first checkpoint, where it is stopped. The waits are far above
# the grace period: a stop that waited for one of them fails.
JOB_FLAGS = ['--dataset=mnist', '--synthetic', '--batch_size=2000', '--log_frequency=1',
             '--save_every_n_steps=10', '--summary_steps=0', '--max_steps=%d' % MAX_STEPS,
             '--startup_timeout_secs=600', '--step_timeout_secs=600']


def pod_commands(train_dir, num_ps, *flags):
  """The argv of each task of a hand-started job of 2 workers (a Kubernetes job's pods):
  ps first."""
  return list(helpers.job_commands(num_ps, 2, JOB_FLAGS + ['--train_dir=%s' % train_dir]
                                   + list(flags)).values())


def sigterm_all(pids):
  """SIGTERM to every process at once, and again 0.1 s later to those still running."""
  for pid in pids:
    os.kill(pid, signal.SIGTERM)
  time.sleep(0.1)
  for pid in pids:
    try:
      os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
      pass


def past_first_checkpoint(line):
  found = SAVED_LINE.match(line.partition('[worker0] ')[2] or line)
  return found and int(found.group(1)) >= 10


def assert_chief_stopped_and_saved(chief_lines, train_dir, name='SIGTERM'):
  """The chief's `Stopped by SIGTERM at step N`, with model.ckpt-N on disk; returns N."""
  [stopped] = matches(STOPPED_LINE, chief_lines)
  step = int(stopped.group(2))
  assert stopped.group(1) == name and 10 <= step < MAX_STEPS, stopped.group(0)
  assert tf.train.latest_checkpoint(str(train_dir)).endswith('model.ckpt-%d' % step)
  assert helpers.global_step(train_dir) == step
  return step


def assert_quiet(text):
  assert 'Traceback' not in text and not re.search('Stopped by .*without saving', text)


@pytest.mark.slow
@pytest.mark.parametrize('num_ps, mode, save_every', [(1, 'async', 10), (2, 'sync', 10),
                                                      (1, 'async', 1)],
                         ids=['1-async', '2-sync', '1-async-saving-every-step'])
def test_every_pod_sigterm_mid_training_chief_saves_all_exit_143_rerun_resumes(
    tasks, tmp_path, num_ps, mode, save_every):
  # Saving every step, the signal mostly finds the chief inside a save.
  flags = (['--sync_replicas'] if mode == 'sync' else []) + [
      '--save_every_n_steps=%d' % save_every]
  job = [tasks(argv) for argv in pod_commands(tmp_path, num_ps, *flags)]
  chief = job[num_ps]
  chief.wait_for(past_first_checkpoint, 'a checkpoint at step 10 or later')
  sigterm_all([task.pid for task in job])
  start = time.time()
  codes = [task.finish(timeout=GRACE_SECS) for task in job]
  assert time.time() - start < GRACE_SECS
  assert codes == [143] * len(job), [task.log() for task in job if task.process.returncode != 143]
  step = assert_chief_stopped_and_saved(chief.lines, tmp_path)
  for task in job:
    assert_quiet(task.text), task.log()

  rerun = [tasks(argv) for argv in pod_commands(tmp_path, num_ps, *flags)]
  assert [task.finish() for task in rerun] == [0] * len(rerun), [t.log() for t in rerun]
  assert matches(RESUMING_LINE, rerun[num_ps].lines)[0].groups() == (str(step), str(step))
  assert helpers.global_step(tmp_path) == MAX_STEPS


STOPS = 4  # whole-job stops at random moments, per mode; each run resumes the last


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_every_pod_sigterm_at_random_moments_no_step_applied_or_claimed_past_the_save(
    tasks, tmp_path, mode):
  # Async, worker 1 once applied one more update after the chief's save and said
  # `Stopped by SIGTERM at step 10` where the chief saved 9; the rerun resumed from 9.
  rng = random.Random(4600 + len(mode))  # the moments repeat from run to run
  flags = (['--sync_replicas'] if mode == 'sync' else []) + ['--max_steps=100000']
  saved = 0
  for _ in range(STOPS):
    job = [tasks(argv) for argv in pod_commands(tmp_path, 1, *flags)]
    job[1].wait_for(lambda line: line.startswith('worker 0: training from global step'),
                    'the chief training')
    time.sleep(rng.uniform(0, 1.5))  # mid-step, mid-save or in between
    sigterm_all([task.pid for task in job])
    assert [task.finish(timeout=GRACE_SECS) for task in job] == [143] * 3, [
        task.log() for task in job]
    last = saved
    saved = helpers.global_step(tmp_path)
    for worker in job[1:]:  # each names the saved step, and trained none past it
      assert [m.groups() for m in matches(STOPPED_LINE, worker.lines)] == [
          ('SIGTERM', str(saved))], worker.log()
      trained = helpers.steps(helpers.WORKER_LOSS_LINE, worker.lines)
      assert not trained or max(trained) <= saved, (trained, saved, worker.log())
      assert_quiet(worker.text), worker.log()
    assert saved >= last
    if last:  # the run before resumed where its predecessor saved
      assert matches(RESUMING_LINE, job[1].lines)[0].groups() == (str(last), str(last))


@pytest.mark.slow
def test_every_pod_sigterm_at_start_up_chief_saves_step_0_all_exit_143(tasks, tmp_path):
  # Each task signalled as soon as its handlers are in place, before any step.
  job = [tasks(argv) for argv in pod_commands(tmp_path, 1)]
  for task in job:
    helpers.wait_until(lambda: helpers.signal_caught(task.pid, signal.SIGTERM),
                       'the stop handlers', task=task)
  sigterm_all([task.pid for task in job])
  codes = [task.finish(timeout=GRACE_SECS) for task in job]
  assert codes == [143] * 3, [task.log() for task in job]
  [stopped] = matches(STOPPED_LINE, job[1].lines)
  assert stopped.groups() == ('SIGTERM', '0'), job[1].log()
  assert helpers.global_step(tmp_path) == 0
  for task in job:
    assert_quiet(task.text), task.log()


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_local_cluster_every_task_sigterm_chief_saves_all_exit_143_rerun_resumes(
    tasks, tmp_path, mode):
  argv = (['dist_train.py', '--local_cluster=1,2', '--train_dir=%s' % tmp_path] + JOB_FLAGS +
          (['--sync_replicas'] if mode == 'sync' else []))
  launcher = tasks(argv)
  launcher.wait_for(past_first_checkpoint, 'a checkpoint at step 10 or later')
  sigterm_all([launcher.pid] + list(helpers.tasks_of(launcher.pid)))
  assert launcher.finish(timeout=GRACE_SECS) == 143, launcher.log()
  assert ('local cluster: stopped; exit codes: ps0 143, worker0 143, worker1 143'
          in launcher.lines), launcher.log()
  step = assert_chief_stopped_and_saved(helpers.by_task(launcher.lines)['worker0'], tmp_path)
  assert_quiet(launcher.text), launcher.log()

  rerun = tasks(argv)
  assert rerun.finish() == 0, rerun.log()
  resumed = re.findall(r'^\[worker0\] Resuming from .*model\.ckpt-(\d+) at step (\d+)$',
                       rerun.text, re.M)
  assert resumed == [(str(step), str(step))], rerun.log()
  assert helpers.global_step(tmp_path) == MAX_STEPS


@pytest.mark.slow
def test_local_cluster_async_ctrl_c_saves_after_the_workers_stop_no_update_lost(
    tasks, tmp_path):
  # Stopped first, the chief once saved step 27 while worker 1 trained on to 138: the
  # rerun resumed at 27. The other workers stop first now; the chief saves what they left.
  launcher = tasks(['dist_train.py', '--local_cluster=1,2', '--train_dir=%s' % tmp_path] +
                   JOB_FLAGS)
  launcher.wait_for(past_first_checkpoint, 'a checkpoint at step 10 or later')
  launcher.send(signal.SIGINT)
  assert launcher.finish(timeout=GRACE_SECS) == 130, launcher.log()
  logs = helpers.by_task(launcher.lines)
  step = assert_chief_stopped_and_saved(logs['worker0'], tmp_path, 'Ctrl-C')
  trained = helpers.steps(helpers.WORKER_LOSS_LINE, logs['worker0'] + logs['worker1'])
  assert max(trained) <= step, (max(trained), step, launcher.log())
