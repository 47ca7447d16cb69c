"""multi_gpu_train.py: the gradient average, tower equivalence, the step loop, resuming."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import conftest
import multi_gpu_train
import placement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_LINE = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step (\d+), loss = \d+\.\d\d '
                      r'\(\d+\.\d examples/sec; \d+\.\d{3} sec/batch\)$')
TIMEOUT_SECS = 120


def _cli(*args, timeout=TIMEOUT_SECS):
  """Runs the trainer as a user would; returns (exit code, stdout, stderr)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'multi_gpu_train.py')] +
                        list(args), capture_output=True, text=True, timeout=timeout,
                        env=env, cwd=ROOT)
  return done.returncode, done.stdout, done.stderr


def _steps(stdout):
  return [int(m.group(1)) for m in map(LOG_LINE.match, stdout.splitlines()) if m]


@pytest.fixture(scope='module')
def sample(tmp_path_factory):
  return conftest.write_sample(tmp_path_factory.mktemp('data'), records_per_file=60)


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


def _one_step(num_towers, images, labels, start_values=None, model=cifar10):
  """Builds the trainer's graph over num_towers virtual CPUs and runs one step.

  Returns:
    (values of every global variable before the step, and after it).
  """
  per_tower = len(images) // num_towers
  slices = iter([(images[i * per_tower:(i + 1) * per_tower],
                  labels[i * per_tower:(i + 1) * per_tower]) for i in range(num_towers)])
  with tf.Graph().as_default():
    graph = multi_gpu_train.build(
        lambda: tuple(map(tf.constant, next(slices))),
        ['/cpu:%d' % i for i in range(num_towers)], per_tower,
        model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, model=model, summaries=False)
    variables = tf.compat.v1.global_variables()
    start = [v.assign(start_values[v.op.name]) for v in variables] if start_values else []
    config = placement.session_config(num_cpu_devices=num_towers)
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(start)
      before = dict(zip([v.op.name for v in variables], sess.run(variables)))
      sess.run(graph.train_op)
      after = dict(zip([v.op.name for v in variables], sess.run(variables)))
  return before, after


def test_two_towers_step_matches_one_tower_on_joined_batch():
  rng = np.random.default_rng(0)
  images = rng.standard_normal((32, 24, 24, 3)).astype(np.float32)  # no distortions
  labels = rng.integers(0, 10, 32).astype(np.int32)
  start, one_tower = _one_step(1, images, labels)
  _, two_towers = _one_step(2, images, labels, start_values=start)
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
  with pytest.raises(multi_gpu_train.TrainingError,
                     match=r'loss is nan at step \d+.*INITIAL_LEARNING_RATE'):
    multi_gpu_train.train(multi_gpu_train.Settings(
        str(tmp_path), sample.dir, num_gpus=1, batch_size=8, max_steps=50, summary_steps=0,
        save_every_n_steps=1, data_md5=sample.md5))
  # Checkpoints written while the loss was finite stay; none holds a NaN.
  state = tf.train.get_checkpoint_state(str(tmp_path))
  for path in state.all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      assert np.isfinite(reader.get_tensor(name)).all(), (path, name)


def test_cli_two_towers_logs_saves_and_resumes(sample, tmp_path):
  train_dir = str(tmp_path / 'train')
  common = ['--num_gpus=2', '--batch_size=8', *sample.flags,
            '--train_dir=' + train_dir, '--log_frequency=10', '--save_every_n_steps=20',
            '--summary_steps=0']
  code, out, err = _cli(*common, '--max_steps=30')
  assert code == 0, err
  assert '2 virtual CPU devices' in out and 'global batch 16 = 8 x 2 towers' in out
  # An epoch is the sample's 5 x 60 records, counted: 300 / 16 x 350 epochs.
  assert ('decay_steps 6562 = 300 examples (the records in data_batch_1.bin .. '
          'data_batch_5.bin) / 16 per update x 350 epochs') in out
  assert '1068298 trainable parameters' in out
  assert _steps(out) == [1, 10, 20, 30]
  assert 'Saved checkpoint %s/model.ckpt-20' % train_dir in out
  assert tf.train.load_checkpoint(train_dir).get_tensor('global_step') == 30

  code, out, err = _cli(*common, '--max_steps=40')
  assert code == 0, err
  assert 'Resuming from %s/model.ckpt-30 at step 30' % train_dir in out
  assert _steps(out) == [31, 40]
  assert tf.train.load_checkpoint(train_dir).get_tensor('global_step') == 40

  code, out, err = _cli(*common, '--max_steps=40')
  assert code == 0 and 'nothing to do' in out and _steps(out) == []

  code, out, err = _cli(*common, '--max_steps=5', '--fresh')
  assert code == 0, err
  moved = re.search(r'--fresh: moved (\d+) files from \S+ to (\S+):', out)
  assert moved and 'Starting from step 0' in out and _steps(out) == [1]
  assert 'model.ckpt-40.index' in os.listdir(moved.group(2))  # set aside, not deleted


@pytest.mark.parametrize('damage, message', [
    ('truncate', 'data_batch_2.bin has 184379 bytes; expected a non-zero multiple of 3073'),
    ('empty', 'data_batch_2.bin has 0 bytes'),
    ('missing', 'data_batch_2.bin is missing'),
    ('label', 'data_batch_2.bin record 3 has label 10; CIFAR-10 labels are 0..9'),
])
def test_cli_bad_data_file_exits_with_message_before_training(tmp_path, damage, message):
  sample = conftest.write_sample(tmp_path, records_per_file=60)
  os.remove(tmp_path / 'cifar-10-binary.tar.gz')  # else the run would extract it again
  path = tmp_path / 'cifar-10-batches-bin' / 'data_batch_2.bin'
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
  code, out, err = _cli(*sample.flags, '--train_dir=%s' % (tmp_path / 't'), '--max_steps=5')
  assert code == 1 and message in err.splitlines()[-1], err
  assert 'Traceback' not in err
  assert _steps(out) == [] and not os.path.exists(tmp_path / 't')  # nothing created


def test_cli_failed_download_leaves_no_directories(tmp_path):
  with socket.socket() as s:  # a free port on 127.0.0.1 that nothing listens on
    s.bind(('127.0.0.1', 0))
    url = 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' % s.getsockname()[1]
  code, out, err = _cli('--data_url=' + url, '--data_dir=%s' % (tmp_path / 'data'),
                        '--train_dir=%s' % (tmp_path / 'train'), '--max_steps=5')
  assert code == 1 and 'error: cannot download %s' % url in err, err
  assert 'python cifar10_input.py --write_sample=' in err  # the offline way in
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('flag, message', [
    ('--num_gpu=2', "Unknown command line flag 'num_gpu'"),
    ('--num_gpus=0', '--num_gpus must be at least 1, got 0'),
])
def test_cli_bad_flag_exits_naming_it(tmp_path, flag, message):
  code, out, err = _cli(flag, '--train_dir=%s' % tmp_path, '--data_dir=%s' % tmp_path)
  assert code != 0 and message in err, err
  assert os.listdir(tmp_path) == []


def _train_briefly(sample, train_dir, max_steps=6):
  multi_gpu_train.train(multi_gpu_train.Settings(
      train_dir, sample.dir, num_gpus=1, batch_size=8, max_steps=max_steps, summary_steps=0,
      save_every_n_steps=3, data_md5=sample.md5))


def test_checkpoint_garbled_state_file_stops_and_keeps_checkpoints(sample, tmp_path):
  _train_briefly(sample, str(tmp_path))
  (tmp_path / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-6\n{{{')
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(multi_gpu_train.TrainingError,
                     match='checkpoint cannot be read as a checkpoint state file'):
    _train_briefly(sample, str(tmp_path), max_steps=9)
  assert sorted(os.listdir(tmp_path)) == before


def test_checkpoint_truncated_data_file_stops_naming_it(sample, tmp_path):
  _train_briefly(sample, str(tmp_path))
  data_file = tmp_path / 'model.ckpt-6.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:100000])
  with pytest.raises(multi_gpu_train.TrainingError,
                     match='checkpoint .*model.ckpt-6 .*cannot be read'):
    _train_briefly(sample, str(tmp_path), max_steps=9)
  assert data_file.stat().st_size == 100000


def test_checkpoint_files_without_state_file_resume_from_newest_whole(sample, tmp_path,
                                                                    capsys):
  _train_briefly(sample, str(tmp_path))  # model.ckpt-3 and -6
  os.remove(tmp_path / 'checkpoint')  # as a kill between the files and the state file
  data_file = tmp_path / 'model.ckpt-6.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:1000])  # and the newest cut short
  _train_briefly(sample, str(tmp_path), max_steps=8)
  out = capsys.readouterr().out
  assert 'resuming from the newest checkpoint that reads whole, model.ckpt-3' in out
  assert 'Skipped, unreadable: model.ckpt-6' in out
  assert 'Resuming from %s/model.ckpt-3 at step 3' % tmp_path in out
  assert tf.train.load_checkpoint(str(tmp_path)).get_tensor('global_step') == 8


def test_checkpoint_files_none_whole_without_state_file_stop(sample, tmp_path):
  _train_briefly(sample, str(tmp_path), max_steps=3)
  os.remove(tmp_path / 'checkpoint')
  data_file = tmp_path / 'model.ckpt-3.data-00000-of-00001'
  data_file.write_bytes(data_file.read_bytes()[:1000])
  with pytest.raises(multi_gpu_train.TrainingError,
                     match='holds checkpoints but none reads whole: model.ckpt-3'):
    _train_briefly(sample, str(tmp_path), max_steps=9)


def test_async_towers_both_update_and_global_step_counts_them(sample, tmp_path):
  code, out, err = _cli('--num_gpus=2', '--async_towers', '--batch_size=8',
                        *sample.flags, '--train_dir=%s' % tmp_path,
                        '--max_steps=40', '--summary_steps=0', '--log_frequency=10')
  assert code == 0, err
  counts = re.search(r'updates applied per tower: tower_0 (\d+), tower_1 (\d+); '
                     r'global step (\d+)', out)
  assert counts, out
  tower_0, tower_1, step = map(int, counts.groups())
  assert tower_0 > 0 and tower_1 > 0 and tower_0 + tower_1 == step == 40
  assert tf.train.load_checkpoint(str(tmp_path)).get_tensor('global_step') == 40


@pytest.mark.slow
def test_cli_killed_mid_run_resumes_from_last_complete_checkpoint(sample, tmp_path):
  args = [sys.executable, os.path.join(ROOT, 'multi_gpu_train.py'), '--batch_size=8',
          *sample.flags, '--train_dir=%s' % tmp_path, '--save_every_n_steps=2',
          '--summary_steps=0', '--log_frequency=1']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  for kill_after_saves in (3, 5):  # two different moments; saves come every ~50 ms
    proc = subprocess.Popen(args + ['--max_steps=100000'], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    deadline, saves = time.time() + TIMEOUT_SECS, 0
    while saves < kill_after_saves and time.time() < deadline:
      saves += proc.stdout.readline().startswith('Saved checkpoint')
    time.sleep(0.03 * kill_after_saves)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    state = tf.train.get_checkpoint_state(str(tmp_path))
    saved_step = int(state.model_checkpoint_path.rsplit('-', 1)[1])
    code, out, err = _cli(*args[2:], '--max_steps=%d' % (saved_step + 2))
    assert code == 0, err
    assert 'Resuming from %s/model.ckpt-%d at step %d' % (tmp_path, saved_step,
                                                          saved_step) in out
    assert _steps(out) == [saved_step + 1, saved_step + 2]


def test_cli_log_device_placement_towers_on_own_devices_variables_on_cpu0(tmp_path):
  code, out, err = _cli('--num_gpus=2', '--synthetic', '--batch_size=8', '--max_steps=1',
                        '--log_device_placement', '--train_dir=%s' % tmp_path)
  assert code == 0, err
  placed = dict(re.findall(r'^(\S+): \(\w+\): (\S+)$', out, re.M))
  assert placed['tower_0/conv1/Conv2D'].endswith('/device:CPU:0')
  assert placed['tower_1/conv1/Conv2D'].endswith('/device:CPU:1')
  assert placed['tower_1/local3/MatMul'].endswith('/device:CPU:1')
  for var in ('conv1/weights', 'local3/weights', 'global_step'):
    assert placed[var].endswith('/device:CPU:0'), var
  assert 'input: synthetic' in out and _steps(out) == [1]


def test_cli_ctrl_c_saves_checkpoint_at_current_step_and_resumes(sample, tmp_path):
  args = [sys.executable, os.path.join(ROOT, 'multi_gpu_train.py'), '--batch_size=8',
          *sample.flags, '--train_dir=%s' % tmp_path, '--summary_steps=0',
          '--log_frequency=1', '--max_steps=100000']  # saves every 1000: none before Ctrl-C
  proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), cwd=ROOT)
  deadline, logged = time.time() + TIMEOUT_SECS, 0
  while logged < 5 and time.time() < deadline:
    logged += bool(LOG_LINE.match(proc.stdout.readline().rstrip('\n')))
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  stopped = re.search(r'^Stopped by Ctrl-C at step (\d+); rerun the same command', out, re.M)
  assert stopped, out
  step = int(stopped.group(1))
  assert step >= 5 and 'Saved checkpoint %s/model.ckpt-%d' % (tmp_path, step) in out
  assert tf.train.load_checkpoint(str(tmp_path)).get_tensor('global_step') == step
