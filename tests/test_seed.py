"""--seed: runs that repeat exactly, whatever the towers, interrupted or not; run records."""
import json
import os
import re
import signal

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

import cifar10
import cifar10_input
import helpers
import multi_gpu_train
from training import input_data, machine, summaries

# 2 x 32 or 4 x 16 against 1 x 64 images: the same data, summed in a different order.
# Measured over the first 4 steps, oneDNN on and off: at most 3.3e-6 in the loss. Later
# a rounding difference can flip a max-pool's choice or a ReLU, and training amplifies
# it: by step 10 one split of each setting had drifted by 1e-3 (docs/trainer.md "Runs
# that repeat exactly").
STEPS_TO_COMPARE = 4
LOSS_ATOL = 2e-5
VARIABLE_ATOL = 1e-4
LOSS_TAG = summaries.LOSS_TAGS + 'total_loss'


def _train(sample, train_dir, num_gpus=1, batch_size=8, max_steps=6, seed=7, **kwargs):
  multi_gpu_train.train(helpers.trainer_settings(
      str(train_dir), sample.dir, num_gpus=num_gpus, batch_size=batch_size, max_steps=max_steps,
      summary_steps=1, data_md5=sample.md5, seed=seed, **kwargs))


def _losses(train_dir):
  """{step: total_loss} over every event file of the directory, exactly as written."""
  return helpers.scalars(train_dir, LOSS_TAG)


def _assert_identical(a, b):
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_same_seed_twice_identical_losses_and_checkpoints(sample, tmp_path):
  _train(sample, tmp_path / 'a', num_gpus=2)
  _train(sample, tmp_path / 'b', num_gpus=2)
  assert sorted(_losses(tmp_path / 'a')) == list(range(7))  # 0..5, and the end
  assert _losses(tmp_path / 'a') == _losses(tmp_path / 'b')  # bit for bit
  _assert_identical(helpers.checkpoint(tmp_path / 'a'), helpers.checkpoint(tmp_path / 'b'))
  _train(sample, tmp_path / 'c', num_gpus=2, seed=8)  # and the seed matters
  assert _losses(tmp_path / 'c')[1] != _losses(tmp_path / 'a')[1]


def _global_batches(sample, num_gpus, batch_size, steps, start_step=0):
  """The images and labels the towers of a seeded run see, joined in tower order."""
  with tf.Graph().as_default():
    next_batch, init = input_data.input_pipeline(sample.dir, num_gpus, batch_size, cifar10_input,
                                            seed=7, start_step=start_step)
    towers = [next_batch() for _ in range(num_gpus)]
    images = tf.concat([i for i, _ in towers], 0)
    labels = tf.concat([l for _, l in towers], 0)
    with tf.compat.v1.Session() as sess:
      sess.run(init)
      return [sess.run([images, labels]) for _ in range(steps)]


def test_towers_see_the_same_images_whatever_the_split_and_resume_exactly(sample):
  two = _global_batches(sample, num_gpus=2, batch_size=32, steps=5)
  one = _global_batches(sample, num_gpus=1, batch_size=64, steps=5)
  resumed = _global_batches(sample, num_gpus=2, batch_size=32, steps=2, start_step=3)
  for (a_images, a_labels), (b_images, b_labels) in zip(two, one):
    np.testing.assert_array_equal(a_images, b_images)  # crops, flips, brightness, contrast
    np.testing.assert_array_equal(a_labels, b_labels)
  for (a_images, _), (b_images, _) in zip(two[3:], resumed):
    np.testing.assert_array_equal(a_images, b_images)
  assert not np.array_equal(two[0][0], two[1][0])  # and the batches do change


def _cli(sample, train_dir, *extra):
  return ['multi_gpu_train.py', '--seed=7', '--batch_size=8', '--num_gpus=2',
          '--summary_steps=0', '--log_frequency=1',
          '--train_dir=%s' % train_dir] + sample.flags + list(extra)


def _cli_seeded_run(sample, train_dir, num_gpus, batch_size, onednn_flag):
  """multi_gpu_train.py --seed=7 as a user runs it, with --onednn=onednn_flag."""
  done = helpers.run(_cli(sample, train_dir, '--num_gpus=%d' % num_gpus,
                          '--batch_size=%d' % batch_size, '--summary_steps=1',
                          '--max_steps=%d' % STEPS_TO_COMPARE, '--onednn=' + onednn_flag),
                     env=helpers.user_env(**{machine.ENV: None, machine.SET_HERE_ENV: None}))
  assert done.code == 0, done.log()
  assert 'oneDNN %s: --onednn=%s' % (onednn_flag, onednn_flag) in done.out, done.log()
  return _losses(train_dir), helpers.checkpoint(train_dir)


@pytest.mark.slow
@pytest.mark.parametrize('onednn_flag', ['off', 'on'])
def test_tower_splits_agree_with_one_tower_on_the_joined_batch(sample, tmp_path, onednn_flag):
  one, one_variables = _cli_seeded_run(sample, tmp_path / 'one', 1, 64, onednn_flag)
  assert sorted(one) == list(range(STEPS_TO_COMPARE + 1))
  # It learned: not frozen models (the harder sample: 4.67 -> 4.59 in 4 steps).
  assert one[STEPS_TO_COMPARE] < one[0] - 0.05
  for num_gpus, batch_size in ((2, 32), (4, 16)):
    split, variables = _cli_seeded_run(sample, tmp_path / str(num_gpus), num_gpus, batch_size,
                                       onednn_flag)
    assert sorted(split) == sorted(one)
    np.testing.assert_allclose([split[s] for s in sorted(split)], [one[s] for s in sorted(one)],
                               rtol=0, atol=LOSS_ATOL, err_msg='%d towers' % num_gpus)
    for name in one_variables:
      np.testing.assert_allclose(variables[name], one_variables[name], rtol=0,
                                 atol=VARIABLE_ATOL, err_msg='%d towers: %s' % (num_gpus, name))


@pytest.fixture(scope='module')
def uninterrupted(sample, tmp_path_factory):
  """The checkpoint of a seeded command-line run of 12 steps, never interrupted."""
  train_dir = tmp_path_factory.mktemp('uninterrupted')
  done = helpers.run(_cli(sample, train_dir, '--max_steps=12'))
  assert done.code == 0, done.log()
  return helpers.checkpoint(train_dir)


@pytest.mark.slow
@pytest.mark.xdist_group('seed_uninterrupted')
@pytest.mark.parametrize('sig, after_step', [
    (signal.SIGINT, 4),    # one step past the save of step 3: it saves where it stops
    (signal.SIGKILL, 7),   # one past the save of step 6: resumed from there, 7 and on again
], ids=['ctrl-c-after-step-4', 'kill-9-after-step-7'])
def test_interrupted_and_resumed_equals_uninterrupted(sample, tmp_path, tasks, uninterrupted,
                                                      sig, after_step):
  cut = tasks(_cli(sample, tmp_path, '--max_steps=12', '--save_every_n_steps=3'))
  cut.wait_for(lambda line: (m := helpers.LOSS_LINE.match(line)) and
               int(m.group(1)) == after_step, 'the loss line of step %d' % after_step)
  cut.send(sig)
  assert cut.finish() == (130 if sig == signal.SIGINT else -signal.SIGKILL), cut.log()
  done = helpers.run(_cli(sample, tmp_path, '--max_steps=12'))
  assert done.code == 0, done.log()
  resumed = helpers.matches(helpers.RESUMING_LINE, done.out.splitlines())
  assert resumed and int(resumed[0].group(2)) >= 3, done.log()  # past the first save
  _assert_identical(uninterrupted, helpers.checkpoint(tmp_path))


def test_seed_with_async_towers_refused(sample, tmp_path):
  done = helpers.run(_cli(sample, tmp_path, '--async_towers', '--max_steps=2'))
  assert done.code == 1 and 'error: --seed cannot repeat an --async_towers run' in (
      done.err), done.log()
  assert not os.path.exists(tmp_path / 'checkpoint')


def test_run_record_holds_an_edited_constant_in_json_and_tensorboard(sample, tmp_path,
                                                                     monkeypatch, capsys):
  monkeypatch.setattr(cifar10, 'INITIAL_LEARNING_RATE', 0.05)  # as if edited in the file
  _train(sample, tmp_path, max_steps=2, seed=3)
  path = re.search(r'^Run record: (\S+\.json)$', capsys.readouterr().out, re.M).group(1)
  assert os.path.dirname(path) == str(tmp_path)
  with open(path) as f:
    record = json.load(f)
  assert record['constants']['cifar10/model.py']['INITIAL_LEARNING_RATE'] == 0.05
  assert record['constants']['multi_gpu_train.py']['KEEP_CHECKPOINTS'] == 5
  assert record['seed'] == 3 and record['start_step'] == 0
  assert record['tensorflow'] == tf.__version__ and record['devices'] == ['/cpu:0']
  assert record['data'] == {'data_dir': sample.dir,  # what was read, not the official URL
                            'copy': 'your own archive, md5 %s (--data_md5)' % sample.md5}

  events = event_accumulator.EventAccumulator(helpers.event_files(tmp_path)[0],
                                              size_guidance={'tensors': 0})
  events.Reload()
  text = tf.make_ndarray(events.Tensors('run_record')[0].tensor_proto).item().decode()
  assert '"INITIAL_LEARNING_RATE": 0.05' in text
