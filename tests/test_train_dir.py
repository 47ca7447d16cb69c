"""What the trainer finds in --train_dir and keeps there: a directory moved or copied,
checkpoints rotated across restarts and never another's, what killed runs leave, the
state file; one clear line, and nothing lost, for what it cannot use or write.

Each test provokes its fault the way a user or the machine would (a real file-size
limit, a damaged or hostile file) and checks what the README promises.
"""
import contextlib
import glob
import os
import re
import shutil

import pytest
import tensorflow as tf

import helpers
import multi_gpu_train
from training import checkpoints, directory, errors

def _files(directory):
  return {os.path.basename(p): os.path.getsize(p)
          for p in glob.glob(os.path.join(directory, '*'))}


def _train(sample, train_dir, max_steps, save_every_n_steps=2):
  multi_gpu_train.train(helpers.trainer_settings(
      str(train_dir), sample.dir, num_gpus=1, batch_size=8, max_steps=max_steps,
      summary_steps=0, save_every_n_steps=save_every_n_steps, data_md5=sample.md5))


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
  backup = re.search(r'to (\S+-replaced-\d{8}-\d{6}):', capsys.readouterr().out).group(1)
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
  limit = 1 << 20  # no checkpoint (8.5 MB) can be written; the lock can
  done = helpers.run(helpers.trainer_argv(sample, tmp_path, '--max_steps=4'), file_size_limit=limit)
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
  done = helpers.run(helpers.trainer_argv(sample, tmp_path, '--max_steps=2'))
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert done.err.strip().splitlines()[-1].startswith('error: %s/checkpoint ' % tmp_path)
  assert says in done.err and 'Starting' not in done.out, done.log()
  evaluated = helpers.run_eval_once(sample, tmp_path, tmp_path / 'eval')
  assert evaluated.code == 1 and 'Traceback' not in evaluated.err, evaluated.log()
  assert says in evaluated.err, evaluated.log()
  assert (tmp_path / 'checkpoint').read_bytes() == content


def test_train_dir_that_is_a_file_one_line(sample, tmp_path):
  (tmp_path / 'file').write_text('mine')
  done = helpers.run(helpers.trainer_argv(sample, tmp_path / 'file', '--max_steps=2'))
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


@pytest.mark.parametrize('flag', ['data_dir', 'train_dir'])
@pytest.mark.parametrize('link, said', [
    ('loop', 'it is a symbolic link in a loop (it leads back to itself)'),
    ('dangling', 'it is a symbolic link to {target}, which does not exist')])
def test_directory_symlink_loop_or_dangling_one_line_naming_it(tmp_path, flag, link, said):
  # Before: `cannot create --data_dir ...: File exists`, the OS's word for both.
  path, target = tmp_path / 'link', tmp_path / ('link' if link == 'loop' else 'gone')
  os.symlink(target, path)
  other = ['--train_dir=%s' % (tmp_path / 'train')] if flag == 'data_dir' else ['--synthetic']
  done = helpers.run(['multi_gpu_train.py', '--%s=%s' % (flag, path), '--max_steps=2'] + other)
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert done.err.splitlines()[-1].startswith('error: cannot create --%s %s: %s. ' % (
      flag, path, said.format(target=target))), done.log()


def test_another_models_checkpoint_one_line_naming_the_variable(sample, tmp_path):
  with tf.Graph().as_default():
    tf.compat.v1.get_variable('conv1/weights', [3, 3, 1, 8])  # another model's shapes
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(step.assign(5))
      tf.compat.v1.train.Saver().save(sess, str(tmp_path / 'model.ckpt'), global_step=5)
  done = helpers.run(helpers.trainer_argv(sample, tmp_path, '--max_steps=8'))
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  line = done.err.strip().splitlines()[-1]
  assert line.startswith('error: cannot restore %s/model.ckpt-5 into this model: '
                         % tmp_path), done.log()
  assert 'conv1/biases' in line or 'conv1/weights' in line, line
  assert line.endswith('Use another --train_dir, or --fresh to start over.')


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
