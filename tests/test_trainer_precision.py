"""multi_gpu_train.py trained with --use_fp16 and --use_bf16, in this process: the MNIST
sample learnt as in float32, skipped steps, a seed repeated, checkpoints resumed across
precisions, and what is refused.

The last test measures that bfloat16 learns the MNIST sample as float32 does:

    python -m pytest tests/test_trainer_precision.py -q -s -k bf16_mnist

The pieces, in graphs built here: tests/test_mixed_precision.py.
"""
import collections
import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_input
import helpers
import mnist
import mnist_input
import multi_gpu_train
from training import errors, evaluation, machine, mixed_precision
from training import settings as trainer_settings

FP16_MNIST_PRECISION_GATE = 0.8   # float32's gate in tests/test_mnist.py; measured: see the test


# ---- The trainer with --use_fp16 (multi_gpu_train.py) ----------------------------
# MNIST's matmuls are cheap in float16 on this CPU; CIFAR-10's convolutions are not
# (about 2 s a step of 2 x 32 here): the CIFAR-10 runs below are a few tiny steps.

def _skips(out):
  """(step, scale, new scale) of each `step N skipped` line, as strings."""
  return [m.groups() for m in helpers.matches(helpers.SKIP_LINE, out.splitlines())]


def _step_losses(out):
  """'step N, loss = X' of each loss line: what two runs of one seed print alike."""
  return [m.group(0).split(': ', 1)[1].split(' (')[0]
          for m in helpers.matches(helpers.LOSS_LINE, out.splitlines())]


def _train(train_dir, data_dir, dataset='mnist', data_md5=None, **kwargs):
  settings = dict(num_gpus=2, batch_size=4, max_steps=4, summary_steps=0, log_frequency=1,
                  seed=1, use_fp16=True)
  settings.update(kwargs)
  multi_gpu_train.train(helpers.trainer_settings(str(train_dir), data_dir, dataset=dataset,
                                                 data_md5=data_md5, **settings))


def _evaluate(train_dir, data_dir, model=mnist, data_input=mnist_input):
  """What cifar10_eval.py and mnist_eval.py --run_once score, in this process.

  Returns:
    (precision @ 1 of the latest checkpoint's moving averages, its global step).
  """
  precision, _, _, step = evaluation.evaluate(
      tf.train.latest_checkpoint(str(train_dir)), data_dir, 'test', 128, True, model,
      data_input)
  return precision, step


@pytest.mark.slow
def test_trainer_fp16_mnist_two_towers_learns_sample_like_float32(mnist_sample, tmp_path,
                                                                   capsys):
  """tests/test_mnist.py's learning run (2 x 100, 200 steps, seed 1), in fp16."""
  _train(tmp_path / 'train', mnist_sample, batch_size=100, max_steps=200, log_frequency=100,
         summary_steps=100)
  out = capsys.readouterr().out
  assert ('float16 towers, float32 variables; dynamic loss scale from 32768 (a resumed run '
          'keeps its own), doubled after 2000 clean steps, halved on an overflow') in out
  skips = _skips(out)
  print(out[out.index('Starting from'):])
  precision, step = _evaluate(tmp_path / 'train', mnist_sample)
  print('fp16 precision @ 1 = %.3f at step %d, %d steps skipped' % (precision, step,
                                                                      len(skips)))
  # Measured: fp16 0.892, float32 0.884 (the same run). Chance 0.1; the labels cap it at 0.98.
  assert precision >= FP16_MNIST_PRECISION_GATE and step == 200
  # The pixels are 0..255: the first steps overflow at 32768 and the scale settles lower.
  assert skips and skips[0][1:] == ('32768', '16384')
  checkpoint = helpers.checkpoint(tmp_path / 'train')
  assert checkpoint['loss_scale/skipped_steps'] == len(skips) and checkpoint['global_step'] == 200
  assert checkpoint['layer1/weights'].dtype == np.float32
  scales = helpers.scalars(tmp_path / 'train', '2_training/loss_scale')
  # Step 0's summary is of its applied try, after 8 skips: 32768 / 2^8.
  assert scales[0] == 128.0 and scales[200] == checkpoint['loss_scale/scale']


def test_trainer_fp16_skipped_steps_logged_not_counted_batches_consumed(mnist_sample,
                                                                         tmp_path, capsys,
                                                                         monkeypatch):
  monkeypatch.setattr(mixed_precision, 'INITIAL_LOSS_SCALE', 2.0 ** 20)
  _train(tmp_path, mnist_sample, max_steps=3)
  out = capsys.readouterr().out
  skips = _skips(out)
  assert skips[:3] == [('1', '1.04858e+06', '524288'), ('1', '524288', '262144'),
                       ('1', '262144', '131072')], out
  assert _step_losses(out)[0].startswith('step 1, ')
  assert helpers.steps(helpers.LOSS_LINE, out.splitlines()) == [1, 2, 3]
  checkpoint = helpers.checkpoint(tmp_path)
  assert checkpoint['global_step'] == 3
  assert checkpoint['loss_scale/skipped_steps'] == len(skips)
  assert mixed_precision.checkpoint_skipped_steps(
      tf.train.latest_checkpoint(str(tmp_path))) == len(skips)


@pytest.mark.parametrize('dataset', ['mnist', 'cifar10'])
def test_trainer_fp16_same_seed_twice_identical_loss_lines_and_checkpoints(
    mnist_sample, sample, tmp_path, capsys, dataset):
  data = (dict(data_dir=mnist_sample) if dataset == 'mnist' else
          dict(data_dir=sample.dir, data_md5=sample.md5, batch_size=2, max_steps=3))
  lines = []
  for name in ('a', 'b'):
    _train(tmp_path / name, dataset=dataset, **data)
    lines.append(_step_losses(capsys.readouterr().out))
  assert len(lines[0]) == (4 if dataset == 'mnist' else 3) and lines[0] == lines[1]
  a, b = helpers.checkpoint(tmp_path / 'a'), helpers.checkpoint(tmp_path / 'b')
  assert 'loss_scale/scale' in a and a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_trainer_fp16_resumed_after_skips_equals_uninterrupted(mnist_sample, tmp_path, capsys):
  """The first steps overflow (MNIST's 0..255 pixels at 32768): the resumed input
  must start past the batches they consumed."""
  _train(tmp_path / 'whole', mnist_sample, max_steps=6)
  whole = _step_losses(capsys.readouterr().out)
  _train(tmp_path / 'parts', mnist_sample, max_steps=3)
  skipped = helpers.checkpoint(tmp_path / 'parts')['loss_scale/skipped_steps']
  _train(tmp_path / 'parts', mnist_sample, max_steps=6)
  parts = _step_losses(capsys.readouterr().out)
  assert skipped > 0 and parts == whole and len(whole) == 6
  a, b = helpers.checkpoint(tmp_path / 'whole'), helpers.checkpoint(tmp_path / 'parts')
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_trainer_float32_checkpoint_resumed_in_fp16_then_evaluated(mnist_sample, tmp_path,
                                                                    capsys):
  _train(tmp_path / 'train', mnist_sample, max_steps=3, use_fp16=False)
  assert 'loss_scale/scale' not in helpers.checkpoint(tmp_path / 'train')
  _train(tmp_path / 'train', mnist_sample, max_steps=6)
  out = capsys.readouterr().out
  assert re.search(r'model\.ckpt-3 holds no loss scale \(a float32 run\'s\): it starts at '
                   r'32768\n', out), out
  checkpoint = helpers.checkpoint(tmp_path / 'train')
  assert checkpoint['global_step'] == 6 and 'loss_scale/scale' in checkpoint
  assert _evaluate(tmp_path / 'train', mnist_sample)[1] == 6


def test_trainer_fp16_checkpoint_resumed_in_float32_then_evaluated(sample, tmp_path, capsys):
  common = dict(data_dir=sample.dir, data_md5=sample.md5, dataset='cifar10', batch_size=2)
  _train(tmp_path / 'train', max_steps=2, **common)
  saved = helpers.checkpoint(tmp_path / 'train')
  assert 'loss_scale/scale' in saved and saved['conv1/weights'].dtype == np.float32
  assert _evaluate(tmp_path / 'train', sample.dir, cifar10, cifar10_input)[1] == 2
  _train(tmp_path / 'train', max_steps=4, use_fp16=False, **common)
  out = capsys.readouterr().out
  assert 'Resuming from %s at step 2' % (tmp_path / 'train' / 'model.ckpt-2') in out
  assert 'float16 towers' not in out.split('Resuming')[1]
  assert _evaluate(tmp_path / 'train', sample.dir, cifar10, cifar10_input)[1] == 4
  # The float32 run's checkpoint keeps no loss scale: a float32 graph does not hold one.
  assert 'loss_scale/scale' not in helpers.checkpoint(tmp_path / 'train')


def test_trainer_fp16_with_async_towers_refused_naming_why(tmp_path):
  done = helpers.run(['multi_gpu_train.py', '--use_fp16', '--async_towers',
                      '--train_dir=%s' % tmp_path, '--synthetic'])
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert 'error: --use_fp16 cannot train --async_towers: the towers share one loss scale' in (
      done.err), done.log()
  assert os.listdir(tmp_path) == []


# ---- --use_bf16: bfloat16 towers, no loss scale ------------------------------------
# This CPU has AVX512_BF16 and oneDNN is on: bfloat16 is quicker than float32 here.
# Elsewhere the trainer refuses --use_bf16, and the tests that train with it skip.

BF16_UNITS = helpers.bfloat16_units()
needs_bf16_units = pytest.mark.skipif(not BF16_UNITS.ok, reason='--use_bf16 is refused '
                                      'here: %s' % BF16_UNITS.what)
BF16_SEEDS = (1, 2, 3)  # the learning runs compared; one seed alone is noisy (see there)


def _train_bf16(train_dir, data_dir, **kwargs):
  _train(train_dir, data_dir, **dict(dict(use_fp16=False, use_bf16=True), **kwargs))


def _run_record(train_dir, start_step):
  [path] = glob.glob(str(train_dir / ('run-*-step%d.json' % start_step)))
  with open(path) as f:
    return json.load(f)


@needs_bf16_units
def test_trainer_bf16_checkpoint_float32_only_resumed_by_float32_fp16_and_back(
    mnist_sample, tmp_path, capsys):
  train_dir = tmp_path / 'train'
  _train_bf16(train_dir, mnist_sample, max_steps=2)
  out = capsys.readouterr().out
  assert re.search(r'^bfloat16 towers on this CPU\'s \S+ through oneDNN, float32 variables; '
                   r'LRN, softmax and loss in float32; no loss scale$', out, re.M), out
  bf16 = helpers.checkpoint(train_dir)
  assert {n: v.dtype for n, v in bf16.items() if v.dtype != np.float32} == {
      'global_step': np.int64}
  assert len(bf16) == 9  # 4 weights, their 4 moving averages, global_step: float32's own
  assert _run_record(train_dir, 0)['precision'] == 'bfloat16 towers, float32 variables'
  # bf16 -> float32 -> bf16 -> fp16 -> bf16, two steps each, resuming in one train_dir.
  for use_fp16, use_bf16, steps in [(False, False, 4), (False, True, 6), (True, False, 8),
                                    (False, True, 10)]:
    _train(train_dir, mnist_sample, use_fp16=use_fp16, use_bf16=use_bf16, max_steps=steps)
    out = capsys.readouterr().out
    assert 'Resuming from %s at step %d' % (train_dir / ('model.ckpt-%d' % (steps - 2)),
                                            steps - 2) in out, out
    assert ('bfloat16 towers on' in out) == use_bf16 and ('float16 towers,' in out) == use_fp16
    assert ('holds no loss scale' in out) == use_fp16  # a bf16 run's checkpoint has none
    assert helpers.global_step(train_dir) == steps
  assert _run_record(train_dir, 2)['precision'] == 'float32 towers, float32 variables'
  last = helpers.checkpoint(train_dir)  # bf16's, from fp16's: the loss scale left behind
  assert last.keys() == bf16.keys() and last['layer1/weights'].dtype == np.float32
  assert _evaluate(train_dir, mnist_sample)[1] == 10


@needs_bf16_units
def test_trainer_bf16_async_towers_land_exactly_the_budget_of_updates(mnist_sample, tmp_path,
                                                                       capsys):
  _train_bf16(tmp_path, mnist_sample, async_towers=True, seed=None, max_steps=6)
  out = capsys.readouterr().out
  assert 'bfloat16 towers on' in out
  counts = re.search(r'^updates applied per tower: tower_0 (\d+), tower_1 (\d+); global '
                     r'step 6$', out, re.M)
  # Which tower lands how many depends on how the two threads interleave; together, all.
  assert counts and int(counts.group(1)) + int(counts.group(2)) == 6, out
  assert helpers.global_step(tmp_path) == 6


def test_trainer_bf16_cpu_without_bfloat16_units_refused_nothing_written(tmp_path,
                                                                        monkeypatch):
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text('processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n')
  cpu_flags = machine.cpu_flags
  monkeypatch.setattr(machine, 'cpu_flags', lambda path=str(cpuinfo): cpu_flags(path))
  monkeypatch.setattr(machine, 'list_gpus', lambda: [])  # the towers on the CPU
  with pytest.raises(errors.TrainingError) as raised:
    _train_bf16(tmp_path / 'train', None, synthetic=True)
  assert str(raised.value) == (
      '--use_bf16: this CPU has no bfloat16 units (no avx512_bf16 or amx_bf16 in '
      '/proc/cpuinfo), and emulated bfloat16 runs slower than float32. Drop --use_bf16 to '
      'train in float32.')
  assert not (tmp_path / 'train').exists()


def _check_flags(*argv):
  trainer_settings.check_trainer_flags(helpers.trainer_flags(*argv))


def test_check_flags_bf16_with_fp16_refused_in_one_line_with_async_towers_taken():
  with pytest.raises(errors.TrainingError) as stopped:
    _check_flags('--use_bf16', '--use_fp16')
  assert str(stopped.value) == ('--use_fp16 and --use_bf16 each set what the towers '
                                'compute in; pass one of the two.')
  _check_flags('--use_bf16', '--async_towers')  # no loss scale to share: taken


def test_trainer_bf16_onednn_off_refused_in_one_line_nothing_written(tmp_path):
  done = helpers.run(['multi_gpu_train.py', '--use_bf16', '--onednn=off', '--synthetic',
                      '--train_dir=%s' % (tmp_path / 'train')])
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  assert done.errors == [done.err.strip().splitlines()[-1]], done.log()
  # This CPU: oneDNN is off. One without bfloat16 units: it has none (the test above).
  assert done.errors[0].startswith('error: --use_bf16: ') and done.errors[0].endswith(
      'Drop --use_bf16 to train in float32.'), done.log()
  assert not (tmp_path / 'train').exists()


@pytest.mark.slow
@needs_bf16_units
def test_trainer_bf16_mnist_learns_sample_within_0_01_of_float32(mnist_sample, tmp_path):
  """tests/test_mnist.py's learning run (2 x 100, 200 steps), in float32 and in bf16, at
  three seeds; about 15 s. One seed alone is noisy: 0.01 is 5 of the sample's 500 test
  records, and over seeds 1..10 bf16 - float32 measured -0.012 .. +0.016, mean -0.002."""
  precisions = collections.defaultdict(list)
  for seed in BF16_SEEDS:
    for name, use_bf16 in (('float32', False), ('bf16', True)):
      train_dir = tmp_path / ('%s-%d' % (name, seed))
      _train(train_dir, mnist_sample, use_fp16=False, use_bf16=use_bf16, batch_size=100,
             max_steps=200, log_frequency=100, seed=seed)
      precision, step = _evaluate(train_dir, mnist_sample)
      assert step == 200
      precisions[name].append(precision)
  for name, values in precisions.items():
    print('%-7s precision @ 1 at seeds %s: %s, mean %.3f' % (
        name, BF16_SEEDS, ' '.join('%.3f' % p for p in values), np.mean(values)))
  assert min(precisions['bf16']) >= FP16_MNIST_PRECISION_GATE
  assert abs(np.mean(precisions['bf16']) - np.mean(precisions['float32'])) < 0.01
