"""multi_gpu_train.py: the gradient average, tower equivalence, the step loop, resuming.

What a rerun says changed since the last run: tests/test_multi_gpu_train_rerun.py.
"""
import os
import re
import shutil
import signal
import socket
import sys
import threading
import warnings

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import helpers
import multi_gpu_train
from training import checkpoints, input_data
from training import settings as trainer_settings
from training import errors
from training.errors import TrainingError

TRAINER = os.path.join(helpers.ROOT, 'multi_gpu_train.py')


def _trainer(*args):
  """The trainer's command line. Run by this Python without -u: it flushes its lines itself."""
  return [sys.executable, TRAINER] + list(args)


def _settings(sample, train_dir, **changes):
  """Settings of a short run on the sample, one tower of 8 images, no summaries."""
  return helpers.trainer_settings(str(train_dir), sample.dir, **dict(dict(
      num_gpus=1, batch_size=8, summary_steps=0, data_md5=sample.md5), **changes))


def test_average_gradients_two_towers_is_mean():
  with tf.Graph().as_default():
    v0, v1 = tf.Variable([0.0, 0.0]), tf.Variable(0.0)
    tower_grads = [[(tf.constant([1.0, 2.0]), v0), (tf.constant(3.0), v1)],
                   [(tf.constant([3.0, 6.0]), v0), (tf.constant(-1.0), v1)]]
    averaged = multi_gpu_train.average_gradients(tower_grads)
    assert [var for _, var in averaged] == [v0, v1]
    with tf.compat.v1.Session() as sess:
      g0, g1 = sess.run([g for g, _ in averaged])
  np.testing.assert_array_equal(g0, [2.0, 4.0])
  assert g1 == 1.0


def test_average_gradients_missing_gradient_names_variable():
  with tf.Graph().as_default():
    var = tf.compat.v1.get_variable('local9/weights', [2])
    with pytest.raises(ValueError, match='no gradient for variable local9/weights'):
      multi_gpu_train.average_gradients([[(tf.ones([2]), var)], [(None, var)]])


def test_two_towers_step_matches_one_tower_on_joined_batch():
  rng = np.random.default_rng(0)
  images = rng.standard_normal((32, 24, 24, 3)).astype(np.float32)  # no distortions
  labels = rng.integers(0, 10, 32).astype(np.int32)
  start, one_tower = helpers.one_train_step(1, images, labels)
  _, two_towers = helpers.one_train_step(2, images, labels, start_values=start)
  assert set(two_towers) == set(one_tower)
  assert len(one_tower) == 21  # 10 weights and biases, their 10 moving averages, global_step
  for name in one_tower:
    np.testing.assert_allclose(two_towers[name], one_tower[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  # The step really moved every trainable variable (so the match is not vacuous).
  for var_name in ['conv1/weights', 'conv2/biases', 'local3/weights', 'softmax_linear/biases']:
    assert np.abs(one_tower[var_name] - start[var_name]).max() > 1e-6, var_name
  assert one_tower['global_step'] == 1


def test_train_loss_goes_nan_stops_with_step_and_writes_no_checkpoint(sample, tmp_path,
                                                                     monkeypatch):
  monkeypatch.setattr(cifar10, 'INITIAL_LEARNING_RATE', 1e12)
  # Which comes first depends on the random initial weights: the loss of a step, or
  # the variables that step's update left, checked before each save.
  with pytest.raises(TrainingError, match=r'(loss is nan at step \d+|a variable became '
                     r'NaN or infinite by step \d+).*INITIAL_LEARNING_RATE'):
    multi_gpu_train.train(helpers.trainer_settings(
        str(tmp_path), sample.dir, num_gpus=1, batch_size=8, max_steps=50, summary_steps=0,
        save_every_n_steps=1, data_md5=sample.md5))
  # Checkpoints written while the loss was finite stay; none holds a NaN.
  state = tf.train.get_checkpoint_state(str(tmp_path))
  for path in state.all_model_checkpoint_paths:
    for name, value in helpers.checkpoint(path).items():
      assert np.isfinite(value).all(), (path, name)


@pytest.mark.slow
def test_cli_two_towers_logs_saves_and_resumes(sample, tmp_path, capsys):
  train_dir = str(tmp_path / 'train')
  done = helpers.run(_trainer(
      '--num_gpus=2', '--batch_size=8', *sample.flags, '--train_dir=' + train_dir,
      '--log_frequency=10', '--save_every_n_steps=20', '--summary_steps=0', '--max_steps=30'))
  assert done.code == 0, done.log()
  assert '2 virtual CPU devices' in done.out and 'global batch 16 = 8 x 2 towers' in done.out
  assert '\nthreads: ' in done.out and '(--intra_op_threads=0: one per core)' in done.out
  # An epoch is the sample's 5 x 40 records, counted: 200 / 16 x 350 epochs.
  assert ('decay_steps 4375 = 200 examples (the records in data_batch_1.bin .. '
          'data_batch_5.bin) / 16 per update x 350 epochs') in done.out, done.log()
  assert '1068298 trainable parameters' in done.out
  assert helpers.steps(helpers.LOSS_LINE, done.out.splitlines()) == [1, 10, 20, 30]
  assert 'Saved checkpoint %s/model.ckpt-20' % train_dir in done.out
  assert helpers.global_step(train_dir) == 30

  # Resuming is the same code from a command line or not: the rest runs in this process.
  def train(**changes):
    multi_gpu_train.train(_settings(sample, train_dir, num_gpus=2, log_frequency=10,
                                    save_every_n_steps=20, **changes))
    return capsys.readouterr().out
  out = train(max_steps=40)
  assert 'Resuming from %s/model.ckpt-30 at step 30' % train_dir in out
  assert helpers.steps(helpers.LOSS_LINE, out.splitlines()) == [31, 40]
  assert helpers.global_step(train_dir) == 40

  out = train(max_steps=40)
  assert 'nothing to do' in out and helpers.steps(helpers.LOSS_LINE, out.splitlines()) == []

  out = train(max_steps=5, fresh=True)
  moved = re.search(r'--fresh: moved (\d+) files from \S+ to (\S+):', out)
  assert moved and 'Starting from step 0' in out, out
  assert helpers.steps(helpers.LOSS_LINE, out.splitlines()) == [1, 5]  # the last one too
  assert 'model.ckpt-40.index' in os.listdir(moved.group(2))  # set aside, not deleted


DAMAGES = {
    'truncate': 'data_batch_2.bin has 122919 bytes; expected a non-zero multiple of 3073',
    'empty': 'data_batch_2.bin has 0 bytes',
    'missing': 'data_batch_2.bin is missing',
    'label': 'data_batch_2.bin record 3 has label 10; CIFAR-10 labels are 0..9',
}


def _damaged_copy(sample, tmp_path, damage):
  """A copy of the sample with data_batch_2.bin damaged, and no archive to extract again."""
  data_dir = tmp_path / 'data'
  shutil.copytree(sample.dir, data_dir)
  os.remove(data_dir / 'cifar-10-binary.tar.gz')  # else the run would extract it again
  path = data_dir / 'cifar-10-batches-bin' / 'data_batch_2.bin'
  if damage == 'truncate':
    path.write_bytes(path.read_bytes()[:-1])
  elif damage == 'empty':
    path.write_bytes(b'')
  elif damage == 'label':
    data = bytearray(path.read_bytes())
    data[3 * 3073] = 10
    path.write_bytes(bytes(data))
  else:
    path.unlink()
  return helpers.Sample(str(data_dir), sample.md5)


@pytest.mark.parametrize('damage', sorted(DAMAGES))
def test_bad_data_file_stops_with_message_before_training(sample, tmp_path, damage, capsys):
  damaged = _damaged_copy(sample, tmp_path, damage)
  with pytest.raises(errors.DataError, match=re.escape(DAMAGES[damage])):
    multi_gpu_train.train(_settings(damaged, tmp_path / 't', max_steps=5))
  assert helpers.steps(helpers.LOSS_LINE, capsys.readouterr().out.splitlines()) == []
  assert not os.path.exists(tmp_path / 't')  # nothing created


def test_cli_bad_data_file_exits_with_one_line_before_training(sample, tmp_path):
  # The command line's side of the test above: any DataError is one line, exit 1.
  damaged = _damaged_copy(sample, tmp_path, 'truncate')
  done = helpers.run(_trainer(*damaged.flags, '--train_dir=%s' % (tmp_path / 't'),
                              '--max_steps=5'))
  last = done.err.splitlines()[-1]
  assert done.code == 1 and last.startswith('error: ') and DAMAGES['truncate'] in last, (
      done.log())
  assert 'Traceback' not in done.err
  assert helpers.steps(helpers.LOSS_LINE, done.out.splitlines()) == []
  assert not os.path.exists(tmp_path / 't')  # nothing created


def test_failed_download_leaves_no_directories(tmp_path):
  with socket.socket() as s:  # a free port on 127.0.0.1 that nothing listens on
    s.bind(('127.0.0.1', 0))
    url = 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' % s.getsockname()[1]
  with pytest.raises(errors.DataError) as raised:
    multi_gpu_train.train(helpers.trainer_settings(
        str(tmp_path / 'train'), str(tmp_path / 'data'), data_url=url, max_steps=5))
  assert str(raised.value).startswith('cannot download %s' % url)
  assert 'python cifar10_input.py --write_sample=' in str(raised.value)  # the offline way in
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['ctrl-c', 'sigterm'])
def test_cli_signal_during_download_stops_at_once_removing_the_partial_file(tmp_path, tasks,
                                                                           signum):
  data_dir, train_dir = tmp_path / 'data', tmp_path / 'train'
  sent = threading.Event()  # once a byte is sent, the first progress line is out

  def chunks():  # 10 MB announced, a byte every 0.5 s: a download that would take 58 days
    for chunk in helpers.drip(0.5, 200)():
      yield chunk
      sent.set()
  with helpers.serve_stream({'Content-Length': str(10 ** 7)}, chunks) as url:
    trainer = tasks(_trainer('--data_dir=%s' % data_dir, '--train_dir=%s' % train_dir,
                             '--data_url=%scifar-10-binary.tar.gz' % url, '--max_steps=5'))
    helpers.wait_until(sent.is_set, 'the first byte sent', trainer)
    assert len(os.listdir(data_dir)) == 1  # the partial file
    trainer.send(signum)
    assert trainer.finish(timeout=15) == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], (
        trainer.log())
  assert trainer.out_lines[-1] == (
      'Stopped by %s during the download of %scifar-10-binary.tar.gz; the partial file is '
      'removed; nothing else was written.' % ({signal.SIGINT: 'Ctrl-C',
                                                signal.SIGTERM: 'SIGTERM'}[signum], url)), (
                                                    trainer.log())
  assert trainer.out_lines[-2].startswith('>> Downloading cifar-10-binary.tar.gz 0.0% (0.0 of '
                                          '10.0 MB), 0 s'), trainer.log()
  assert 'Traceback' not in trainer.err and 'checkpoint' not in trainer.text, trainer.log()
  assert os.listdir(tmp_path) == []  # no partial file, and no directory made for it


@pytest.mark.parametrize('flag, message', [
    ('--num_gpu=2', "Unknown command line flag 'num_gpu'"),
    ('--num_gpus=0', '--num_gpus must be at least 1, got 0'),
])
def test_cli_bad_flag_exits_naming_it(tmp_path, flag, message):
  done = helpers.run(_trainer(flag, '--train_dir=%s' % tmp_path, '--data_dir=%s' % tmp_path))
  assert done.code != 0 and message in done.err, done.log()
  assert os.listdir(tmp_path) == []


def _train_briefly(train_dir, sample, max_steps):
  multi_gpu_train.train(_settings(sample, train_dir, max_steps=max_steps,
                                  save_every_n_steps=3))


@pytest.fixture(scope='module')
def trained(sample, tmp_path_factory):
  """A train dir of 6 steps, checkpoints at 3 and 6, that tests copy and never change."""
  train_dir = tmp_path_factory.mktemp('trained') / 'train'
  _train_briefly(train_dir, sample, max_steps=6)
  return train_dir


def _copy(trained, tmp_path):
  shutil.copytree(trained, tmp_path / 'train')
  return tmp_path / 'train'


@pytest.mark.xdist_group('multi_gpu_train_trained')
def test_checkpoint_garbled_state_file_stops_and_keeps_checkpoints(sample, trained, tmp_path):
  train_dir = _copy(trained, tmp_path)
  (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-6\n{{{')
  before = sorted(os.listdir(train_dir))
  with pytest.raises(TrainingError,
                     match='checkpoint cannot be read as a checkpoint state file'):
    _train_briefly(train_dir, sample, max_steps=9)
  assert sorted(os.listdir(train_dir)) == before


@pytest.mark.xdist_group('multi_gpu_train_trained')
def test_checkpoint_truncated_data_file_stops_naming_it(sample, trained, tmp_path):
  train_dir = _copy(trained, tmp_path)
  data_file = train_dir / 'model.ckpt-6.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:100000])
  with pytest.raises(TrainingError,
                     match='checkpoint .*model.ckpt-6 .*cannot be read'):
    _train_briefly(train_dir, sample, max_steps=9)
  assert data_file.stat().st_size == 100000


@pytest.mark.xdist_group('multi_gpu_train_trained')
def test_checkpoint_files_without_state_file_resume_from_newest_whole(sample, trained, tmp_path,
                                                                    capsys):
  train_dir = _copy(trained, tmp_path)  # model.ckpt-3 and -6
  os.remove(train_dir / 'checkpoint')  # as a kill between the files and the state file
  data_file = train_dir / 'model.ckpt-6.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:1000])  # and the newest cut short
  capsys.readouterr()
  _train_briefly(train_dir, sample, max_steps=8)
  out = capsys.readouterr().out
  assert 'resuming from the newest checkpoint that reads whole, model.ckpt-3' in out
  assert 'Skipped, unreadable: model.ckpt-6' in out
  assert 'Resuming from %s/model.ckpt-3 at step 3' % train_dir in out
  assert helpers.global_step(train_dir) == 8


@pytest.mark.xdist_group('multi_gpu_train_trained')
def test_checkpoint_files_none_whole_without_state_file_stop(sample, trained, tmp_path):
  train_dir = _copy(trained, tmp_path)
  os.remove(train_dir / 'checkpoint')
  for name in os.listdir(train_dir):  # model.ckpt-3 alone, as after a run of 3 steps
    if name.startswith('model.ckpt-6.'):
      os.remove(train_dir / name)
  data_file = train_dir / 'model.ckpt-3.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:1000])
  with pytest.raises(TrainingError,
                     match='holds checkpoints but none reads whole: model.ckpt-3'):
    _train_briefly(train_dir, sample, max_steps=9)


@pytest.mark.parametrize('async_towers', [False, True])
def test_tensorboard_examples_per_sec_within_a_quarter_of_the_consoles(sample, tmp_path, capsys,
                                                                       monkeypatch, async_towers):
  # A summary step also computes every histogram: timed on it, TensorBoard's rate read
  # 4-5x below the console's. It is timed on the steps between summaries, as the loss
  # lines are (one per step here).
  # Timing, not learning: at the model's 0.1, 160 unseeded async steps of 8 images once
  # diverged to a NaN (and async towers take no --seed).
  monkeypatch.setattr(cifar10, 'INITIAL_LEARNING_RATE', 0.01)
  multi_gpu_train.train(_settings(sample, tmp_path, max_steps=160 if async_towers else 60,
                                  summary_steps=5, log_frequency=1,
                                  num_gpus=1 + async_towers, async_towers=async_towers))
  lines = capsys.readouterr().out.splitlines()
  console = np.median(helpers.examples_per_sec(helpers.LOSS_LINE, lines))
  board = helpers.scalars(tmp_path, '2_training/examples_per_sec')
  # From step 5 on (step 0 has no steps before it); async: the steps a summary landed on.
  assert len(board) >= (5 if async_towers else 10), board
  if not async_towers:  # each point: the median of the 4 loss lines before its summary
    by_step = dict(zip(helpers.steps(helpers.LOSS_LINE, lines),
                       helpers.examples_per_sec(helpers.LOSS_LINE, lines)))
    for step, rate in board.items():  # lines show 0.1 examples/sec
      timed = [by_step[s] for s in range(step - 3, step + 1)]
      assert rate == pytest.approx(np.median(timed), abs=0.1), (step, rate, by_step)
  else:  # tower 0's lines: the global step moves ~2 a line, so about a third are summary
    # steps, pulling the console's median down; TensorBoard's is at least within a quarter.
    assert np.median(list(board.values())) >= 0.75 * console, (console, board)


def test_async_towers_both_update_and_global_step_counts_them(sample, tmp_path, capsys):
  multi_gpu_train.train(_settings(sample, tmp_path, num_gpus=2, async_towers=True,
                                  max_steps=40, log_frequency=10))
  out = capsys.readouterr().out
  counts = re.search(r'updates applied per tower: tower_0 (\d+), tower_1 (\d+); '
                     r'global step (\d+)', out)
  assert counts, out
  tower_0, tower_1, step = map(int, counts.groups())
  assert tower_0 > 0 and tower_1 > 0 and tower_0 + tower_1 == step == 40
  assert helpers.global_step(tmp_path) == 40


def test_loop_last_step_off_the_log_frequency_prints_its_line(tmp_path, capsys):
  multi_gpu_train.train(helpers.synthetic_settings(tmp_path, max_steps=3))
  assert helpers.steps(helpers.LOSS_LINE, capsys.readouterr().out.splitlines()) == [1, 3]


class _StopAt:
  """A stop signal that arrives during the step `at` (as steps.check_loss sees it)."""
  requested, name, exit_code = False, 'SIGTERM', 143

  def __init__(self, at):
    self.at = at


def test_loop_stopped_off_the_log_frequency_prints_the_last_steps_line(tmp_path, capsys,
                                                                       monkeypatch):
  stop, check_loss = _StopAt(4), multi_gpu_train.steps.check_loss
  def check_and_signal(loss_value, step, *args):  # noqa: E306
    stop.requested = stop.requested or step == stop.at
    check_loss(loss_value, step, *args)
  monkeypatch.setattr(multi_gpu_train.steps, 'check_loss', check_and_signal)
  with pytest.raises(errors.Stopped):
    multi_gpu_train.train(helpers.synthetic_settings(tmp_path, max_steps=100), stop=stop)
  out = capsys.readouterr().out
  assert helpers.steps(helpers.LOSS_LINE, out.splitlines()) == [1, 4], out
  assert 'Stopped by SIGTERM at step 4' in out


def test_loop_async_last_step_off_the_log_frequency_prints_tower_0s_last_line(tmp_path,
                                                                              capsys):
  multi_gpu_train.train(helpers.synthetic_settings(tmp_path, num_gpus=2, async_towers=True,
                                                   max_steps=20, log_frequency=100))
  out = capsys.readouterr().out
  shown = helpers.steps(helpers.LOSS_LINE, out.splitlines())
  # Tower 0's first and last steps: the last may be below 20, the other tower's to land.
  assert len(shown) == 2 and 1 <= shown[0] < shown[1] <= 20, out


def _saving(train_dir):
  """The temporary files of a checkpoint write under way in train_dir (none: [])."""
  if not os.path.isdir(train_dir):
    return []
  return [name for name in os.listdir(train_dir)
          if checkpoints.LEFTOVERS.match(name) and not name.startswith('run-')]


def _kill_in_a_save(task, train_dir):
  """SIGKILLs the trainer in the middle of a checkpoint write; returns what it left.

  Seen once, a write may end before the trainer stops: it is stopped (SIGSTOP)
  first, and killed only if the write's temporary files are there while it stands.
  """
  while True:
    helpers.wait_until(lambda: _saving(train_dir), 'checkpoint write', task)
    task.send(signal.SIGSTOP)
    helpers.wait_until(lambda: helpers.process_state(task.pid) == 'T', 'stopped trainer',
                       task)
    left = _saving(train_dir)
    if left:
      task.kill()
      return left
    task.send(signal.SIGCONT)


@pytest.mark.slow
def test_cli_killed_mid_save_resumes_from_last_complete_checkpoint(tmp_path, tasks):
  # The book's MNIST network on synthetic batches: the kills may come after hundreds
  # of steps, where CIFAR-10's model at lr 0.1 on batches of 8 can diverge.
  train_dir = tmp_path / 'train'
  args = _trainer('--batch_size=8', '--dataset=mnist', '--synthetic',
                  '--train_dir=%s' % train_dir,
                  '--save_every_n_steps=2', '--summary_steps=0', '--log_frequency=1')
  first = tasks(args + ['--max_steps=100000'])
  first.wait_for(helpers.SAVED_LINE, 'a first checkpoint')  # one to resume from
  left = _kill_in_a_save(first, train_dir)
  saved_step = int(tf.train.get_checkpoint_state(str(train_dir)).model_checkpoint_path
                   .rsplit('-', 1)[1])

  # Resumed, and killed in a save again, another one.
  second = tasks(args + ['--max_steps=100000'])
  resuming = 'Resuming from %s/model.ckpt-%d at step %d' % (train_dir, saved_step, saved_step)
  second.wait_for(lambda line: line == resuming, 'resuming from step %d' % saved_step)
  removed = second.wait_for(re.compile(r'^Removed what interrupted runs left in %s: (.*)\.$'
                                       % re.escape(str(train_dir))), 'the leftovers removed')
  assert set(left) <= set(removed.group(1).split(', ')), second.log()
  second.wait_for(lambda m: (m := helpers.SAVED_LINE.match(m)) and
                  int(m.group(1)) > saved_step, 'a checkpoint past step %d' % saved_step)
  _kill_in_a_save(second, train_dir)
  saved_step = int(tf.train.get_checkpoint_state(str(train_dir)).model_checkpoint_path
                   .rsplit('-', 1)[1])

  done = helpers.run(args + ['--max_steps=%d' % (saved_step + 2)])
  assert done.code == 0, done.log()
  assert 'Resuming from %s/model.ckpt-%d at step %d' % (train_dir, saved_step,
                                                        saved_step) in done.out, done.log()
  assert 'Removed what interrupted runs left in %s' % train_dir in done.out, done.log()
  assert helpers.steps(helpers.LOSS_LINE, done.out.splitlines()) == [saved_step + 1,
                                                                     saved_step + 2]


@pytest.mark.slow
def test_cli_log_device_placement_towers_on_own_devices_variables_on_cpu0(tmp_path):
  done = helpers.run(_trainer('--num_gpus=2', '--synthetic', '--batch_size=8', '--max_steps=1',
                              '--log_device_placement', '--train_dir=%s' % tmp_path))
  assert done.code == 0, done.log()
  placed = dict(re.findall(r'^(\S+): \(\w+\): (\S+)$', done.out, re.M))
  assert placed['tower_0/conv1/Conv2D'].endswith('/device:CPU:0')
  assert placed['tower_1/conv1/Conv2D'].endswith('/device:CPU:1')
  assert placed['tower_1/local3/MatMul'].endswith('/device:CPU:1')
  for var in ('conv1/weights', 'local3/weights', 'global_step'):
    assert placed[var].endswith('/device:CPU:0'), var
  assert 'input: synthetic' in done.out
  assert helpers.steps(helpers.LOSS_LINE, done.out.splitlines()) == [1]


@pytest.mark.slow
def test_cli_ctrl_c_saves_checkpoint_at_current_step_and_resumes(sample, tmp_path, tasks,
                                                                capsys):
  trainer = tasks(_trainer('--batch_size=8', *sample.flags, '--train_dir=%s' % tmp_path,
                           '--summary_steps=0', '--log_frequency=1',
                           '--max_steps=100000'))  # saves every 1000: none before Ctrl-C
  trainer.wait_for(lambda line: (m := helpers.LOSS_LINE.match(line)) and int(m.group(1)) >= 5,
                   'the loss line of step 5')
  trainer.send(signal.SIGINT)
  assert trainer.finish() == 130, trainer.log()
  assert 'Traceback' not in trainer.err
  [stopped] = helpers.matches(helpers.STOPPED_LINE, trainer.out_lines)
  step = int(stopped.group(2))
  assert stopped.group(1) == 'Ctrl-C' and step >= 5, trainer.log()
  assert 'Saved checkpoint %s/model.ckpt-%d' % (tmp_path, step) in trainer.out_lines
  assert helpers.global_step(tmp_path) == step
  multi_gpu_train.train(_settings(sample, tmp_path, max_steps=step + 1))
  assert ('Resuming from %s/model.ckpt-%d at step %d' % (tmp_path, step, step)
          in capsys.readouterr().out)
  assert helpers.global_step(tmp_path) == step + 1


@pytest.mark.slow
@pytest.mark.parametrize('change', ['cut', 'relabelled'])
def test_cli_data_file_changed_mid_run_stops_in_one_line_after_saving(tmp_path, tasks, change):
  data = helpers.write_sample(tmp_path / 'data', 40)  # 200 training records: 25 steps an epoch
  train_dir = tmp_path / 'train'
  trainer = tasks(_trainer('--batch_size=8', *data.flags, '--train_dir=%s' % train_dir,
                           '--summary_steps=0', '--log_frequency=1', '--save_every_n_steps=5',
                           '--max_steps=100000'))
  trainer.wait_for(lambda line: (m := helpers.LOSS_LINE.match(line)) and int(m.group(1)) >= 6,
                   'the loss line of step 6')  # step 5 is saved
  path = os.path.join(data.dir, 'cifar-10-batches-bin', 'data_batch_3.bin')
  with open(path, 'r+b') as f:
    if change == 'cut':  # as a copy in progress would leave it
      f.truncate(os.path.getsize(path) - 1000)
    else:  # record 0's label byte
      f.write(bytes([200]))
  assert trainer.finish() == 1, trainer.log()
  errors = [line for line in trainer.err_lines if line.startswith('error')]
  assert len(errors) == 1 and 'Traceback' not in trainer.err, trainer.log()
  assert errors[0].startswith('error: a data file changed during the run: %s %s' % (
      path, 'has 121920 bytes' if change == 'cut' else 'record 0 has label 200')), errors[0]
  step = int(re.search(r'(Saved step|The checkpoint of step) (\d+)', errors[0]).group(2))
  assert helpers.global_step(train_dir) == step > 5, trainer.log()  # whole: it reads back
  assert trainer.err_lines[-1] == errors[0], trainer.log()


def _checked(*argv):
  """check_trainer_flags on this command line: its one-line message."""
  with pytest.raises(TrainingError) as stopped:
    trainer_settings.check_trainer_flags(helpers.trainer_flags(*argv))
  return str(stopped.value)


@pytest.mark.parametrize('flag, message', [
    ('--num_gpus=4000', '--num_gpus must be at most 64 (towers: one per GPU, or per '
                        'virtual CPU device where GPUs are fewer), got 4000'),
    ('--max_steps=%d' % 2 ** 63, '--max_steps must be at most %d (the global step is an '
                                 'int64), got %d' % (2 ** 63 - 1, 2 ** 63)),
    ('--seed=%d' % 2 ** 64, '--seed must be 0 .. %d (an int64), got %d' % (2 ** 63 - 1,
                                                                          2 ** 64)),
    ('--intra_op_threads=100000', '--intra_op_threads must be at most 4096 (threads), got '
                                  '100000'),
    ('--batch_size=0', '--batch_size must be at least 1, got 0'),
])
def test_flag_out_of_range_stops_in_one_line_naming_it(flag, message):
  assert _checked(flag) == message


def test_input_pipeline_64_towers_each_get_next_warns_nothing():
  import cifar10_input
  with tf.Graph().as_default(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    next_batch, _ = input_data.input_pipeline('', 64, 2, cifar10_input, synthetic=True)
    batches = [next_batch() for _ in range(64)]  # one per tower, as train() builds them
  assert len(set(images.name for images, _ in batches)) == 64
  assert [str(w.message) for w in caught] == []
