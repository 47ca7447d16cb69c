"""training/startup.py's memory check: the step's memory from the graph, the memory
free, the one-line stop. How estimate_step_bytes was calibrated, and the shares its
margin (startup.USED_SHARE_OF_COUNTED) rests on: docs/faults.md, "A step too large".
"""
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import multi_gpu_train
from training import directory, errors, machine, startup

GB = 10 ** 9
# Images per tower whose step is counted at about 2 PB (2.00 MB each): more memory than
# any machine has, and still a graph built in a second (shapes only, nothing allocated).
HUGE_BATCH = 10 ** 9


def _train_step_estimate(batch_size, num_towers=1):
  """estimate_step_bytes of the trainer's own graph, and its variables' bytes.

  Built only, never run: the inputs are zeros of the batch's shape.
  """
  with tf.Graph().as_default():
    def next_batch():
      return tf.zeros([batch_size, 24, 24, 3]), tf.zeros([batch_size], tf.int32)
    graph = multi_gpu_train.build(next_batch, ['/cpu:%d' % i for i in range(num_towers)],
                                  batch_size, 50000)
    fetches = [graph.train_op, graph.loss] + ([graph.summary_op] if graph.summary_op is
                                              not None else [])
    variable_bytes = sum(v.shape.num_elements() * v.dtype.base_dtype.size
                         for v in tf.compat.v1.global_variables())
    return startup.estimate_step_bytes(fetches), variable_bytes


# ---- estimate_step_bytes --------------------------------------------------------

def test_estimate_step_bytes_tiny_graph_is_exact():
  with tf.Graph().as_default():
    # Bytes each op adds, and the int32 constants the ops make for their shapes and axes.
    w = tf.compat.v1.get_variable('w', [3, 4], tf.float32)            # 48, counted once
    x = tf.constant(np.ones([2, 3], np.float32))                      # 24
    y = tf.matmul(x, w)                                               # 32; reading w: 0
    flat = tf.reshape(y, [8])                                         # a view: 0; [8]: 4
    total = tf.reduce_sum(flat)                                       # 4; axes: 4
    doubled = tf.cast(w, tf.float64) * 2.0                            # 96 + 96 + 8
    loss = total + tf.cast(tf.reduce_sum(doubled), tf.float32)        # 8 + 4 + 4; axes: 8
    unknown = tf.compat.v1.placeholder(tf.float32, [None, 3])         # not fully defined: 0
    fetches = [loss, tf.reduce_sum(unknown)]                          # 4; axes: 8
    expected = (48 + 24 + 32 + 4 + 4 + 4 + (96 + 96 + 8) + (8 + 4 + 4 + 8) + (4 + 8))
    assert startup.estimate_step_bytes(fetches) == expected == 352
    # The whole graph also holds w's initializer: its random values and the ops making them.
    assert startup.estimate_step_bytes(tf.compat.v1.get_default_graph()) >= expected + 48


def test_estimate_step_bytes_device_type_counts_only_that_device():
  with tf.Graph().as_default():
    with tf.device('/gpu:0'):
      on_gpu = tf.compat.v1.placeholder(tf.float32, [1000]) + 1.0  # 4000 + 4 + 4000
    with tf.device('/cpu:0'):
      on_cpu = tf.reduce_sum(on_gpu)                                # 4; axes: 4
    unplaced = on_cpu * 2.0                                         # 4 + 4: the host's
    assert startup.estimate_step_bytes([unplaced], 'GPU') == 8004
    assert startup.estimate_step_bytes([unplaced], 'CPU') == 16
    assert startup.estimate_step_bytes([unplaced]) == 8004 + 16


def test_estimate_step_bytes_double_batch_doubles_activations():
  at_64, variable_bytes = _train_step_estimate(64)
  at_128, _ = _train_step_estimate(128)
  at_256, _ = _train_step_estimate(256)
  # estimate = fixed + batch x per_image, exactly: each doubling adds twice the last.
  assert at_256 - at_128 == 2 * (at_128 - at_64) > 0
  per_image = (at_128 - at_64) // 64
  assert per_image == pytest.approx(2.00e6, rel=0.01)  # forward and backward, CIFAR-10
  # The fixed part: variables, their gradients, average and moving averages.
  assert variable_bytes < at_64 - 64 * per_image < 6 * variable_bytes


def test_estimate_step_bytes_towers_add_their_activations():
  one, variable_bytes = _train_step_estimate(128, num_towers=1)
  four, _ = _train_step_estimate(128, num_towers=4)
  per_image = _train_step_estimate(129)[0] - one  # one more image: its bytes
  # Each tower more: its 128 images, and its own gradient of every variable to average.
  added = four - one - 3 * 128 * per_image
  assert 3 * variable_bytes < added < 3 * 5 * variable_bytes


# ---- check_step_fits ------------------------------------------------------------

def test_check_step_fits_too_large_names_batch_estimate_and_available():
  with pytest.raises(errors.TrainingError) as raised:
    startup.check_step_fits(int(102 * GB), int(21.3 * GB), 100000, 1)  # 0.6 x 102
  assert str(raised.value) == (
      'one step at --batch_size=100000 x 1 towers needs about 61.2 GB of memory '
      '(activations and gradients, estimated from the graph), and this machine has '
      '21.3 GB available. Lower --batch_size.')
  with pytest.raises(errors.TrainingError, match=r'x 4 towers needs about 900 MB .* '
                     r'has 500 MB available\. Lower --batch_size or --num_gpus\.$'):
    startup.check_step_fits(1500 * 10 ** 6, 500 * 10 ** 6, 128, 4)


def test_check_step_fits_needed_just_above_available_refuses():
  available = 6 * GB  # a step counted at 10 GB needs 0.6 x 10 = 6 GB: it fits exactly
  startup.check_step_fits(10 * GB, available, 128, 1)
  with pytest.raises(errors.TrainingError):
    startup.check_step_fits(10 * GB + 2, available, 128, 1)


def test_check_step_fits_128_x_4_towers_with_2_gb_free_passes():
  estimate, _ = _train_step_estimate(128, num_towers=4)
  assert 500 * 10 ** 6 < estimate < 1.5 * GB  # measured: 287 MB more peak RSS for the step
  startup.check_step_fits(estimate, 2 * GB, 128, 4)


def test_check_step_fits_huge_batch_on_this_machine_refuses():
  estimate, _ = _train_step_estimate(HUGE_BATCH)
  assert estimate > 1.9 * 10 ** 15  # 2.00 MB per image, as measured at 64 .. 256 above
  with pytest.raises(errors.TrainingError,
                     match='^one step at --batch_size=%d x 1' % HUGE_BATCH):
    startup.check_step_fits(estimate, machine.memory_available() or 24 * GB,
                                 HUGE_BATCH, 1)


def test_check_step_fits_unknown_memory_checks_nothing():
  startup.check_step_fits(10 ** 15, None, 100000, 1)


# ---- memory_available -----------------------------------------------------------

def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return str(path)


def _meminfo(tmp_path, available_kb):
  return _write(tmp_path / 'meminfo', 'MemTotal:       24683656 kB\nMemFree:  1 kB\n'
                'MemAvailable:   %d kB\nBuffers: 2 kB\n' % available_kb)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')
def test_memory_available_on_linux_is_positive_and_below_total():
  with open('/proc/meminfo') as f:
    total = int(f.readline().split()[1]) * 1024  # MemTotal, the first line
  assert 0 < machine.memory_available() <= total


def test_memory_available_cgroup_v2_limit_below_machine_is_limit_minus_working_set(tmp_path):
  root = tmp_path / 'cgroup'
  _write(root / 'memory.max', '%d\n' % (2 * GB))
  _write(root / 'memory.current', '%d\n' % (1500 * 10 ** 6))
  _write(root / 'memory.stat', 'anon 1\nfile 600000000\ninactive_file 500000000\n')
  proc = _write(tmp_path / 'proc_cgroup', '0::/\n')
  # 2 GB - (1.5 GB used - 0.5 GB of page cache the kernel can drop) = 1 GB
  assert machine.memory_available(_meminfo(tmp_path, 8 * 10 ** 6), str(root),
                                       proc) == 1 * GB


def test_memory_available_cgroup_v1_parent_limit_binds(tmp_path):
  memory = tmp_path / 'cgroup' / 'memory'
  _write(memory / 'memory.limit_in_bytes', '9223372036854771712\n')  # the root: no limit
  _write(memory / 'jobs' / 'memory.limit_in_bytes', '%d\n' % (3 * GB))
  _write(memory / 'jobs' / 'memory.usage_in_bytes', '%d\n' % GB)
  _write(memory / 'jobs' / 'box' / 'memory.limit_in_bytes', '%d\n' % (5 * GB))
  _write(memory / 'jobs' / 'box' / 'memory.usage_in_bytes', '%d\n' % GB)
  _write(memory / 'jobs' / 'box' / 'memory.stat', 'cache 1\ntotal_inactive_file 0\n')
  proc = _write(tmp_path / 'proc_cgroup', '5:pids:/\n4:memory:/jobs/box\n0::/\n')
  assert machine.memory_available(_meminfo(tmp_path, 8 * 10 ** 6),
                                       str(tmp_path / 'cgroup'), proc) == 2 * GB


def test_memory_available_no_cgroup_limit_is_meminfo(tmp_path):
  root = tmp_path / 'cgroup'
  _write(root / 'memory.max', 'max\n')
  _write(root / 'memory.current', '%d\n' % GB)
  proc = _write(tmp_path / 'proc_cgroup', '0::/\n')
  assert machine.memory_available(_meminfo(tmp_path, 1234), str(root),
                                       proc) == 1234 * 1024


def test_memory_available_nothing_readable_is_none(tmp_path):
  missing = str(tmp_path / 'missing')
  assert machine.memory_available(missing, missing, missing) is None


# ---- The trainers ---------------------------------------------------------------

def test_huge_batch_stops_with_one_line(tmp_path):
  train_dir = tmp_path / 'train'
  done = helpers.run(['multi_gpu_train.py', '--synthetic', '--batch_size=%d' % HUGE_BATCH,
                      '--max_steps=1', '--train_dir=%s' % train_dir])
  assert done.code == 1, done.log()
  # TensorFlow's own lines from its import are information, before any setting can quiet them.
  lines = [line for line in done.err.strip().splitlines()
           if not re.match(r'(I\d{4} |WARNING: All log messages before absl)', line)]
  assert len(lines) == 1, done.log()
  assert lines[0].startswith('error: one step at --batch_size=%d x 1 towers needs about '
                             % HUGE_BATCH), done.log()
  assert lines[0].endswith('Lower --batch_size.')
  # Stopped before the session: nothing allocated, nothing written but the lock.
  assert 'Starting from step 0' not in done.out
  written = set(os.listdir(train_dir)) if train_dir.exists() else set()
  assert written <= {directory.LOCK_FILE}
