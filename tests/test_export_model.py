"""export_model.py: a checkpoint as a SavedModel, which plain TensorFlow serves as the
evaluation scores it; what it refuses to overwrite, a signal mid-write, the wrong network.

The exported models (tests/conftest.py's `exported` and `mnist_exported`), trained and
exported once per test process, serve every test that needs one: those tests carry
@pytest.mark.xdist_group('export') so that one test process trains them once.
"""
import contextlib
import json
import os
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_input
import export_model
import helpers
import mnist
import mnist_input
from training import evaluation

# Run as `python -I -c` in an empty directory: no project code can be imported there.
PLAIN_TENSORFLOW = '''
import importlib.util, json, sys
import numpy as np
import tensorflow as tf
for name in ('cifar10', 'cifar10_input', 'export_model', 'training'):
  assert importlib.util.find_spec(name) is None, name + ' is importable'
model_dir, images_path, out_path = sys.argv[1:]
serve = tf.saved_model.load(model_dir).signatures['serving_default']
outputs = serve(images=tf.constant(np.load(images_path)))
np.savez(out_path, **{name: value.numpy() for name, value in outputs.items()})
spec = lambda t: [t.dtype.name, t.shape.as_list()]
print(json.dumps({'inputs': {k: spec(v) for k, v in serve.structured_input_signature[1].items()},
                  'outputs': {k: spec(v) for k, v in serve.structured_outputs.items()}}))
'''


def _evaluation_probabilities(checkpoint, data_dir, model, data_input,
                              use_moving_averages=True):
  """float32 [records, 10]: the softmax of the logits evaluation.evaluate scores, built as
  it builds them (its reader, its restore), for every test record in file order."""
  with tf.Graph().as_default():
    dataset, _ = data_input.eval_dataset('test', data_dir, 16)
    images, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    probabilities = tf.nn.softmax(model.inference(images))
    if use_moving_averages:
      ema = tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY)
      saver = tf.compat.v1.train.Saver(ema.variables_to_restore())
    else:
      saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
    batches = []
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, checkpoint)
      while True:
        try:
          batches.append(sess.run(probabilities))
        except tf.errors.OutOfRangeError:
          return np.concatenate(batches)


def _tree_with_times(root):
  return {path: os.path.getmtime(os.path.join(root, path)) for path in helpers.tree(root)}


@pytest.mark.xdist_group('export')
def test_export_writes_saved_model_and_says_what_step_and_how_to_use_it(exported):
  out, export_dir = exported.run.out.splitlines(), exported.export_dir
  assert out == [
      'Writing %s from %s.' % (export_dir, exported.checkpoint),
      'Wrote %s: a SavedModel of %s, moving averages (global step 20).'
      % (export_dir, exported.checkpoint),
      'Signature serving_default: images uint8 [N, 32, 32, 3] -> classes int64 [N], '
      'probabilities float32 [N, 10]; class names in %s/assets.extra/class_names.txt.'
      % export_dir,
      'Classify image files with it: python classify.py --model_dir=%s cat.png' % export_dir,
  ], exported.run.log()
  assert not exported.run.errors and 'Traceback' not in exported.run.err
  assert helpers.tree(export_dir) == ['assets.extra/class_names.txt',
                                      'assets.extra/export_model.json', 'saved_model.pb',
                                      'variables/variables.data-00000-of-00001',
                                      'variables/variables.index']
  with open(os.path.join(export_dir, 'assets.extra', 'class_names.txt')) as f:
    assert tuple(f.read().splitlines()) == cifar10.CLASS_NAMES
  assert sorted(os.listdir(exported.root)) == ['model', 'train']  # no staging left behind


@pytest.mark.xdist_group('export')
def test_saved_model_in_plain_tensorflow_scores_the_evaluations_precision(exported, sample,
                                                                         tmp_path):
  images, labels = helpers.cifar10_test_records(sample.dir)
  np.save(tmp_path / 'images.npy', images)
  done = helpers.run([sys.executable, '-I', '-c', PLAIN_TENSORFLOW, exported.export_dir,
                      'images.npy', 'outputs.npz'],
                     cwd=str(tmp_path), env=helpers.user_env(PYTHONPATH=None))
  assert done.code == 0, done.log()
  assert json.loads(done.out.splitlines()[-1]) == {
      'inputs': {'images': ['uint8', [None, 32, 32, 3]]},
      'outputs': {'classes': ['int64', [None]], 'probabilities': ['float32', [None, 10]]}}
  outputs = np.load(tmp_path / 'outputs.npz')
  classes, probabilities = outputs['classes'], outputs['probabilities']
  assert classes.shape == (40,) and probabilities.shape == (40, 10)

  # What cifar10_eval.py prints as precision @ 1: the same records, the same checkpoint.
  precision, _, count, step = evaluation.evaluate(
      exported.checkpoint, sample.dir, 'test', 16, True, cifar10, cifar10_input)
  assert (count, step) == (40, 20)
  assert np.sum(classes == labels) / len(labels) == precision
  # Not only the argmax: the evaluation's preprocessing and its moving averages, image by image.
  expected = _evaluation_probabilities(exported.checkpoint, sample.dir, cifar10, cifar10_input)
  np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(classes, np.argmax(expected, axis=1))
  raw = _evaluation_probabilities(exported.checkpoint, sample.dir, cifar10, cifar10_input,
                                  use_moving_averages=False)
  assert np.abs(probabilities - raw).max() > 1e-3  # the shadow weights, not the raw ones


@pytest.mark.xdist_group('export')
def test_export_existing_dir_refused_unless_overwrite_replaces_its_own_export(exported,
                                                                             tmp_path, capsys):
  before = _tree_with_times(exported.export_dir)
  with pytest.raises(export_model.ExportError) as e:
    export_model.export(exported.train_dir, exported.export_dir, 'cifar10')
  assert str(e.value) == (
      '--export_dir %s holds a SavedModel already; nothing was written. Pass --overwrite to '
      'replace it, or name another --export_dir.' % exported.export_dir)
  assert _tree_with_times(exported.export_dir) == before

  copy = tmp_path / 'copy'
  shutil.copytree(exported.export_dir, copy)
  with open(copy / export_model.RECORD_FILE) as f:
    record = json.load(f)
  capsys.readouterr()
  export_model.export(exported.train_dir, str(copy), 'cifar10', overwrite=True)
  assert capsys.readouterr().out == (
      'Writing %s from %s.\n--overwrite: replacing the export in %s.\n'
      % (copy, exported.checkpoint, copy))
  assert helpers.tree(copy) == helpers.tree(exported.export_dir)
  with open(copy / export_model.RECORD_FILE) as f:
    assert json.load(f) == record
  assert sorted(os.listdir(tmp_path)) == ['copy']  # nothing else left behind


def _files_and_bytes(root):
  """{path relative to root: its bytes} of every file, and the sorted directories."""
  found = {}
  for path in helpers.tree(root):
    with open(os.path.join(root, path), 'rb') as f:
      found[path] = f.read()
  dirs = sorted(os.path.relpath(d, root) for d, _, _ in os.walk(str(root)))
  return found, dirs


@pytest.mark.xdist_group('export')
def test_overwrite_user_dir_holding_saved_model_pb_refused_in_one_line_and_kept(exported,
                                                                               tmp_path):
  proj = tmp_path / 'proj'  # the issue's: a project with a stray saved_model.pb in it
  (proj / 'src').mkdir(parents=True)
  (proj / 'src' / 'main.py').write_text('print(1)\n')
  (proj / 'results.csv').write_text('data\n')
  (proj / 'saved_model.pb').write_text('x\n')
  before = _files_and_bytes(proj)
  done = helpers.run(['export_model.py', '--train_dir=' + exported.train_dir,
                      '--export_dir=%s' % proj, '--overwrite'])
  assert done.code == 1 and done.errors == [
      'error: --export_dir %s is not an export of export_model.py (it has no '
      'assets.extra/export_model.json; it holds results.csv, saved_model.pb, src/); nothing '
      'was written. --overwrite replaces only what this program wrote: delete %s yourself '
      'if it is an older export you no longer need, or name another --export_dir.'
      % (proj, proj)], done.log()
  assert 'Traceback' not in done.err and done.out == '', done.log()
  assert _files_and_bytes(proj) == before
  assert os.listdir(tmp_path) == ['proj']  # no staging left beside it


@pytest.mark.xdist_group('export')
def test_overwrite_export_with_notes_and_version_dir_refused_naming_them_and_kept(exported,
                                                                                 tmp_path):
  model = tmp_path / 'model'  # a real export, and what a user put in it since
  shutil.copytree(exported.export_dir, model)
  (model / 'NOTES.txt').write_text('trained on the sample, 20 steps\n')
  shutil.copytree(exported.export_dir, model / '2')
  before = _files_and_bytes(model)
  done = helpers.run(['export_model.py', '--train_dir=' + exported.train_dir,
                      '--export_dir=%s' % model, '--overwrite'])
  assert done.code == 1 and done.errors == [
      'error: --export_dir %s holds 2/, NOTES.txt, which export_model.py did not write; '
      'nothing was written. --overwrite replaces only what this program wrote: move them out '
      'of %s, or name another --export_dir.' % (model, model)], done.log()
  assert 'Traceback' not in done.err and done.out == '', done.log()
  assert _files_and_bytes(model) == before
  assert os.listdir(tmp_path) == ['model']


@pytest.mark.xdist_group('export')
def test_export_record_lists_every_file_and_directory_written(exported):
  with open(os.path.join(exported.export_dir, export_model.RECORD_FILE)) as f:
    record = json.load(f)
  files, dirs = _files_and_bytes(exported.export_dir)
  assert record['written_by'] == 'export_model.py'
  assert record['files'] == sorted(files) and record['directories'] == dirs[1:]  # not '.'
  assert (record['checkpoint'], record['global_step']) == (exported.checkpoint, 20)


@pytest.mark.parametrize('record, why', [
    (None, 'it has no assets.extra/export_model.json;'),
    (b'{"written_by": "export_model.py"}', 'is not a record of export_model.py;'),
    (b'not json', 'is not a record of export_model.py;'),
    (b'{' + b' ' * 70000 + b'}', 'cannot be read: 70002 bytes, more than the 65536 expected;'),
    ('fifo', 'cannot be read: not a regular file but a FIFO;')],
    ids=['missing', 'no_listing', 'not_json', 'too_big', 'fifo'])
def test_check_export_dir_without_valid_record_refuses_overwrite(tmp_path, record, why):
  model = tmp_path / 'model'
  (model / 'assets.extra').mkdir(parents=True)
  (model / 'saved_model.pb').write_bytes(b'x')
  path = model / export_model.RECORD_FILE
  if record == 'fifo':  # a read would wait for a writer forever
    os.mkfifo(path)
  elif record is not None:
    path.write_bytes(record)
  with pytest.raises(export_model.ExportError) as e:
    export_model.check_export_dir(str(model), overwrite=True)
  assert str(e.value).startswith('--export_dir %s is not an export of export_model.py ('
                                 % model), str(e.value)
  assert why in str(e.value) and 'it holds assets.extra/, saved_model.pb); nothing was ' \
      'written.' in str(e.value) and '\n' not in str(e.value), str(e.value)
  assert os.path.exists(model / 'saved_model.pb')


def _stagings(parent):
  """The export's staging directories beside its --export_dir, with a model being written."""
  return [name for name in os.listdir(parent) if name.startswith('.')
          and os.path.isdir(os.path.join(parent, name, 'model'))]


SIGNALLED_EXPORTS = 24  # at offsets spread over an unsignalled export's time, and past it


def _export_signalled(tasks, train_dir, export_dir, offset):
  """An export_model.py run sent SIGTERM `offset` s after its handlers are in (None: not
  at all); returns (its Task, its exit code, seconds from its handlers to its exit)."""
  task = tasks(['export_model.py', '--train_dir=' + train_dir, '--export_dir=%s' % export_dir])
  helpers.wait_until(lambda: helpers.signal_caught(task.pid, signal.SIGTERM),
                     'the exporter\'s handlers', task=task)
  start = time.time()
  if offset is not None:
    time.sleep(offset)
    with contextlib.suppress(ProcessLookupError):  # it ended just now: nothing to stop
      task.send(signal.SIGTERM)
  code = task.finish()
  return task, code, time.time() - start


@pytest.mark.slow
@pytest.mark.xdist_group('export')
def test_export_sigterm_at_any_moment_no_traceback_wrote_only_what_is_there(exported,
                                                                            tmp_path, tasks):
  # Once in 15, SIGTERM inside TensorFlow's graph building gave two tracebacks and exit
  # 1 (`Exiting device scope without proper scope nesting`); one at its exit, a traceback
  # from an atexit function and exit 0.
  _, code, duration = _export_signalled(tasks, exported.train_dir, tmp_path / 'whole', None)
  assert code == 0
  for i in range(SIGNALLED_EXPORTS):
    export_dir = tmp_path / str(i) / 'model'
    task, code, _ = _export_signalled(tasks, exported.train_dir, export_dir,
                                      duration * 1.2 * i / SIGNALLED_EXPORTS)
    written = os.path.exists(export_dir / 'saved_model.pb')
    stopped = [line for line in task.err_lines if line.startswith('Stopped')]
    assert 'Traceback' not in task.err and code in (0, 143), task.log()
    assert (code == 143) == bool(stopped), task.log()
    assert written == (code == 0 or 'written whole' in stopped[0]), task.log()
    assert any(line.startswith('Wrote ') for line in task.out_lines) <= written, task.log()
    assert not export_dir.parent.exists() or not _stagings(export_dir.parent), task.log()


@pytest.mark.xdist_group('export')
def test_export_sigterm_mid_write_removes_staging_and_says_so_exit_143(exported, tmp_path,
                                                                      tasks):
  """SIGTERM while the SavedModel is being written: the staging directory goes.

  The write lasts well under a second: the exporter is paused (SIGSTOP) once its staging
  directory holds a model, and signalled only if that is still there while it stands.
  """
  for attempt in range(5):
    export_dir = tmp_path / str(attempt) / 'model'
    export_dir.parent.mkdir()  # the user's: it stays, empty
    task = tasks(['export_model.py', '--train_dir=' + exported.train_dir,
                  '--export_dir=%s' % export_dir])
    helpers.wait_until(lambda: _stagings(export_dir.parent), 'staging directory', task)
    task.send(signal.SIGSTOP)
    helpers.wait_until(lambda: helpers.process_state(task.pid) == 'T', 'paused exporter', task)
    if _stagings(export_dir.parent) and not os.path.exists(export_dir):
      break
    task.send(signal.SIGCONT)
    assert task.finish() == 0, task.log()
  else:
    pytest.fail('the export ended before it could be paused, 5 times')
  task.send(signal.SIGTERM)
  task.send(signal.SIGCONT)
  assert task.finish() == 143, task.log()
  assert [l for l in task.err_lines if l.startswith('Stopped')] == [
      'Stopped by SIGTERM; the partial export is removed: %s is as it was.' % export_dir
  ], task.log()
  assert 'Traceback' not in task.err, task.log()
  assert os.listdir(export_dir.parent) == [], task.log()  # no hidden .model.export-*


def test_export_empty_export_dir_refused_in_one_line(tmp_path):
  # Not taken as the default: the user named a directory and got /tmp/cifar10_model.
  (tmp_path / 'train').mkdir()
  done = helpers.run(['export_model.py', '--train_dir=%s' % (tmp_path / 'train'),
                      '--export_dir='])
  assert done.code == 1 and done.errors == [
      'error: --export_dir is empty; name the directory to write the SavedModel as, or leave '
      'the flag out for the default %s.' % export_model.EXPORT_DIR], done.log()
  assert 'Traceback' not in done.err and done.out == '', done.log()


@pytest.mark.xdist_group('export')
def test_export_checkpoint_rotated_away_before_its_restore_exports_the_newest(exported,
                                                                             tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
  train_dir = tmp_path / 'train'
  shutil.copytree(exported.train_dir, train_dir)
  newest, found = export_model.newest_checkpoint, []

  def newest_then_rotated(*args):
    """Finds model.ckpt-20; before it is restored, the trainer saves 21 and deletes 20."""
    found.append(newest(*args))
    if len(found) == 1:
      for name in train_dir.glob('model.ckpt-20.*'):
        name.rename(str(name).replace('ckpt-20', 'ckpt-21'))
      (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-21"\n')
    return found[-1]
  monkeypatch.setattr(export_model, 'newest_checkpoint', newest_then_rotated)
  path, step = export_model.export(str(train_dir), str(tmp_path / 'model'), 'cifar10')
  assert [os.path.basename(f[0]) for f in found] == ['model.ckpt-20', 'model.ckpt-21']
  assert (path, step) == (str(train_dir / 'model.ckpt-21'), 20)  # it holds step 20's
  assert ('%s/model.ckpt-20 went away while being read (a trainer rotates its checkpoints); '
          'trying the newest.' % train_dir) in capsys.readouterr().out.splitlines()
  assert os.path.exists(tmp_path / 'model' / 'saved_model.pb')


@pytest.mark.parametrize('damage, cause', [
    ('flip', 'Checksum does not match: stored '), ('cut', 'Read less bytes than requested')])
def test_export_damaged_checkpoint_says_tensorflows_cause_and_what_to_do(exported, tmp_path,
                                                                        damage, cause):
  # Before: `cannot restore ...: Graph execution error: Detected at node 'save/RestoreV2'
  # defined at (most recent call last): File "export_model.py", line 537, ...`, cut.
  train_dir = tmp_path / 'train'
  shutil.copytree(exported.train_dir, train_dir)
  [data] = train_dir.glob('model.ckpt-20.data-*')
  damaged = bytearray(data.read_bytes())
  if damage == 'flip':
    damaged[::4096] = bytes(b ^ 0xff for b in damaged[::4096])
  data.write_bytes(bytes(damaged if damage == 'flip' else damaged[:len(damaged) // 2]))
  with pytest.raises(export_model.ExportError) as raised:
    export_model.export(str(train_dir), str(tmp_path / 'model'), 'cifar10')
  said = str(raised.value)
  assert said.startswith('cannot restore %s/model.ckpt-20: ' % train_dir) and cause in said
  assert said.endswith('Its files are damaged or cut short: name an older '
                       'model.ckpt-<step> of its directory in the directory\'s "checkpoint" '
                       'file, or train again.'), said
  assert 'Detected at node' not in said and 'File "' not in said and '\n' not in said
  assert not (tmp_path / 'model').exists()


def test_export_without_checkpoint_exits_1_with_one_line_and_writes_nothing(tmp_path):
  (tmp_path / 'train').mkdir()
  export_dir = tmp_path / 'exports' / 'model'  # its parent is missing too
  done = helpers.run(['export_model.py', '--train_dir=%s' % (tmp_path / 'train'),
                      '--export_dir=%s' % export_dir])
  assert done.code == 1 and done.errors == [
      'error: no checkpoint in %s: nothing to export. Train first (python multi_gpu_train.py '
      '--train_dir=%s), or point --train_dir at the trainer\'s --train_dir.'
      % (tmp_path / 'train', tmp_path / 'train')], done.log()
  assert 'Traceback' not in done.err and done.out == '', done.log()
  assert sorted(os.listdir(tmp_path)) == ['train'] and os.listdir(tmp_path / 'train') == []


def test_export_train_dir_given_without_its_flag_refused_in_one_line(tmp_path):
  # Not taken for --train_dir: the default's checkpoint would be exported instead.
  done = helpers.run(['export_model.py', str(tmp_path), '--export_dir=%s' % (tmp_path / 'x')])
  assert done.code == 1 and len(done.errors) == 1, done.log()
  assert done.errors[0].startswith("error: unexpected argument '%s': export_model.py takes "
                                   "flags only" % tmp_path), done.log()
  assert 'Traceback' not in done.err and os.listdir(tmp_path) == [], done.log()


@pytest.mark.xdist_group('export')
def test_export_checkpoint_of_other_data_set_refused_naming_the_right_flag(mnist_exported,
                                                                          tmp_path):
  with pytest.raises(export_model.ExportError) as e:
    export_model.export(mnist_exported.train_dir, str(tmp_path / 'model'), 'cifar10')
  assert str(e.value) == (
      '%s does not hold the cifar10 network (it has no conv1/biases/ExponentialMovingAverage). '
      'It holds the mnist network: pass --dataset=mnist.' % mnist_exported.checkpoint)
  assert os.listdir(tmp_path) == []


def test_export_closing_hint_mnist_names_a_digit_image(capsys):
  export_model.say_written('/tmp/mnist_model', '/tmp/mnist_train/model.ckpt-20', 20,
                           export_model.DATASETS['mnist'])
  assert capsys.readouterr().out.splitlines()[-1] == (
      'Classify image files with it: python classify.py --model_dir=/tmp/mnist_model '
      'seven.png')


def test_export_checkpoint_of_neither_network_refused_naming_the_trainers(tmp_path):
  with tf.Graph().as_default():  # a global step and a variable of neither network
    tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable('dense/kernel', [3, 2])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / 'train' / 'model.ckpt'),
                                             global_step=7)
  with pytest.raises(export_model.ExportError) as e:
    export_model.export(str(tmp_path / 'train'), str(tmp_path / 'model'), 'cifar10')
  assert str(e.value) == (
      '%s does not hold the cifar10 network (it has no conv1/biases/ExponentialMovingAverage). '
      'Point --train_dir at a directory the trainer (multi_gpu_train.py, dist_train.py) '
      'wrote.' % path)
  assert sorted(os.listdir(tmp_path)) == ['train']


@pytest.mark.xdist_group('export')
def test_mnist_export_takes_28x28_pixels_and_scores_the_evaluations_precision(mnist_exported,
                                                                             mnist_sample):
  assert tf.executing_eagerly()  # as in a user's Python
  serve = tf.saved_model.load(mnist_exported.export_dir).signatures['serving_default']
  spec = serve.structured_input_signature[1]['images']
  assert (spec.dtype, spec.shape.as_list()) == (tf.uint8, [None, 28, 28])
  images, labels = mnist_input.read_records(os.path.join(mnist_sample, mnist_input.TEST_FILE))
  outputs = serve(images=tf.constant(images.reshape(-1, 28, 28)))
  classes, probabilities = outputs['classes'].numpy(), outputs['probabilities'].numpy()
  assert classes.dtype == np.int64 and probabilities.shape == (500, 10)
  precision, _, count, _ = evaluation.evaluate(
      mnist_exported.checkpoint, mnist_sample, 'test', 100, True, mnist, mnist_input)
  assert count == 500 and np.sum(classes == labels) / len(labels) == precision
  expected = _evaluation_probabilities(mnist_exported.checkpoint, mnist_sample, mnist,
                                       mnist_input)
  np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)
  with open(os.path.join(mnist_exported.export_dir, 'assets.extra', 'class_names.txt')) as f:
    assert f.read() == '0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n'
