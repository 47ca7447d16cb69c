"""training/placement.py: the towers' devices, and what start-up tells a user whose GPUs
TensorFlow cannot use (with a fake nvidia-smi: this machine has no GPU)."""
import glob
import os
import re

import pytest
import tensorflow as tf

import helpers
from training import machine, placement

NO_DRIVER = not glob.glob('/dev/nvidia[0-9]*')
INSTALL = 'pip install "tensorflow[and-cuda]==%s"' % tf.__version__


def _path_with_gpus(tmp_path, num_gpus):
  """A PATH whose only nvidia-smi lists num_gpus GPUs."""
  helpers.fake_nvidia_smi(tmp_path / 'bin', num_gpus)
  return str(tmp_path / 'bin')


@pytest.mark.skipif(not NO_DRIVER, reason='this machine has an NVIDIA driver')
def test_cuda_advice_machine_without_gpus_says_nothing(tmp_path):
  for visible in (None, '', '-1'):
    environ = {'PATH': str(tmp_path)} if visible is None else {
        'PATH': str(tmp_path), 'CUDA_VISIBLE_DEVICES': visible}
    assert machine.cuda_advice(environ, built_with_cuda=False) == ''
    assert machine.machine_gpus(environ) == 0


def test_cuda_advice_gpus_and_tensorflow_without_cuda_says_what_to_install(tmp_path):
  environ = {'PATH': _path_with_gpus(tmp_path, 2)}
  assert machine.machine_gpus(environ) == 2
  assert machine.cuda_advice(environ, built_with_cuda=False) == (
      'nvidia-smi lists 2 GPU(s), but this TensorFlow is built without CUDA: for NVIDIA GPUs '
      'on Linux, %s (README "GPUs")' % INSTALL)


def test_cuda_advice_gpus_and_a_cuda_build_that_finds_none_names_its_libraries(tmp_path):
  environ = {'PATH': _path_with_gpus(tmp_path, 1)}
  advice = machine.cuda_advice(environ, built_with_cuda=True)
  assert advice.startswith('nvidia-smi lists 1 GPU(s), but TensorFlow finds none: %s brings '
                           'the CUDA ' % INSTALL), advice
  assert 'TF_CPP_MIN_LOG_LEVEL=0 shows what it found' in advice


@pytest.mark.skipif(not NO_DRIVER, reason='this machine has an NVIDIA driver')
def test_cuda_advice_cuda_visible_devices_set_counts_as_asking_for_gpus(tmp_path):
  advice = machine.cuda_advice({'PATH': str(tmp_path), 'CUDA_VISIBLE_DEVICES': '0,1'},
                                 built_with_cuda=False)
  assert advice.startswith('CUDA_VISIBLE_DEVICES=0,1 names GPUs, but this TensorFlow is built '
                           'without CUDA: '), advice


@pytest.mark.skipif(bool(tf.config.list_physical_devices('GPU')), reason='TensorFlow sees GPUs')
def test_tower_devices_start_up_line_with_gpus_tensorflow_cannot_use_says_what_to_do(
    tmp_path, monkeypatch):
  monkeypatch.setenv('PATH', _path_with_gpus(tmp_path, 2))
  monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
  monkeypatch.setattr(tf.test, 'is_built_with_cuda', lambda: False)
  devices, num_cpu_devices, where = placement.tower_devices(2)
  assert devices == ['/cpu:0', '/cpu:1'] and num_cpu_devices == 2
  first, advice = where.split('\n')
  assert first.startswith('TensorFlow sees 0 GPU(s) (CUDA_VISIBLE_DEVICES=unset), fewer than '
                          '--num_gpus=2: towers run on 2 virtual CPU devices'), where
  assert advice.startswith('nvidia-smi lists 2 GPU(s), but this TensorFlow is built without '
                           'CUDA: ') and INSTALL in advice, where


def test_log_device_placement_two_towers_summary_is_the_last_placement_line(
    sample, tmp_path, capfd):
  import multi_gpu_train  # the trainer's own session start, in this process
  multi_gpu_train.train(helpers.trainer_settings(  # real data: the input's lines come late
      str(tmp_path), sample.dir, data_md5=sample.md5, num_gpus=2, batch_size=4,
      max_steps=1, summary_steps=0,
      session=placement.SessionOptions(log_device_placement=True)))
  lines = capfd.readouterr().out.splitlines()
  placed = [i for i, line in enumerate(lines) if re.match(r'^\S+: \(\w+\): \S+$', line)]
  [summary] = [i for i, line in enumerate(lines) if line.startswith('placement: ')]
  assert placed and summary > placed[-1], lines[-5:]
  counts = {}
  for i in placed:
    device = lines[i].rsplit('/device:', 1)[1].lower()  # CPU:1
    counts['/' + device] = counts.get('/' + device, 0) + 1
  assert set(counts) == {'/cpu:0', '/cpu:1'}, counts
  assert lines[summary] == 'placement: /cpu:0 %d ops, /cpu:1 %d ops (the lines above, per ' \
      'device)' % (counts['/cpu:0'], counts['/cpu:1'])
  assert helpers.steps(helpers.LOSS_LINE, lines) == [1]


def test_threads_line_says_each_pool_its_size_and_the_flag_that_set_it():
  cores = len(os.sched_getaffinity(0))  # what TensorFlow sizes a 0 as
  assert placement.threads_line(placement.SessionOptions()) == (
      'threads: %d inside an op (--intra_op_threads=0: one per core), %d ops at once '
      '(--inter_op_threads=0: one per core)' % (cores, cores))
  assert placement.threads_line(placement.SessionOptions(intra_op_threads=1,
                                                         inter_op_threads=3)) == (
      'threads: 1 inside an op (--intra_op_threads=1), 3 ops at once (--inter_op_threads=3)')
