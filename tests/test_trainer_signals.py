"""The trainer and other processes: a second trainer on its --train_dir and the lock
that stops it, Ctrl-C and SIGTERM at every stage of a run, a second signal inside
TensorFlow.

Each test provokes its fault the way a user or the machine would (a real second
process, a real signal) and checks what the README promises: a clear line, the right
exit code, and no checkpoint lost.
"""
import os
import re
import signal
import sys
import time

import pytest

import helpers
from training import directory, errors

# ---- A signal as a program ends ----------------------------------------------------

ENDING_PROGRAM = """
import os, signal, sys
sys.path.insert(0, %r)
from training import errors, signals


class SignalAtTeardown:
  # SIGTERM as Python tears its modules down, after it has put back the default action
  # of the handlers it installed: as a job stopped whole reaches a task that has ended.
  def __del__(self, kill=os.kill, pid=os.getpid()):
    kill(pid, signal.SIGTERM)  # delivered before kill returns: to this process itself


at_teardown = SignalAtTeardown()
with errors.one_line_errors():
  stop = signals.StopSignals()
  print('stop requested:', stop.requested, flush=True)  # the step loop's last look
  if sys.argv[1:] == ['late']:
    os.kill(os.getpid(), signal.SIGTERM)  # after that look: as the run ends
"""


@pytest.mark.parametrize('late, code', [(False, 0), (True, 143)], ids=['at_teardown', 'late'])
def test_program_signalled_as_it_ends_exits_its_code_not_killed(tmp_path, late, code):
  """A task signalled as it ended died of the signal (-15): Python puts back the default
  action of its handlers as it exits. A signal after the work is written changes
  nothing; one heard after the step loop's last look is the exit code, said."""
  script = tmp_path / 'ending.py'
  script.write_text(ENDING_PROGRAM % helpers.ROOT)
  # Fresh: a forked run ends in os._exit, without the teardown this is about.
  done = helpers.run([sys.executable, str(script)] + (['late'] if late else []), fresh=True)
  assert done.code == code and 'Traceback' not in done.err, done.log()
  assert done.out.splitlines() == ['stop requested: False'] + (
      ['Stopped by SIGTERM as the run ended; its work was done and written.'] if late
      else []), done.log()


# ---- A second trainer on one directory; SIGTERM; readers not blocked --------------

@pytest.mark.slow
def test_second_trainer_stops_naming_pid_eval_reads_and_sigterm_saves(sample, tmp_path, tasks):
  train_dir = tmp_path / 'train'
  first = tasks(helpers.trainer_argv(sample, train_dir, '--max_steps=100000',
                                     '--save_every_n_steps=3'))
  first.wait_for(lambda line: (m := helpers.LOSS_LINE.match(line)) and int(m.group(1)) >= 5,
                 'the loss line of step 5')
  # Held while the others run: the lock stays its own, and it takes no steps meanwhile
  # (at lr 0.1 on batches of 8, hundreds of steps may diverge and stop it on a NaN).
  first.send(signal.SIGSTOP)

  second = helpers.run(helpers.trainer_argv(sample, train_dir, '--max_steps=100000'))
  assert second.code == 1, second.log()
  assert ('error: %s is in use by another trainer (PID %d)' % (train_dir, first.pid)
          in second.err.splitlines()[-1]), second.log()
  assert not re.search('Starting|Resuming|Saved', second.out), second.log()

  # The evaluation program only reads: it is not blocked by the lock.
  evaluated = helpers.run_eval_once(sample, train_dir, tmp_path / 'eval')
  assert evaluated.code == 0 and 'precision @ 1 = ' in evaluated.out, evaluated.log()

  first.send(signal.SIGTERM)
  first.send(signal.SIGCONT)
  assert first.finish() == 143, first.log()
  [stopped] = helpers.matches(helpers.STOPPED_LINE, first.out_lines)
  step = int(stopped.group(2))
  assert stopped.group(1) == 'SIGTERM' and step >= 5, first.log()
  assert 'Saved checkpoint %s/model.ckpt-%d' % (train_dir, step) in first.out_lines
  assert helpers.global_step(train_dir) == step and 'Traceback' not in first.err


def test_lock_of_a_killed_trainer_is_released(tmp_path, tasks):
  holder = tasks([sys.executable, '-c', 'import sys, time; from training import directory; '
                  'lock = directory.lock_train_dir(sys.argv[1]); print("locked", '
                  'flush=True); time.sleep(600)', str(tmp_path)])
  holder.wait_for(lambda line: line == 'locked', 'the lock')
  with pytest.raises(errors.TrainingError, match='PID %d' % holder.pid):
    directory.lock_train_dir(str(tmp_path))
  holder.send(signal.SIGKILL)
  assert holder.finish() == -signal.SIGKILL
  lock = directory.lock_train_dir(str(tmp_path))  # the kernel released it
  lock.close()


# ---- The lock file is this trainer's own -----------------------------------------

def test_lock_file_symlink_refused_decoy_untouched(tmp_path):
  decoy = tmp_path / 'decoy'
  decoy.write_text('precious\n')
  (tmp_path / 'train').mkdir()
  os.symlink(decoy, tmp_path / 'train' / '.lock')
  with pytest.raises(errors.TrainingError,
                     match=r'%s is not a regular file .* Remove it' % re.escape(
                         str(tmp_path / 'train' / '.lock'))):
    directory.lock_train_dir(str(tmp_path / 'train'))
  assert decoy.read_text() == 'precious\n'


@pytest.mark.parametrize('make', [os.mkdir, os.mkfifo], ids=['directory', 'fifo'])
def test_lock_file_not_regular_refused(tmp_path, make):
  make(tmp_path / '.lock')
  with pytest.raises(errors.TrainingError, match='is not a regular file'):
    directory.lock_train_dir(str(tmp_path))


# ---- An interrupt is never lost ------------------------------------------------

SIGNALLED = '-- the test sent its signal here --'  # helpers.send_and_mark's line


def test_split_at_mark_puts_a_line_the_mark_landed_in_back_together_before_it():
  loss = '2026-11-28 13:49:30.001: step 3, loss = 4.66 (9.0 examples/sec; 0.9 sec/batch)'
  # Between lines; inside print()'s two writes (text, newline); inside print('a', 'b').
  assert helpers.split_at_mark(['a', loss, SIGNALLED, 'b'], SIGNALLED) == (['a', loss], ['b'])
  assert helpers.split_at_mark(['a', loss + SIGNALLED, '', 'b'], SIGNALLED) == (
      ['a', loss], ['b'])
  assert helpers.split_at_mark(['a', 'step' + SIGNALLED, ' 3', 'b'], SIGNALLED) == (
      ['a', 'step 3'], ['b'])
  assert helpers.split_at_mark([loss[:10] + SIGNALLED], SIGNALLED) == ([loss[:10]], [])


def test_ctrl_c_while_building_the_graph_stops_before_the_session(sample, tmp_path, tasks):
  # The data check's line comes just before the graph is built (start()), and reaches
  # a pipe at once only if the trainer flushes it: Python, unless PYTHONUNBUFFERED is
  # set, would hold it back until the session opens. A few towers make the build a
  # few seconds long.
  # The signal goes once the new train_dir is made: start-up's checks and the data's
  # (where a signal stops the run at once, StopSignals.raising) are over by then.
  train_dir = tmp_path / 'train'
  trainer = tasks(helpers.trainer_argv(sample, train_dir, '--max_steps=100000', '--num_gpus=4'),
                  env=helpers.user_env(PYTHONUNBUFFERED=None))
  trainer.wait_for(lambda line: line.startswith('CIFAR-10 copy with md5 %s' % sample.md5),
                   'the data check\'s line')
  helpers.wait_until(train_dir.exists, 'the train_dir made after the checks', task=trainer)
  helpers.send_and_mark(trainer, signal.SIGINT, SIGNALLED)
  assert trainer.finish() == 130, trainer.log()
  before, after = helpers.split_at_mark(trainer.out_lines, SIGNALLED)
  # The signal came before the graph was done: nothing that follows the build had
  # been written yet (the run record is the first).
  assert not [line for line in before if re.match('Run record|TensorFlow|Starting|Saved',
                                                  line)], trainer.log()
  assert after[-1] == ('Stopped by Ctrl-C at step 0 before any step; rerun the same '
                       'command to resume.'), trainer.log()
  assert not [line for line in after if line.startswith('Saved')], trainer.log()
  assert 'Traceback' not in trainer.err and 'KeyboardInterrupt' not in trainer.err


def _tensorflow_loaded(pid):
  with open('/proc/%d/maps' % pid) as f:
    return 'libtensorflow_framework' in f.read()


@pytest.mark.slow
@pytest.mark.parametrize('sig, code, name', [(signal.SIGINT, 130, 'Ctrl-C'),
                                             (signal.SIGTERM, 143, 'SIGTERM')])
def test_signal_while_tensorflow_loads_is_held_run_stops_at_start_in_one_line(
    sample, tmp_path, tasks, sig, code, name):
  # A whole job stopped at once (a time limit) often finds its tasks still loading
  # TensorFlow: the signal waits for the step loop, which stops before any step.
  trainer = tasks(helpers.trainer_argv(sample, tmp_path, '--max_steps=100000'), fresh=True)
  helpers.wait_until(lambda: helpers.signal_caught(trainer.pid, signal.SIGTERM) and
                     not _tensorflow_loaded(trainer.pid), 'the signals held while '
                     'TensorFlow loads', task=trainer)
  trainer.send(sig)
  assert trainer.finish() == code, trainer.log()
  assert trainer.out_lines[-1] == ('Stopped by %s at step 0 before any step; rerun the '
                                   'same command to resume.' % name), trainer.log()
  assert 'Traceback' not in trainer.err and 'KeyboardInterrupt' not in trainer.err


@pytest.mark.parametrize('sig, code, name', [
    (signal.SIGINT, 130, 'Ctrl-C'),
    (signal.SIGTERM, 143, 'SIGTERM'),
], ids=['ctrl-c', 'sigterm'])
def test_signal_in_first_steps_stops_after_the_step_under_way_without_traceback(
    sample, tmp_path, tasks, sig, code, name):
  trainer = tasks(helpers.trainer_argv(sample, tmp_path, '--max_steps=100000'))
  trainer.wait_for(helpers.LOSS_LINE, 'the first step')  # the building test has step 0
  helpers.send_and_mark(trainer, sig, SIGNALLED)
  assert trainer.finish() == code, trainer.log()
  assert 'Traceback' not in trainer.err and 'KeyboardInterrupt' not in trainer.err
  before, after = helpers.split_at_mark(trainer.out_lines, SIGNALLED)
  stopped = re.match(r'^Stopped by %s at step (\d+)' % name, after[-1])
  assert stopped, trainer.log()
  step = int(stopped.group(1))
  # At once: the step under way when the signal came, if any, and no other.
  assert len(helpers.matches(helpers.LOSS_LINE, after)) <= 1, trainer.log()
  assert helpers.steps(helpers.LOSS_LINE, before + after)[-1] == step
  assert 'Saved checkpoint %s/model.ckpt-%d' % (tmp_path, step) in after
  assert helpers.global_step(tmp_path) == step


# ---- A second signal stops at once, even inside TensorFlow ---------------------------

BLOCKED_IN_TENSORFLOW = '''
import sys
import time
import tensorflow as tf
from training import signals
tf.compat.v1.disable_eager_execution()
stop = signals.StopSignals(sys.argv[1])
inside = tf.print('inside sess.run', output_stream=sys.stderr)  # printed by the C++ kernel
with tf.control_dependencies([inside]):
  dequeue = tf.queue.FIFOQueue(1, tf.float32).dequeue()  # nothing comes: waits in C++
config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=30000)
with tf.compat.v1.Session(config=config) as sess:
  try:
    sess.run(dequeue)
  except tf.errors.DeadlineExceededError:
    print('timed out; stop requested: %s' % stop.requested, flush=True)
'''


def _deliver(blocked, sig):
  """Sends sig once the last one sent is delivered: two pending at once are one."""
  helpers.wait_until(lambda: not any(helpers.signal_pending(blocked.pid, s)
                                     for s in (signal.SIGINT, signal.SIGTERM)),
                     'delivery of the signal before', blocked)
  blocked.send(sig)


@pytest.mark.slow
@pytest.mark.parametrize('first, said', [(signal.SIGINT, 'a second Ctrl-C'),
                                         (signal.SIGTERM, 'Ctrl-C after SIGTERM')],
                         ids=['Ctrl-C', 'SIGTERM'])
def test_ctrl_c_after_a_signal_while_inside_tensorflow_exits_at_once_saying_so(
    tmp_path, tasks, first, said):
  blocked = tasks([sys.executable, '-c', BLOCKED_IN_TENSORFLOW, str(tmp_path)])
  blocked.wait_for(lambda line: line == 'inside sess.run', 'the main thread in sess.run')
  blocked.send(first)
  # At once: long before sess.run's 30 s timeout would have ended the wait (a Python
  # handler runs only then), with the line that says so.
  _deliver(blocked, signal.SIGINT)
  assert blocked.finish() == 130, blocked.log()
  assert blocked.err_lines[-1] == ('Stopped by %s without saving; the last checkpoint in %s '
                                   'is untouched.' % (said, tmp_path))
  assert 'timed out' not in blocked.out, blocked.log()


@pytest.mark.slow
def test_second_sigterm_while_inside_tensorflow_changes_nothing_says_so_once(tmp_path, tasks):
  # An orchestrator's repeated SIGTERM (srun --kill-on-bad-exit) must not cut a save.
  blocked = tasks([sys.executable, '-c', BLOCKED_IN_TENSORFLOW, str(tmp_path)])
  blocked.wait_for(lambda line: line == 'inside sess.run', 'the main thread in sess.run')
  blocked.send(signal.SIGTERM)
  for _ in range(2):
    _deliver(blocked, signal.SIGTERM)
  blocked.wait_for(lambda line: line.startswith('SIGTERM again'), 'the line saying so')
  _deliver(blocked, signal.SIGTERM)  # after the line: the third is not said again
  time.sleep(1)
  assert blocked.process.poll() is None, blocked.log()
  assert [line for line in blocked.lines if line.startswith('SIGTERM again')] == [
      'SIGTERM again: still finishing the step and its save (a Ctrl-C ends at once, '
      'losing them)'], blocked.log()
  blocked.send(signal.SIGINT)  # a person: at once
  assert blocked.finish() == 130, blocked.log()
