"""Where the ops run: the towers' devices, the session's options, the GPU switches.

Both trainers (multi_gpu_train.py and dist_train.py's workers) place their towers
and open their sessions through these; the evaluation programs look for GPUs
through machine.list_gpus(). No flags are read here: settings arrive as arguments.
"""
import collections
import contextlib
import ctypes
import os
import re
import sys
import tempfile

import tensorflow as tf

from training import machine


def tower_devices(num_gpus):
  """Device of each tower: /gpu:i when TensorFlow sees enough GPUs, else /cpu:i.

  Returns:
    (list of device strings, number of CPU devices the session must create,
     a line for start-up saying where the towers run).
  """
  gpus = machine.list_gpus()  # honours CUDA_VISIBLE_DEVICES
  if len(gpus) >= num_gpus:
    return (['/gpu:%d' % i for i in range(num_gpus)], 1,
            'towers on /gpu:0 .. /gpu:%d of %d visible GPUs' % (num_gpus - 1, len(gpus)))
  where = ('the tower runs on /cpu:0' if num_gpus == 1 else
           'towers run on %d virtual CPU devices /cpu:0 .. /cpu:%d, sharing the CPU cores'
           % (num_gpus, num_gpus - 1))
  advice = '' if gpus else machine.cuda_advice()
  return (['/cpu:%d' % i for i in range(num_gpus)], num_gpus,
          'TensorFlow sees %d GPU(s) (CUDA_VISIBLE_DEVICES=%s), fewer than --num_gpus=%d: %s%s'
          % (len(gpus), os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), num_gpus, where,
             advice and '\n' + advice))


def place(device, variables_device):
  """Device function: variables on `variables_device`, every other op on `device`.

  variables_device '' leaves variables to an enclosing device function, such as
  replica_device_setter putting them on parameter servers. A device set by an
  inner scope wins (the input's /cpu:0, SyncReplicasOptimizer's queues).
  """
  def place_op(op):
    node_def = op if isinstance(op, tf.compat.v1.NodeDef) else op.node_def
    if node_def.op in ('VarHandleOp', 'VariableV2'):
      return variables_device
    return node_def.device or device
  return place_op


SessionOptions = collections.namedtuple('SessionOptions', [
    'log_device_placement',  # bool: log the device of every op
    'allow_growth',          # bool: GPU memory as needed, not nearly all at start
    'gpu_memory_fraction',   # float 0..1: cap on each GPU's memory; 0: none
    'intra_op_threads',      # int: threads inside one op; 0: one per core
    'inter_op_threads',      # int: ops run at once; 0: one per core
], defaults=(False, False, 0.0, 0, 0))


def threads_line(options):
  """The session's thread pools, for start-up: 'threads: 2 inside an op
  (--intra_op_threads=0: one per core), 2 ops at once (--inter_op_threads=0: one per
  core)'. TensorFlow sizes a 0 as the cores this process may run on."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  said = ['%d %s (--%s=%d%s)' % (value or cores, what, name, value, ': one per core' * (not value))
          for what, name, value in (('inside an op', 'intra_op_threads', options.intra_op_threads),
                                    ('ops at once', 'inter_op_threads', options.inter_op_threads))]
  return 'threads: %s' % ', '.join(said)


def session_config(num_cpu_devices=1, options=SessionOptions()):
  """ConfigProto with soft placement, the virtual CPU devices and the GPU options."""
  config = tf.compat.v1.ConfigProto(
      allow_soft_placement=True,  # ops with no GPU kernel fall back to the CPU
      log_device_placement=options.log_device_placement,
      device_count={'CPU': num_cpu_devices},
      intra_op_parallelism_threads=options.intra_op_threads,
      inter_op_parallelism_threads=options.inter_op_threads)
  config.gpu_options.allow_growth = options.allow_growth
  if options.gpu_memory_fraction:
    config.gpu_options.per_process_gpu_memory_fraction = options.gpu_memory_fraction
  return config


@contextlib.contextmanager
def op_determinism():
  """TensorFlow's deterministic GPU kernels, for one run.

  The switch is process-wide; it is put back as it was at the end, so that an
  unseeded run in the same process (a test, a notebook) does not inherit it.
  """
  from tensorflow.python.framework import config  # the public API can only switch it on
  was_on = config.is_op_determinism_enabled()
  tf.config.experimental.enable_op_determinism()
  try:
    yield
  finally:
    if not was_on:
      config.disable_op_determinism()


PLACEMENT_LINE = re.compile(r'^\S+: \(\w+\): (\S+)$')  # TensorFlow's: name: (Op): device


@contextlib.contextmanager
def placement_summed_up(sess, log_device_placement):
  """With --log_device_placement, one line after TensorFlow's placement lines that sums
  them up per device: 'placement: /cpu:0 1272 ops, /cpu:1 185 ops (the lines above)'.

  TensorFlow prints a line per op (C's stdout) when a session first runs it: in the
  session's first runs (initialising or restoring) and in the first step, where the
  input pipeline's functions are placed. Enter this block once the session is open;
  it yields arm(), to call once the session is initialised: the lines are then summed
  up after the next sess.run (the first step), or when the block ends, whichever
  comes first. What is printed meanwhile goes to a file first and then on to stdout
  as it was, in order; nothing is changed without the flag.
  """
  if not log_device_placement:
    yield lambda: None
    return
  stop_capture = _capture_stdout()
  summed = []

  def sum_up():
    if not summed:
      summed.append(_summary(stop_capture()))
      print(summed[0])

  def first_step(*args, **kwargs):
    del sess.run  # the session's own run again, for every later step
    try:
      return session_run(*args, **kwargs)
    finally:
      sum_up()

  session_run = sess.run

  def arm():
    sess.run = first_step
  try:
    yield arm
  finally:
    if 'run' in vars(sess):
      del sess.run
    sum_up()


def _capture_stdout():
  """Points file descriptor 1 at a temporary file; returns stop(), which points it back,
  writes out what was captured and returns it as text."""
  sys.stdout.flush()
  saved_stdout = os.dup(1)
  captured = tempfile.TemporaryFile()
  os.dup2(captured.fileno(), 1)

  def stop():
    sys.stdout.flush()
    ctypes.CDLL(None).fflush(None)  # TensorFlow's lines, buffered in C's stdio
    os.dup2(saved_stdout, 1)
    os.close(saved_stdout)
    with captured:
      captured.seek(0)
      text = captured.read().decode('utf-8', 'replace')
    sys.stdout.write(text)
    sys.stdout.flush()
    return text
  return stop


def _summary(text):
  """The placement line of the captured text."""
  counts = collections.Counter()
  for line in text.splitlines():
    placed = PLACEMENT_LINE.match(line)
    if placed:
      spec = tf.DeviceSpec.from_string(placed.group(1))
      counts['/%s:%d' % (spec.device_type.lower(), spec.device_index)] += 1
  return ('placement: %s (the lines above, per device)' % ', '.join(
      '%s %d ops' % (device, counts[device]) for device in sorted(counts)) if counts else
      'placement: TensorFlow printed no placement lines')
