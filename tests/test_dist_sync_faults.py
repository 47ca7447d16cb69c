"""dist_train.py's sync mode without backup workers: each update holds one gradient
from each worker, whatever happens to one of them.

A worker killed holding its token or not, a chief stopped before its first step and
restarted with the ps task up, a worker whose token queue closes. Real ps and worker
processes on 127.0.0.1; every process is killed when its test ends, pass or fail.
"""
import re
import signal
import time

import pytest
import tensorflow as tf

import helpers
from helpers import (DONE_LINE, PREEMPT_STEPS, QUICK_FLAGS, RESUMING_LINE, STEADY_FLAGS,
                     WORKER_LOSS_LINE, assert_done_at_max_steps, chief_stopped_at_its_first_step,
                     matches, preempt_cluster, run_on_ps, step_at_least,
                     sync_ps_state)

pytestmark = pytest.mark.slow


def waiting_for_its_token(ps_host, task_index, num_workers=2):
  """A wait_until condition: the worker has sent its gradient for the next update, so
  its step waits for a token (gradients_at, worker_updates.SyncReplicas)."""
  return lambda: (lambda step, at: at[task_index] == step)(*sync_ps_state(ps_host, num_workers))


@pytest.mark.parametrize('signum, code, name', [(signal.SIGTERM, 143, 'SIGTERM'),
                                                (signal.SIGINT, 130, 'Ctrl-C')],
                         ids=['SIGTERM', 'Ctrl-C'])
def test_sync_chief_stopped_by_signal_restarted_with_ps_up_all_reach_max_steps(
    tasks, tmp_path, signum, code, name):
  start, ps_host = preempt_cluster(tasks, tmp_path, '--sync_replicas')
  chief, ps = chief_stopped_at_its_first_step(start, signum)
  assert chief.finish() == code, chief.log()
  assert matches(helpers.STOPPED_LINE, chief.lines)[0].groups() == (name, '0'), chief.log()
  # Worker 1 sends its first gradient, and waits for the chief's: no update without it
  # (before, the chief's start handed out a token per worker, and worker 1 trained on
  # them alone, two of its gradients to the first update).
  worker = start('worker', 1)
  helpers.wait_until(waiting_for_its_token(ps_host, 1), 'worker 1 waiting for its token',
                     worker)
  assert not matches(WORKER_LOSS_LINE, worker.lines), worker.log()
  chief = start('worker', 0)  # the same command, the ps still up
  assert chief.finish() == 0, chief.log()
  assert matches(RESUMING_LINE, chief.lines)[0].groups() == ('0', '0'), chief.log()
  assert worker.finish() == 0, worker.log()  # once, at the end: it waited for the chief
  assert ps.finish() == 0, ps.log()
  for task in (chief, worker):
    assert_done_at_max_steps(task)
  assert helpers.global_step(tmp_path) == PREEMPT_STEPS


def close_token_queue(ps_host, task_index):
  """Closes a worker's sync token queue on the ps task, as TensorFlow's queue runner does
  as a chief's session closes: worker_updates.SyncReplicas's queue, found by its shared
  name."""
  name = 'sync_token_q_worker_%d' % task_index
  run_on_ps(ps_host, lambda: tf.queue.FIFOQueue(-1, tf.int64, shapes=(), name=name,
                                                shared_name=name).close(
                                                    cancel_pending_enqueues=True))


def test_sync_worker_whose_token_queue_closes_exits_138_without_reporting_finished(
    tasks, tmp_path):
  start, ps_host = preempt_cluster(tasks, tmp_path, '--sync_replicas')
  chief, ps = chief_stopped_at_its_first_step(start, signal.SIGTERM)
  assert chief.finish() == 143, chief.log()
  worker = start('worker', 1)
  helpers.wait_until(waiting_for_its_token(ps_host, 1), 'worker 1 waiting for its token',
                     worker)
  close_token_queue(ps_host, 1)
  assert worker.finish() == 138, worker.log()  # "restart me", not 0: training is not over
  assert [line for line in worker.err_lines if line.startswith('error')] == [
      'error: worker 1: training ended at global step 0, below --max_steps=%d, and no '
      'signal stopped it: the token queue on the ps tasks was closed, so no averaged '
      'update can come (restart the ps tasks too: a restarted ps opens a new one). '
      'Restart this task with the same command; it rejoins.' % PREEMPT_STEPS], worker.log()
  assert not matches(DONE_LINE, worker.lines), worker.log()
  assert 'worker 1 has finished' not in ps.text, ps.log()


def worker_1_waiting_for_its_token(job, ps_host):
  """Pauses the chief (its queue runner too: no update can come), then waits until worker
  1 has sent its gradient for the next update: its step waits for a token, holding none."""
  job['worker0'].send(signal.SIGSTOP)
  helpers.wait_until(waiting_for_its_token(ps_host, 1), 'worker 1 waiting for its token',
                     job['worker1'])


@pytest.mark.parametrize('moment', ['holding_a_token', 'not_holding_a_token'])
def test_sync_worker_killed_at_either_moment_chief_exits_138_naming_it_no_update_without_it(
    tasks, tmp_path, moment):
  """A sync job whose other worker is SIGKILL'd, at one of the two moments of its step:
  holding a token (the update it waited for came while it was paused: its token was
  taken for it), or not (killed while it waited). Before, at the second, the token it
  never took stayed in the one shared queue and the chief took it: it trained on alone,
  two of its gradients to an update, for as long as one ran. Now no update comes without
  worker 1's gradient, and the chief's step ends at --step_timeout_secs (the watchdog,
  30 s after it, is the backstop), naming worker 1; the ps task ends with the chief's 138."""
  step_timeout_secs = 5
  commands = helpers.job_commands(1, 2, QUICK_FLAGS + [
      '--train_dir=%s' % tmp_path, '--sync_replicas', '--max_steps=100000',
      '--summary_steps=0', '--step_timeout_secs=%d' % step_timeout_secs] + STEADY_FLAGS)
  ps_host = re.search(r'--ps_hosts=(\S+)', ' '.join(commands['ps0'])).group(1)
  worker_1_host = re.search(r'--worker_hosts=\S+,(\S+)', ' '.join(commands['ps0'])).group(1)
  job = {name: tasks(argv) for name, argv in commands.items()}
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(3), 'step 3')
  worker_1_waiting_for_its_token(job, ps_host)
  at_pause = len(job['worker0'].lines)
  if moment == 'holding_a_token':  # the update comes, its token taken while it is paused
    job['worker1'].send(signal.SIGSTOP)
    job['worker0'].send(signal.SIGCONT)
    job['worker0'].wait_for(WORKER_LOSS_LINE, 'the update worker 1 sent its gradient to',
                            start=at_pause)
    job['worker1'].kill()
  else:
    job['worker1'].kill()
    job['worker0'].send(signal.SIGCONT)
  killed_at = time.time()
  assert job['worker0'].finish() == 138, job['worker0'].log()
  # The step's own timeout, and time to say so; not the watchdog's slack on top.
  assert time.time() - killed_at < step_timeout_secs + 15, job['worker0'].log()
  assert job['ps0'].finish(timeout=30) == 138, job['ps0'].log()
  # Each update held one gradient of each worker: the chief's loss lines name each
  # update once, and it took at most one more step after worker 1's last.
  shown = helpers.steps(WORKER_LOSS_LINE, job['worker0'].lines)
  assert shown == list(range(shown[0], shown[0] + len(shown))), job['worker0'].log()
  last_of_worker_1 = max(helpers.steps(WORKER_LOSS_LINE, job['worker1'].lines))
  assert shown[-1] <= last_of_worker_1 + 1, job['worker0'].log()
  errors = [line for line in job['worker0'].err_lines if line.startswith('error')]
  assert len(errors) == 1 and errors[0].startswith(
      'error: worker 0: no averaged update within --step_timeout_secs=5, waiting for worker 1 '
      '(%s) to send its gradient for update %d.' % (worker_1_host, shown[-1] + 1)), \
      job['worker0'].log()
  assert 'Traceback' not in job['worker0'].text
