"""The trainer under faults: a second trainer, signals, moved directories, full disks.

Each test provokes one fault the way a user or the machine would (a real second
process, a real signal, a real file-size limit) and checks what the README
promises: a clear line, the right exit code, and no checkpoint lost.
"""
import glob
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import conftest
import multi_gpu_train
import training_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, 'multi_gpu_train.py')
TIMEOUT_SECS = 120
LOSS_LINE = re.compile(r'^\S+ \S+: step (\d+), loss = ')


@pytest.fixture(scope='module')
def sample(tmp_path_factory):
  return conftest.write_sample(tmp_path_factory.mktemp('data'), records_per_file=40)


def _args(sample, train_dir, *extra):
  return [sys.executable, TRAINER, '--batch_size=8', '--summary_steps=0',
          '--log_frequency=1', '--train_dir=%s' % train_dir] + sample.flags + list(extra)


def _run(args, **kwargs):
  done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_SECS,
                        cwd=ROOT, **kwargs)
  return done.returncode, done.stdout, done.stderr


def _start(args):
  return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT)


def _read_until(proc, pattern):
  """Reads proc's stdout up to the first line matching pattern; returns the lines read."""
  lines, deadline = [], time.time() + TIMEOUT_SECS
  while time.time() < deadline:
    line = proc.stdout.readline()
    if not line:
      raise AssertionError('exited (%s) before %r:\n%s' % (proc.wait(), pattern,
                                                           ''.join(lines)))
    lines.append(line)
    if re.search(pattern, line):
      return lines
  raise AssertionError('no %r within %d s' % (pattern, TIMEOUT_SECS))


def _files(directory):
  return {os.path.basename(p): os.path.getsize(p)
          for p in glob.glob(os.path.join(directory, '*'))}


def _step(train_dir):
  return int(tf.train.load_checkpoint(train_dir).get_tensor('global_step'))


def _train(sample, train_dir, max_steps, save_every_n_steps=2):
  multi_gpu_train.train(str(train_dir), sample.dir, num_gpus=1, batch_size=8,
                        max_steps=max_steps, summary_steps=0,
                        save_every_n_steps=save_every_n_steps, data_md5=sample.md5)


# ---- A second trainer on one directory; SIGTERM; readers not blocked --------------

def test_second_trainer_stops_naming_pid_eval_reads_and_sigterm_saves(sample, tmp_path):
  train_dir = tmp_path / 'train'
  first = _start(_args(sample, train_dir, '--max_steps=100000', '--save_every_n_steps=3'))
  try:
    _read_until(first, r'^Saved checkpoint .*model\.ckpt-3$')

    code, out, err = _run(_args(sample, train_dir, '--max_steps=100000'))
    assert code == 1, err
    assert ('error: %s is in use by another trainer (PID %d)' % (train_dir, first.pid)
            in err.splitlines()[-1])
    assert 'Starting' not in out and 'Resuming' not in out and 'Saved' not in out

    # The evaluation program only reads: it is not blocked by the lock.
    code, out, err = _run([sys.executable, os.path.join(ROOT, 'cifar10_eval.py'),
                           '--run_once', '--checkpoint_dir=%s' % train_dir,
                           '--eval_dir=%s' % (tmp_path / 'eval')] + sample.flags)
    assert code == 0 and 'precision @ 1 = ' in out, err

    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=TIMEOUT_SECS)
  finally:
    first.kill()
  assert first.returncode == 143, err
  stopped = re.search(r'^Stopped by SIGTERM at step (\d+); rerun the same command to '
                      r'resume\.$', out, re.M)
  assert stopped, out
  step = int(stopped.group(1))
  assert step > 3 and 'Saved checkpoint %s/model.ckpt-%d' % (train_dir, step) in out
  assert _step(str(train_dir)) == step and 'Traceback' not in err


def test_lock_of_a_killed_trainer_is_released(tmp_path):
  holder = _start([sys.executable, '-c', 'import sys, time, training_run; '
                   'lock = training_run.lock_train_dir(sys.argv[1]); print("locked", '
                   'flush=True); time.sleep(100)', str(tmp_path)])
  try:
    _read_until(holder, '^locked$')
    with pytest.raises(training_run.TrainingError, match='PID %d' % holder.pid):
      training_run.lock_train_dir(str(tmp_path))
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
  finally:
    holder.kill()
    holder.stdout.close()
    holder.stderr.close()
  lock = training_run.lock_train_dir(str(tmp_path))  # the kernel released it
  lock.close()


# ---- An interrupt is never lost ------------------------------------------------

@pytest.mark.parametrize('sig, after, code, name', [
    (signal.SIGINT, r'^TensorFlow \d', 130, 'Ctrl-C'),          # while building the graph
    (signal.SIGINT, r'^Starting from step 0', 130, 'Ctrl-C'),   # during the first step
    (signal.SIGTERM, r'^Starting from step 0', 143, 'SIGTERM'),
], ids=['ctrl-c-building', 'ctrl-c-first-step', 'sigterm-first-step'])
def test_signal_early_in_run_stops_it_without_traceback(sample, tmp_path, sig, after, code,
                                                        name):
  proc = _start(_args(sample, tmp_path, '--max_steps=100000'))
  try:
    lines = _read_until(proc, after)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT_SECS)
  finally:
    proc.kill()
  out = ''.join(lines) + out
  assert proc.returncode == code, err
  assert 'Traceback' not in err and 'KeyboardInterrupt' not in err
  stopped = re.search(r'^Stopped by %s at step (\d+)' % name, out, re.M)
  assert stopped, out
  step = int(stopped.group(1))
  assert step <= 3  # stopped at once, not after training on
  if step:
    assert _step(str(tmp_path)) == step


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
  assert _step(str(tmp_path / 'new')) == 6


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
  assert _step(str(tmp_path / 'copy')) == 6


def test_fresh_backup_directory_can_be_trained_from(sample, tmp_path, capsys):
  _train(sample, tmp_path, max_steps=4)
  multi_gpu_train.train(str(tmp_path), sample.dir, num_gpus=1, batch_size=8, max_steps=1,
                        summary_steps=0, data_md5=sample.md5, fresh=True)
  backup = re.search(r'to (\S+/replaced-\S+):', capsys.readouterr().out).group(1)
  _train(sample, backup, max_steps=6)
  assert 'Resuming from %s/model.ckpt-4 at step 4' % backup in capsys.readouterr().out
  assert _step(backup) == 6


# ---- Checkpoint bookkeeping across restarts -------------------------------------

def test_rotation_continues_across_restarts(sample, tmp_path, monkeypatch):
  monkeypatch.setattr(multi_gpu_train, 'KEEP_CHECKPOINTS', 2)
  for max_steps in (3, 6, 9):  # three runs, a checkpoint every step
    _train(sample, tmp_path, max_steps, save_every_n_steps=1)
  assert sorted(glob.glob(str(tmp_path / '*.index'))) == [
      str(tmp_path / 'model.ckpt-8.index'), str(tmp_path / 'model.ckpt-9.index')]


def test_checkpoint_write_over_file_size_limit_one_line_nothing_lost(sample, tmp_path):
  code, out, err = _run(_args(sample, tmp_path, '--max_steps=2'))
  assert code == 0, err
  before = _files(tmp_path)
  state = (tmp_path / 'checkpoint').read_bytes()

  def limit_file_size():  # the checkpoint (8.5 MB) cannot be written; the lock can
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
  code, out, err = _run(_args(sample, tmp_path, '--max_steps=4'),
                        preexec_fn=limit_file_size)
  assert code == 1, err
  error = [line for line in err.splitlines() if 'error' in line.lower()]
  assert error == ['error: cannot write checkpoint %s/model.ckpt-4: File too large. Free '
                   'space or raise the file-size limit (ulimit -f) for %s, or point '
                   '--train_dir at a writable disk; the previous checkpoint, step 2, and '
                   'the state file are untouched.' % (tmp_path, tmp_path)], err
  assert 'Traceback' not in err
  after = {name: size for name, size in _files(tmp_path).items()
           if not name.startswith('run-')}  # the second run's record is new, rightly
  assert after == {name: size for name, size in before.items() if not name.startswith('run-')}
  assert not glob.glob(str(tmp_path / '*tempstate*')) and 'model.ckpt-4.index' not in after
  assert (tmp_path / 'checkpoint').read_bytes() == state


# ---- One clear line instead of a traceback --------------------------------------

@pytest.mark.parametrize('content, says', [
    (b'', 'names no checkpoint (it is empty'),
    (b'  \n\t\n', 'names no checkpoint (it is empty'),
    (b'\x89PNG\r\n\x1a\n\x00\xff\xfe', 'cannot be read as a checkpoint state file'),
], ids=['empty', 'whitespace', 'binary'])
def test_bad_state_file_one_line_for_trainer_and_eval(sample, tmp_path, content, says):
  (tmp_path / 'checkpoint').write_bytes(content)
  code, out, err = _run(_args(sample, tmp_path, '--max_steps=2'))
  assert code == 1 and 'Traceback' not in err, err
  assert err.strip().splitlines()[-1].startswith('error: %s/checkpoint ' % tmp_path)
  assert says in err and 'Starting' not in out
  code, out, err = _run([sys.executable, os.path.join(ROOT, 'cifar10_eval.py'),
                         '--run_once', '--checkpoint_dir=%s' % tmp_path,
                         '--eval_dir=%s' % (tmp_path / 'eval')] + sample.flags)
  assert code == 1 and 'Traceback' not in err and says in err, err
  assert (tmp_path / 'checkpoint').read_bytes() == content


def test_train_dir_that_is_a_file_one_line(sample, tmp_path):
  (tmp_path / 'file').write_text('mine')
  code, out, err = _run(_args(sample, tmp_path / 'file', '--max_steps=2'))
  assert code == 1 and 'Traceback' not in err, err
  assert ('error: --train_dir %s is a file, not a directory' % (tmp_path / 'file')
          in err.splitlines()[-1])
  assert (tmp_path / 'file').read_text() == 'mine'


def test_data_dir_that_cannot_be_created_one_line(tmp_path):
  (tmp_path / 'file').write_text('mine')
  data_dir = tmp_path / 'file' / 'data'
  code, out, err = _run([sys.executable, TRAINER, '--data_dir=%s' % data_dir,
                         '--train_dir=%s' % (tmp_path / 'train'), '--max_steps=2'])
  assert code == 1 and 'Traceback' not in err, err
  assert ('error: cannot create --data_dir %s: Not a directory' % data_dir
          in err.splitlines()[-1])
  assert not os.path.exists(tmp_path / 'train')


def test_another_models_checkpoint_one_line_naming_the_variable(sample, tmp_path):
  with tf.Graph().as_default():
    tf.compat.v1.get_variable('conv1/weights', [3, 3, 1, 8])  # another model's shapes
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(step.assign(5))
      tf.compat.v1.train.Saver().save(sess, str(tmp_path / 'model.ckpt'), global_step=5)
  code, out, err = _run(_args(sample, tmp_path, '--max_steps=8'))
  assert code == 1 and 'Traceback' not in err, err
  line = err.strip().splitlines()[-1]
  assert line.startswith('error: cannot restore %s/model.ckpt-5 into this model: '
                         % tmp_path), line
  assert 'conv1/biases' in line or 'conv1/weights' in line, line
  assert line.endswith('Use another --train_dir, or --fresh to start over.')
