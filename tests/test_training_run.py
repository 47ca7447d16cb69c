"""The trainer under faults: a second trainer, signals, moved directories, full disks.

Each test provokes one fault the way a user or the machine would (a real second
process, a real signal, a real file-size limit) and checks what the README
promises: a clear line, the right exit code, and no checkpoint lost.
"""
import contextlib
import glob
import os
import re
import resource
import shutil
import signal
import sys
import time

import pytest
import tensorflow as tf

import helpers
import multi_gpu_train
from training import checkpoints, directory, errors, run_record, summaries

TRAINER = os.path.join(helpers.ROOT, 'multi_gpu_train.py')


def _args(sample, train_dir, *extra):
  """The trainer's command line. Run by this Python without -u: it flushes its lines itself."""
  return [sys.executable, TRAINER, '--batch_size=8', '--summary_steps=0',
          '--log_frequency=1', '--train_dir=%s' % train_dir] + sample.flags + list(extra)


def _eval(sample, checkpoint_dir, eval_dir):
  return helpers.run(['cifar10_eval.py', '--run_once', '--checkpoint_dir=%s' % checkpoint_dir,
                      '--eval_dir=%s' % eval_dir] + sample.flags)


def _files(directory):
  return {os.path.basename(p): os.path.getsize(p)
          for p in glob.glob(os.path.join(directory, '*'))}


def _train(sample, train_dir, max_steps, save_every_n_steps=2):
  multi_gpu_train.train(helpers.trainer_settings(
      str(train_dir), sample.dir, num_gpus=1, batch_size=8, max_steps=max_steps,
      summary_steps=0, save_every_n_steps=save_every_n_steps, data_md5=sample.md5))


def _split(lines, marker):
  """The lines before marker and after it."""
  at = lines.index(marker)
  return lines[:at], lines[at + 1:]


# ---- A second trainer on one directory; SIGTERM; readers not blocked --------------

@pytest.mark.slow
def test_second_trainer_stops_naming_pid_eval_reads_and_sigterm_saves(sample, tmp_path, tasks):
  train_dir = tmp_path / 'train'
  first = tasks(_args(sample, train_dir, '--max_steps=100000', '--save_every_n_steps=3'))
  first.wait_for(lambda line: (m := helpers.LOSS_LINE.match(line)) and int(m.group(1)) >= 5,
                 'the loss line of step 5')
  # Held while the others run: the lock stays its own, and it takes no steps meanwhile
  # (at lr 0.1 on batches of 8, hundreds of steps may diverge and stop it on a NaN).
  first.send(signal.SIGSTOP)

  second = helpers.run(_args(sample, train_dir, '--max_steps=100000'))
  assert second.code == 1, second.log()
  assert ('error: %s is in use by another trainer (PID %d)' % (train_dir, first.pid)
          in second.err.splitlines()[-1]), second.log()
  assert not re.search('Starting|Resuming|Saved', second.out), second.log()

  # The evaluation program only reads: it is not blocked by the lock.
  evaluated = _eval(sample, train_dir, tmp_path / 'eval')
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


# ---- An interrupt is never lost ------------------------------------------------

SIGNALLED = '-- the test sent its signal here --'  # helpers.send_and_mark's line


def test_ctrl_c_while_building_the_graph_stops_before_the_session(sample, tmp_path, tasks):
  # The data check's line comes just before the graph is built (start()), and reaches
  # a pipe at once only if the trainer flushes it: Python, unless PYTHONUNBUFFERED is
  # set, would hold it back until the session opens. A few towers make the build a
  # few seconds long.
  # The signal goes once the new train_dir is made: start-up's checks and the data's
  # (where a signal stops the run at once, StopSignals.raising) are over by then.
  train_dir = tmp_path / 'train'
  trainer = tasks(_args(sample, train_dir, '--max_steps=100000', '--num_gpus=4'),
                  env=helpers.user_env(PYTHONUNBUFFERED=None))
  trainer.wait_for(lambda line: line.startswith('CIFAR-10 copy with md5 %s' % sample.md5),
                   'the data check\'s line')
  helpers.wait_until(train_dir.exists, 'the train_dir made after the checks', task=trainer)
  helpers.send_and_mark(trainer, signal.SIGINT, SIGNALLED)
  assert trainer.finish() == 130, trainer.log()
  before, after = _split(trainer.out_lines, SIGNALLED)
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
  trainer = tasks(_args(sample, tmp_path, '--max_steps=100000'))
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
  trainer = tasks(_args(sample, tmp_path, '--max_steps=100000'))
  trainer.wait_for(helpers.LOSS_LINE, 'the first step')  # the building test has step 0
  helpers.send_and_mark(trainer, sig, SIGNALLED)
  assert trainer.finish() == code, trainer.log()
  assert 'Traceback' not in trainer.err and 'KeyboardInterrupt' not in trainer.err
  before, after = _split(trainer.out_lines, SIGNALLED)
  stopped = re.match(r'^Stopped by %s at step (\d+)' % name, after[-1])
  assert stopped, trainer.log()
  step = int(stopped.group(1))
  # At once: the step under way when the signal came, if any, and no other.
  assert len(helpers.matches(helpers.LOSS_LINE, after)) <= 1, trainer.log()
  assert helpers.steps(helpers.LOSS_LINE, before + after)[-1] == step
  assert 'Saved checkpoint %s/model.ckpt-%d' % (tmp_path, step) in after
  assert helpers.global_step(tmp_path) == step


# ---- A directory that can be moved or copied --------------------------------------

def test_state_file_names_checkpoints_relative_to_its_directory(sample, tmp_path):
  _train(sample, tmp_path, max_steps=4)
  assert (tmp_path / 'checkpoint').read_text().splitlines() == [
      'model_checkpoint_path: "model.ckpt-4"',
      'all_model_checkpoint_paths: "model.ckpt-2"',
      'all_model_checkpoint_paths: "model.ckpt-4"']


def _absolute_state_file(train_dir):
  """The state file as older versions (and TensorFlow's default) wrote it."""
  (train_dir / 'checkpoint').write_text(
      'model_checkpoint_path: "%s/model.ckpt-4"\n'
      'all_model_checkpoint_paths: "%s/model.ckpt-2"\n'
      'all_model_checkpoint_paths: "%s/model.ckpt-4"\n' % ((train_dir,) * 3))


def test_moved_directory_with_absolute_state_file_resumes_saying_so(sample, tmp_path,
                                                                      capsys):
  _train(sample, tmp_path / 'old', max_steps=4)
  _absolute_state_file(tmp_path / 'old')
  os.rename(tmp_path / 'old', tmp_path / 'new')
  _train(sample, tmp_path / 'new', max_steps=6)
  out = capsys.readouterr().out
  assert ('names %s/model.ckpt-4; using %s/model.ckpt-4 in this directory'
          % (tmp_path / 'old', tmp_path / 'new')) in out
  assert 'Resuming from %s/model.ckpt-4 at step 4' % (tmp_path / 'new') in out
  assert helpers.global_step(tmp_path / 'new') == 6


def test_copied_directory_resumes_from_its_own_files_original_untouched(sample, tmp_path,
                                                                       monkeypatch):
  _train(sample, tmp_path / 'original', max_steps=4)
  monkeypatch.setattr(multi_gpu_train, 'KEEP_CHECKPOINTS', 1)  # rotation deletes at once
  _absolute_state_file(tmp_path / 'original')
  shutil.copytree(tmp_path / 'original', tmp_path / 'copy')
  before = _files(tmp_path / 'original')
  (tmp_path / 'copy' / 'model.ckpt-2.index').unlink()  # the copy's own, told apart
  _train(sample, tmp_path / 'copy', max_steps=6)
  assert _files(tmp_path / 'original') == before
  assert helpers.global_step(tmp_path / 'copy') == 6


def test_fresh_backup_directory_can_be_trained_from(sample, tmp_path, capsys):
  _train(sample, tmp_path, max_steps=4)
  multi_gpu_train.train(helpers.trainer_settings(
      str(tmp_path), sample.dir, num_gpus=1, batch_size=8, max_steps=1, summary_steps=0,
      data_md5=sample.md5, fresh=True))
  backup = re.search(r'to (\S+/replaced-\S+):', capsys.readouterr().out).group(1)
  _train(sample, backup, max_steps=6)
  assert 'Resuming from %s/model.ckpt-4 at step 4' % backup in capsys.readouterr().out
  assert helpers.global_step(backup) == 6


# ---- Checkpoint bookkeeping across restarts -------------------------------------

def test_rotation_continues_across_restarts(sample, tmp_path, monkeypatch):
  monkeypatch.setattr(multi_gpu_train, 'KEEP_CHECKPOINTS', 2)
  for max_steps in (3, 6, 9):  # three runs, a checkpoint every step
    _train(sample, tmp_path, max_steps, save_every_n_steps=1)
  assert sorted(glob.glob(str(tmp_path / '*.index'))) == [
      str(tmp_path / 'model.ckpt-8.index'), str(tmp_path / 'model.ckpt-9.index')]


@pytest.mark.slow
def test_checkpoint_write_over_file_size_limit_one_line_nothing_lost(sample, tmp_path):
  _train(sample, tmp_path, max_steps=2)
  before = _files(tmp_path)
  state = (tmp_path / 'checkpoint').read_bytes()

  def limit_file_size():  # the checkpoint (8.5 MB) cannot be written; the lock can
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
  done = helpers.run(_args(sample, tmp_path, '--max_steps=4'), preexec_fn=limit_file_size)
  assert done.code == 1, done.log()
  assert done.errors == [  # not oneDNN's lines
      'error: cannot write checkpoint %s/model.ckpt-4: File too large. Free '
      'space or raise the file-size limit (ulimit -f) for %s, or point '
      '--train_dir at a writable disk; the previous checkpoint, step 2, and '
      'the state file are untouched.' % (tmp_path, tmp_path)], done.log()
  assert 'Traceback' not in done.err
  after = {name: size for name, size in _files(tmp_path).items()
           if not name.startswith('run-')}  # the second run's record is new, rightly
  assert after == {name: size for name, size in before.items() if not name.startswith('run-')}
  assert not glob.glob(str(tmp_path / '*tempstate*')) and 'model.ckpt-4.index' not in after
  assert (tmp_path / 'checkpoint').read_bytes() == state


# ---- One clear line instead of a traceback --------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('content, says', [
    (b'', 'names no checkpoint (it is empty'),
    (b'  \n\t\n', 'names no checkpoint (it is empty'),
    (b'\x89PNG\r\n\x1a\n\x00\xff\xfe', 'cannot be read as a checkpoint state file'),
], ids=['empty', 'whitespace', 'binary'])
def test_bad_state_file_one_line_for_trainer_and_eval(sample, tmp_path, content, says):
  (tmp_path / 'checkpoint').write_bytes(content)
  done = helpers.run(_args(sample, tmp_path, '--max_steps=2'))
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert done.err.strip().splitlines()[-1].startswith('error: %s/checkpoint ' % tmp_path)
  assert says in done.err and 'Starting' not in done.out, done.log()
  evaluated = _eval(sample, tmp_path, tmp_path / 'eval')
  assert evaluated.code == 1 and 'Traceback' not in evaluated.err, evaluated.log()
  assert says in evaluated.err, evaluated.log()
  assert (tmp_path / 'checkpoint').read_bytes() == content


def test_train_dir_that_is_a_file_one_line(sample, tmp_path):
  (tmp_path / 'file').write_text('mine')
  done = helpers.run(_args(sample, tmp_path / 'file', '--max_steps=2'))
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert ('error: --train_dir %s is a file, not a directory' % (tmp_path / 'file')
          in done.err.splitlines()[-1]), done.log()
  assert (tmp_path / 'file').read_text() == 'mine'


def test_data_dir_that_cannot_be_created_one_line(tmp_path):
  (tmp_path / 'file').write_text('mine')
  data_dir = tmp_path / 'file' / 'data'
  done = helpers.run(['multi_gpu_train.py', '--data_dir=%s' % data_dir,
                      '--train_dir=%s' % (tmp_path / 'train'), '--max_steps=2'])
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert ('error: cannot create --data_dir %s: Not a directory' % data_dir
          in done.err.splitlines()[-1]), done.log()
  assert not os.path.exists(tmp_path / 'train')


def test_another_models_checkpoint_one_line_naming_the_variable(sample, tmp_path):
  with tf.Graph().as_default():
    tf.compat.v1.get_variable('conv1/weights', [3, 3, 1, 8])  # another model's shapes
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(step.assign(5))
      tf.compat.v1.train.Saver().save(sess, str(tmp_path / 'model.ckpt'), global_step=5)
  done = helpers.run(_args(sample, tmp_path, '--max_steps=8'))
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  line = done.err.strip().splitlines()[-1]
  assert line.startswith('error: cannot restore %s/model.ckpt-5 into this model: '
                         % tmp_path), done.log()
  assert 'conv1/biases' in line or 'conv1/weights' in line, line
  assert line.endswith('Use another --train_dir, or --fresh to start over.')


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


# ---- Rotation touches this directory's own checkpoints only ----------------------

@contextlib.contextmanager
def _session():
  """A session of a two-variable graph, and its make_saver() Saver, in that graph."""
  with tf.Graph().as_default():
    tf.compat.v1.get_variable('weights', initializer=[1.0, 2.0])
    tf.compat.v1.train.get_or_create_global_step()
    saver = checkpoints.make_saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      yield sess, saver


def _checkpoint_files(directory, step):
  return {'model.ckpt-%d.index' % step, 'model.ckpt-%d.meta' % step,
          'model.ckpt-%d.data-00000-of-00001' % step}


def test_save_checkpoint_glob_characters_in_dir_keeps_siblings_files(tmp_path):
  runs = tmp_path / 'runs'
  for sibling in ('g1', 'g2'):
    (runs / sibling).mkdir(parents=True)
    for step in (1, 2, 3):
      for name in _checkpoint_files(runs / sibling, step):
        (runs / sibling / name).write_text(sibling)
  before = {sibling: _files(runs / sibling) for sibling in ('g1', 'g2')}
  train_dir = runs / 'g[12]'
  train_dir.mkdir()
  with _session() as (sess, saver):
    for step in range(1, 6):
      checkpoints.save_checkpoint(sess, saver, str(train_dir), step, keep=2)
  assert {sibling: _files(runs / sibling) for sibling in ('g1', 'g2')} == before
  assert set(os.listdir(train_dir)) == _checkpoint_files(train_dir, 4) | _checkpoint_files(
      train_dir, 5) | {'checkpoint'}
  assert (train_dir / 'checkpoint').read_text().splitlines() == [
      'model_checkpoint_path: "model.ckpt-5"',
      'all_model_checkpoint_paths: "model.ckpt-4"',
      'all_model_checkpoint_paths: "model.ckpt-5"']


def test_check_train_dir_glob_characters_refused_naming_them(tmp_path):
  with pytest.raises(errors.TrainingError,
                     match=r'g\[12\] has \[ in its path: .* could never resume'):
    directory.check_train_dir(str(tmp_path / 'g[12]'))


def test_save_checkpoint_state_file_naming_paths_elsewhere_never_deletes_them(tmp_path):
  victim, elsewhere, train_dir = tmp_path / 'victim', tmp_path / 'elsewhere', tmp_path / 'train'
  for place in (victim, elsewhere, train_dir):
    place.mkdir()
  for place in (victim, elsewhere):
    for name in _checkpoint_files(place, 1):
      (place / name).write_text('keep me')
  (train_dir / 'checkpoint').write_text(
      'model_checkpoint_path: "%s/model.ckpt-1"\n'
      'all_model_checkpoint_paths: "../victim/model.ckpt-1"\n'
      'all_model_checkpoint_paths: "%s/model.ckpt-1"\n' % (elsewhere, elsewhere))
  with _session() as (sess, saver):
    for step in range(2, 6):
      checkpoints.save_checkpoint(sess, saver, str(train_dir), step, keep=2)
  for place in (victim, elsewhere):
    assert set(os.listdir(place)) == _checkpoint_files(place, 1)
  assert sorted(glob.glob(str(train_dir / '*.index'))) == [
      str(train_dir / 'model.ckpt-4.index'), str(train_dir / 'model.ckpt-5.index')]


# ---- What killed runs leave behind ---------------------------------------------------

def test_checkpoint_to_resume_removes_own_leftovers_only_saying_so(tmp_path):
  train_dir, outside = tmp_path / 'train', tmp_path / 'outside'
  train_dir.mkdir()
  outside.mkdir()
  with _session() as (sess, saver):
    checkpoints.save_checkpoint(sess, saver, str(train_dir), 3, keep=5)
  leftovers = ['model.ckpt-2.data-00000-of-00001.tempstate123',
               'model.ckpt-2.index.tempstate456', 'model.ckpt-4_temp',
               'checkpoint.tmp99', 'model.ckpt-17.data-00000-of-00001', 'model.ckpt-17.meta']
  for name in leftovers:
    (train_dir / name).write_text('left')
  os.remove(train_dir / 'model.ckpt-4_temp')
  (train_dir / 'model.ckpt-4_temp').mkdir()  # as a save makes it
  (train_dir / 'model.ckpt-4_temp' / 'part-00000-of-00001.index').write_text('left')
  (outside / 'model.ckpt-9.data-00000-of-00001').write_text('not ours')
  os.symlink(outside / 'model.ckpt-9.data-00000-of-00001',
             train_dir / 'model.ckpt-9.data-00000-of-00001')  # removed: the link, not its target
  mine = ['model.ckpt-2.txt', 'notes.tmp', 'checkpoint.old']  # not names a save leaves
  for name in mine:
    (train_dir / name).write_text('mine')
  path, step, notes = checkpoints.checkpoint_to_resume(str(train_dir))
  assert (path, step) == (str(train_dir / 'model.ckpt-3'), 0)
  assert notes == ['Removed what interrupted runs left in %s: %s.' % (train_dir, ', '.join(
      sorted(leftovers + ['model.ckpt-9.data-00000-of-00001'])))]
  assert set(os.listdir(train_dir)) == _checkpoint_files(train_dir, 3) | set(mine) | {
      'checkpoint'}
  assert (outside / 'model.ckpt-9.data-00000-of-00001').read_text() == 'not ours'
  assert checkpoints.checkpoint_to_resume(str(train_dir))[2] == []  # nothing left


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


# ---- A write that fails: one line ---------------------------------------------------

def _limit_file_size(limit):
  def preexec():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  return preexec


def test_write_run_record_over_file_size_limit_one_line_nothing_left(tmp_path):
  script = ('import signal, sys\nfrom training import errors, run_record\n'
            'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
            'try:\n'
            '  run_record.write_run_record(sys.argv[1], {"start_step": 3, "x": "x" * 999})\n'
            'except errors.TrainingError as e:\n'
            '  sys.exit("error: %s" % e)\n')
  done = helpers.run([sys.executable, '-c', script, str(tmp_path)],
                     preexec_fn=_limit_file_size(100))  # TensorFlow's start-up writes less
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  line = done.err.strip().splitlines()[-1]
  assert re.match(r'error: cannot write the run record %s/run-\d{8}-\d{6}-step3\.json: File '
                  r'too large\. Point --train_dir at a directory you can write to'
                  % re.escape(str(tmp_path)), line), line
  assert os.listdir(tmp_path) == []


# ---- Summaries cut short: said once, training goes on --------------------------------

SUMMARIES_UNDER_LIMIT = '''
import signal, sys
import tensorflow as tf
from training import summaries
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as StopSignals does
writer = summaries.SummaryWriter(sys.argv[1])
for step in range(200):
  writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
      tag='loss', simple_value=float(step))]), step)
writer.close()
print('went on to the end')
'''


def test_summary_writer_over_file_size_limit_says_once_and_goes_on(tmp_path):
  done = helpers.run([sys.executable, '-c', SUMMARIES_UNDER_LIMIT, str(tmp_path)],
                     preexec_fn=_limit_file_size(2000))
  assert done.code == 0 and done.out == 'went on to the end\n', done.log()
  warnings = [line for line in done.err.splitlines() if 'cannot write' in line]
  [path] = helpers.event_files(tmp_path)
  assert len(warnings) == 1 and 'Traceback' not in done.err, done.log()
  steps = []
  with pytest.raises(tf.errors.DataLossError):  # the last record is cut short
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step] if event.summary.value else []
  assert steps == list(range(len(steps))) and 10 < len(steps) < 200
  assert warnings == ['warning: cannot write %s: File too large. The run goes on, but '
                      'TensorBoard will show no summaries from step %d on; free space or '
                      'raise the file-size limit (ulimit -f) to keep them.'
                      % (path, len(steps))]


def test_summary_writer_events_read_by_tensorboard(tmp_path):
  with tf.Graph().as_default() as graph:
    tf.constant(1.0, name='one')
  writer = summaries.SummaryWriter(str(tmp_path), graph)
  for step in (0, 5, 7):
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag='total_loss', simple_value=step / 10)]).SerializeToString(), step)
  writer.close()
  from tensorboard.backend.event_processing import event_accumulator
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [(e.step, round(e.value, 6)) for e in events.Scalars('total_loss')] == [
      (0, 0.0), (5, 0.5), (7, 0.7)]
  assert 'one' in [node.name for node in events.Graph().node]


def test_summary_writers_made_in_the_same_second_keep_both_runs_events(tmp_path, monkeypatch):
  monkeypatch.setattr(summaries.time, 'time', lambda: 1795575295.25)  # the same instant
  for step in (7, 9):  # a run, then its resumed run, as TensorBoard's reader sees them
    writer = summaries.SummaryWriter(str(tmp_path))
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag='total_loss', simple_value=step / 10)]), step)
    writer.close()
  names = sorted(os.listdir(tmp_path))
  assert len(names) == 2 and names[0].endswith('.250000') and names[1].endswith('.250001')
  from tensorboard.backend.event_processing import event_accumulator
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [e.step for e in events.Scalars('total_loss')] == [7, 9]


def test_summary_writer_writes_the_median_of_the_speeds_noted_since_the_last(tmp_path):
  writer = summaries.SummaryWriter(str(tmp_path))
  loss = lambda value: tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
      tag='loss', simple_value=value)])
  writer.write_summary(loss(1.0), 0)  # no step timed yet: no rate
  for rate in (100.0, 300.0, 200.0):
    writer.note_speed(rate)
  writer.write_summary(loss(0.5), 3)
  writer.note_speed(50.0)
  writer.write_summary(loss(0.4), 4)
  writer.close()
  assert helpers.scalars(tmp_path, '2_training/examples_per_sec') == {3: 200.0, 4: 50.0}


def test_state_file_relative_path_into_another_directory_is_said_not_followed_silently(
    tmp_path):
  train_dir = tmp_path / 'run2'
  train_dir.mkdir()
  notes = []
  found = checkpoints.in_this_dir(str(train_dir), '../run1/model.ckpt-5', notes)
  assert found == str(tmp_path / 'run1' / 'model.ckpt-5')
  assert notes == ['%s names %s, outside this directory, and this directory has no file of '
                   'that name: reading that one.' % (train_dir / 'checkpoint', found)]
  (train_dir / 'model.ckpt-5.index').write_text('')  # its own file of that name wins
  notes = []
  assert checkpoints.in_this_dir(str(train_dir), '../run1/model.ckpt-5', notes) == str(
      train_dir / 'model.ckpt-5')
  assert len(notes) == 1 and 'using %s' % (train_dir / 'model.ckpt-5') in notes[0]


@pytest.mark.parametrize('text', ['[1, 2]', '{"constants": [1], "flags": "x"}',
                                  '{"constants": {"cifar10/model.py": 3}}'])
def test_earlier_run_record_json_but_not_a_record_shows_no_change_and_no_traceback(
    tmp_path, text):
  (tmp_path / 'run-20261125-000000-step0.json').write_text(text)
  record = {'constants': {'cifar10/model.py': {'BATCH': 1}}, 'flags': {'max_steps': 2}}
  assert run_record.changes_since(str(tmp_path), record) is None


@pytest.mark.parametrize('kind', helpers.HOSTILE_FILES + ['nested_200000_deep'])
def test_changes_since_hostile_run_record_not_compared_in_one_line_without_waiting(tmp_path,
                                                                                  kind):
  name = 'run-20261125-000000-step0.json'
  if kind == 'nested_200000_deep':
    (tmp_path / name).write_text('[' * 200000 + ']' * 200000)
  else:
    helpers.make_hostile(tmp_path / name, kind)
  record = {'constants': {'cifar10/model.py': {'BATCH': 1}}, 'flags': {'max_steps': 2}}
  said = helpers.returns_within(10, run_record.changes_since, str(tmp_path), record,
                                unblock=helpers.unblock_fifo(tmp_path / name))
  why = {'fifo': 'not a regular file but a FIFO', 'dev_zero': 'not a regular file but a '
         'character device', 'sparse_3gb': '%d bytes, more than the %d expected' % (
             3 << 30, run_record.RECORD_MAX_BYTES),
         'nested_200000_deep': 'nested more than 100 levels deep'}[kind]
  assert said == 'not compared with %s: %s. Remove it if it is not a run record.' % (
      tmp_path / name, why)


@pytest.mark.parametrize('kind', helpers.HOSTILE_FILES)
def test_read_state_file_hostile_file_refused_in_one_line_without_waiting(tmp_path, kind):
  helpers.make_hostile(tmp_path / 'checkpoint', kind)
  with pytest.raises(errors.TrainingError) as e:
    helpers.returns_within(10, checkpoints.read_state_file, str(tmp_path),
                           unblock=helpers.unblock_fifo(tmp_path / 'checkpoint'))
  assert str(e.value).startswith('%s cannot be read as a checkpoint state file (%s' % (
      tmp_path / 'checkpoint', 'not a regular file' if kind != 'sparse_3gb' else '%d bytes'
      % (3 << 30))), str(e.value)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('old, new, said', [
    (float('nan'), float('nan'), None),
    ([1.0, float('nan')], [1.0, float('nan')], None),
    (float('nan'), 0.1, 'X nan -> 0.1 (m.py)'),
    ({'cifar10': {'batch_size': 128}}, {'cifar10': {'batch_size': 128}}, None),
    ({'cifar10': {'batch_size': 128}}, {'cifar10': {'batch_size': 64}},
     "X {'cifar10': {'batch_size': 128}} -> {'cifar10': {'batch_size': 64}} (m.py)"),
], ids=['nan_same', 'nan_in_list_same', 'nan_edited', 'dict_same', 'dict_edited'])
def test_changes_since_nan_equal_to_itself_and_dict_edits_reported(tmp_path, old, new, said):
  run_record.write_run_record(str(tmp_path), {'constants': {'m.py': {'X': old}}})
  changed = run_record.changes_since(str(tmp_path), {'constants': {'m.py': {'X': new}}})
  assert changed == (said and 'changed since %s: %s' % (os.listdir(tmp_path)[0], said))


def test_constants_of_holds_a_dict_constant():
  assert run_record.constants_of(multi_gpu_train)['DATASET_DEFAULTS'] == (
      multi_gpu_train.DATASET_DEFAULTS)
