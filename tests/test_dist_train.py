"""dist_train.py, the trainer: two workers against one process, fp16 and bf16, placement.

Real ps and worker processes on 127.0.0.1, each bounded in time: two workers, async
and sync, on one synthetic batch against multi_gpu_train.py's one-process SGD from the
same checkpoint; --use_fp16's loss scale on the ps across fp16 and float32 runs, and
--use_bf16. In-process graphs check where the variables, their reads and their moving
averages are placed.

The cluster tests start TensorFlow servers on free loopback ports and read the
tasks' logs as they come. Every process is killed when its test ends, pass or fail.
Where a test needs several workers to train side by side, it holds each worker
(SIGSTOP) as it says it is training and lets them all go together: a worker that
joins late (the others look for the chief's variables once a second) can then
never find the run already over.

dist_train.py's other tests: tests/test_dist_flags.py (flags and start-up),
tests/test_dist_faults.py (tasks killed, stopped and restarted; the chief's
checkpoints), tests/test_local_cluster.py (the --local_cluster launcher).
"""
import os
import re
import signal
import types

import numpy as np
import pytest
import tensorflow as tf

import helpers
from helpers import (DONE_LINE, RESUMING_LINE, SAVED_LINE, SKIP_LINE, STEADY_FLAGS,
                     TASK_PREFIX, WORKER_LOSS_LINE, local_cluster_task, matches,
                     run_job)
import data_sets
import dist_train
from distributed import chief, local_cluster, ps_placement, worker_updates
import cifar10
import mnist
import multi_gpu_train
from training import run_record, updates


def start_together(launcher, num_workers):
  """Pauses each worker of a --local_cluster as it says it is training; then resumes all.

  Returns once every worker trains: none can have finished before the last joined.
  """
  waiting, paused = set(range(num_workers)), []

  def training(line):
    found = TASK_PREFIX.match(line)
    index = found and found.group(1).startswith('worker') and int(found.group(1)[6:])
    started = found and helpers.TRAINING_FROM.match(found.group(2))
    return started and index in waiting and (index,)
  while waiting:
    [index] = launcher.wait_for(training, 'worker(s) %s training' % sorted(waiting))
    pid = helpers.task_pid(launcher.pid, 'worker', index)
    os.kill(pid, signal.SIGSTOP)
    paused.append(pid)
    waiting.remove(index)
  for pid in paused:
    os.kill(pid, signal.SIGCONT)


# ---- Two workers, async and sync, against one process ------------------------------

MAX_STEPS = 40
# What TensorFlow's logging and Python tracebacks look like, and words that alarm.
ERROR_LOOKING = re.compile(r'^[EWF]\d{4} |error|cancel|abort|fail|exception|traceback|'
                           r'deprecat|warning', re.I)


def alarming_lines(lines):
  """Lines of a --local_cluster run a user would take for trouble: the tasks' own, and
  the launcher's but for its notices about what it quiets."""
  notices = re.compile('|'.join(local_cluster.QUIET_LINES + local_cluster.NO_GPU_LINES))
  alarming = []
  for line in lines:
    task_line = TASK_PREFIX.match(line)
    text = task_line.group(2) if task_line else line
    if ERROR_LOOKING.search(text) and (task_line or not notices.search(line)):
      alarming.append(line)
  return alarming


def two_worker_run(start, train_dir, *flags):
  """1 ps + 2 workers on the synthetic batch, as a user runs it (the default log level),
  the workers started together. Returns the launcher's lines."""
  launcher = local_cluster_task(start, 1, 2, train_dir, '--synthetic',
                                '--max_steps=%d' % MAX_STEPS, *flags, env=helpers.user_env())
  start_together(launcher, 2)
  assert launcher.finish() == 0, launcher.log()
  return launcher.lines


@pytest.fixture(scope='module')
def async_run(module_tasks, tmp_path_factory):
  """1 ps + 2 async workers on the same synthetic batch, from the start checkpoint to
  MAX_STEPS."""
  train_dir = tmp_path_factory.mktemp('async')
  helpers.write_start_checkpoint(train_dir)
  return str(train_dir), two_worker_run(module_tasks, train_dir, '--summary_steps=10')


@pytest.fixture(scope='module')
def sync_run(module_tasks, tmp_path_factory):
  """1 ps + 2 sync workers, from the start checkpoint to MAX_STEPS."""
  train_dir = tmp_path_factory.mktemp('sync')
  helpers.write_start_checkpoint(train_dir)
  return str(train_dir), two_worker_run(module_tasks, train_dir, '--summary_steps=0',
                                        '--sync_replicas', '--log_frequency=10')


@pytest.fixture(scope='module')
def one_process_run(tmp_path_factory):
  """multi_gpu_train.py, one tower, from the start checkpoint on the same batch."""
  train_dir = tmp_path_factory.mktemp('one_process')
  helpers.write_start_checkpoint(train_dir)
  multi_gpu_train.train(helpers.trainer_settings(
      str(train_dir), '', synthetic=True, max_steps=MAX_STEPS, batch_size=8, summary_steps=0))
  return str(train_dir)


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_async_two_workers_both_train_to_exactly_max_steps(async_run):
  train_dir, lines = async_run
  logs = helpers.by_task(lines)
  assert sorted(logs) == ['ps0', 'worker0', 'worker1']
  local_steps = {}
  for worker in ('worker0', 'worker1'):
    loss_lines = [line for line in logs[worker] if ': step ' in line]
    assert loss_lines and all(map(WORKER_LOSS_LINE.match, loss_lines)), loss_lines
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == MAX_STEPS
    local_steps[worker] = int(done.group(2))
    assert local_steps[worker] >= 1, 'worker %s did not contribute' % worker
  # Every update is one worker step; none past MAX_STEPS, none lost.
  assert sum(local_steps.values()) == MAX_STEPS
  assert helpers.global_step(train_dir) == MAX_STEPS
  assert tf.train.latest_checkpoint(train_dir).endswith('model.ckpt-%d' % MAX_STEPS)
  # Only the chief saves and writes summaries, into one event file.
  assert matches(SAVED_LINE, logs['worker0']) and not matches(SAVED_LINE, logs['worker1'])
  assert len(helpers.event_files(train_dir)) == 1
  assert {'1_loss/total_loss', '2_training/learning_rate'} <= helpers.summary_tags(train_dir)
  # As multi_gpu_train.py's, the run ends with a summary of where it stopped.
  assert max(helpers.scalars(train_dir, '1_loss/total_loss')) == MAX_STEPS


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_chief_tensorboard_examples_per_sec_is_a_rate_of_its_steps(async_run):
  # Timed, as multi_gpu_train.py's, on the chief's steps that computed no summary: each
  # value is a median of step rates the chief's loss lines show too (its hook's window
  # sits inside the loop's, a little shorter). Not a comparison of two medians: on two
  # shared cores, two workers' rates swing 10x within a run of 40 steps.
  train_dir, lines = async_run
  chief = matches(WORKER_LOSS_LINE, helpers.by_task(lines)['worker0'])
  summarised = sorted(helpers.scalars(train_dir, '1_loss/total_loss'))
  # A summary at step s was computed in the chief's first step shown past s: that
  # line's rate is a summary step's, 4-5x slower, which the value must not be.
  summary_lines = {next((i for i, m in enumerate(chief) if int(m.group(1)) > s), None)
                   for s in summarised}
  console = helpers.examples_per_sec(WORKER_LOSS_LINE, [
      m.group(0) for i, m in enumerate(chief) if i and i not in summary_lines])
  board = helpers.scalars(train_dir, '2_training/examples_per_sec')
  # How many summaries carry a rate depends on how the two workers' steps interleave:
  # the chief sums up only when its own step crosses a multiple of --summary_steps, and
  # a rate needs a step of its own without a summary before (a fresh-clone run saw 2).
  assert board, board
  for value in board.values():
    assert 0.9 * min(console) <= value <= 1.1 * max(console), (console, board)


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_local_cluster_normal_finish_prints_no_error_looking_line(async_run, sync_run, mode):
  _, lines = async_run if mode == 'async' else sync_run
  # The ps task ended by itself once both workers had said they finished.
  assert '[ps0] ps task 0 done: training is over' in lines
  assert lines[-1] == ('local cluster: all 2 workers finished, then the 1 ps task(s) by '
                       'themselves')
  assert alarming_lines(lines) == []


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_sync_loss_lines_name_the_global_step_first_then_every_log_frequency(sync_run):
  # As multi_gpu_train.py's: the global step after the update, at the first step,
  # then at the first global step past each multiple of --log_frequency=10 that this
  # worker sees: a worker whose gradients the other outpaced may see it several
  # updates late (measured: 14).
  logs = helpers.by_task(sync_run[1])
  for worker in ('worker0', 'worker1'):
    [first] = [int(m.group(2)) for m in matches(helpers.TRAINING_FROM, logs[worker])]
    steps = helpers.steps(WORKER_LOSS_LINE, logs[worker])
    assert steps[0] == first + 1, (worker, first, steps)
    shown = steps[1:]
    if len(shown) > 1 and shown[-1] // 10 == shown[-2] // 10:
      shown = shown[:-1]  # its last step's line, which the frequency skipped
    decades = list(range((first + 1) // 10 + 1, MAX_STEPS // 10 + 1))  # past steps[0]'s
    assert [s // 10 for s in shown] == decades[:len(shown)], (worker, steps)
    assert all(s <= MAX_STEPS for s in steps[1:]), (worker, steps)


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_sync_each_workers_last_loss_line_is_its_last_step_though_off_the_frequency(
    sync_run):
  logs = helpers.by_task(sync_run[1])
  for worker in ('worker0', 'worker1'):
    [done] = matches(DONE_LINE, logs[worker])
    last = matches(WORKER_LOSS_LINE, logs[worker])[-1]
    assert last.group(3) == done.group(2), (worker, last.group(0), done.group(0))


@pytest.mark.slow
@pytest.mark.xdist_group('two_workers')
def test_sync_schedule_counts_the_examples_each_update_averages(async_run, sync_run):
  # An epoch is the same 50,000 examples however they are grouped: a sync update
  # averages 2 workers' batches of 8, so the rate drops after half as many updates as
  # async's, whose updates are one worker's batch each.
  schedule = re.compile(r'^\[worker[01]\] decay_steps (\d+) = 50000 examples \(.*\) / '
                        r'(\d+) per (worker step|update) x 350 epochs; input: synthetic$')
  found = {mode: {m.groups() for m in matches(schedule, run[1])}
           for mode, run in (('async', async_run), ('sync', sync_run))}
  assert found == {'async': {('%d' % (50000 / 8 * 350), '8', 'worker step')},
                   'sync': {('%d' % (50000 / 16 * 350), '16', 'update')}}, found


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.xdist_group('two_workers')
def test_sync_two_workers_equal_one_process_sgd_unlike_async(sync_run, one_process_run,
                                                             async_run):
  train_dir, lines = sync_run
  logs = helpers.by_task(lines)
  [resuming] = matches(RESUMING_LINE, logs['worker0'])
  start = int(resuming.group(2))  # the start checkpoint's step, 0
  done = {w: matches(DONE_LINE, logs[w])[0] for w in ('worker0', 'worker1')}
  assert all(int(d.group(2)) >= 1 for d in done.values())
  # Each update averages 2 worker gradients: the global step counts updates, not steps.
  assert sum(int(d.group(2)) for d in done.values()) >= 2 * (MAX_STEPS - start)
  sync = helpers.checkpoint(train_dir)
  one_process = helpers.checkpoint(one_process_run)
  async_ = helpers.checkpoint(async_run[0])
  assert sync['global_step'] == one_process['global_step'] == MAX_STEPS
  # Same batch everywhere, stale gradients dropped: each update is one SGD step on
  # the current variables, as in one process. The moving averages, stepped once
  # per update by the chief, match too.
  assert sorted(sync) == sorted(one_process)
  for name in sync:
    np.testing.assert_allclose(sync[name], one_process[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert any(name.endswith('/ExponentialMovingAverage') for name in sync)
  # The async workers, started together, applied gradients of variables that had
  # changed meanwhile: they differ from one-process SGD by far more than sync's
  # tolerance (measured 8.3e-4 to above 1e-3).
  assert max(np.abs(async_[name] - sync[name]).max() for name in sync) > 1e-4


def ancestors(op):
  """Every op that runs before op: its inputs' and control inputs', transitively."""
  before, todo = set(), [op]
  while todo:
    for earlier in [t.op for t in todo[-1].inputs] + list(todo.pop().control_inputs):
      if earlier not in before:
        before.add(earlier)
        todo.append(earlier)
  return before


def test_sync_update_steps_the_averages_then_counts_then_hands_out_the_tokens():
  # A worker's step returns on its token: the chief saves once its last step has, and
  # once its StopAtStepHook reads max_steps, which it reads while its queue runner may
  # be applying the next update. So the averages of an update are stepped before the
  # tokens go out, and before the global step counts the update, or that save can hold
  # them one update behind (the test above caught each, 1 run in 5, then once in CI).
  with tf.Graph().as_default() as graph:
    global_step = tf.compat.v1.train.get_or_create_global_step()
    weights = tf.compat.v1.get_variable('weights', [2], initializer=tf.zeros_initializer())
    model = types.SimpleNamespace(MOVING_AVERAGE_DECAY=0.9)
    sync = worker_updates.SyncReplicas(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                       2, 2, 0, model)
    sync.apply_gradients([(tf.ones([2]), weights)], global_step=global_step)
    # The queue runner's one op per update hands a token to each worker's queue:
    # nothing runs after it.
    [hand_out] = sync.get_chief_queue_runner().enqueue_ops
    enqueues = [op for op in ancestors(hand_out) if op.type == 'QueueEnqueueV2']
    assert sorted(op.inputs[0].op.name for op in enqueues) == [
        'sync_token_q_worker_0', 'sync_token_q_worker_1']
    [count] = [op for op in ancestors(hand_out) if op.type.startswith('AssignAdd')
               and op.inputs[0].op == global_step.op]
    before_count = ancestors(count)
    averaged = {op.name for op in before_count if op.type.startswith('Assign')
                and 'ExponentialMovingAverage' in op.name}
    assert averaged, sorted(op.name for op in before_count)
    applied = [op for op in before_count if op.type == 'ResourceApplyGradientDescent'
               or op.type == 'ApplyGradientDescent']
    assert applied, sorted(op.name for op in before_count)


# ---- --use_fp16: the loss scale on the ps (MNIST: float16 is quick on this CPU) -----
# MNIST's pixels are 0..255: at the initial scale of 32768 the first gradients
# overflow float16, so every fresh fp16 run starts with a few skips.

FP16_STEPS = 12
LOSS_SCALE_VARIABLES = {'loss_scale/scale', 'loss_scale/good_steps',
                        'loss_scale/skipped_steps'}


def mnist_flags(data_dir):
  return ['--dataset=mnist', '--data_dir=%s' % data_dir, '--summary_steps=0']


def mnist_checkpoint(data_dir, scratch_dir, max_steps, use_fp16):
  """The last checkpoint of multi_gpu_train.py on the MNIST sample, 8 images a step, run
  in this process into scratch_dir: a cluster's start, made by the cluster's fixture."""
  multi_gpu_train.train(helpers.trainer_settings(
      str(scratch_dir), data_dir, dataset='mnist', num_gpus=1, batch_size=8,
      max_steps=max_steps, summary_steps=0, use_fp16=use_fp16))
  return tf.train.latest_checkpoint(str(scratch_dir))


@pytest.fixture(scope='module')
def fp16_async_run(module_tasks, mnist_sample, tmp_path_factory):
  """1 ps + 2 async workers in fp16, from step 0 to FP16_STEPS."""
  train_dir = str(tmp_path_factory.mktemp('fp16_async'))
  logs = run_job(module_tasks, 1, 2, train_dir, '--use_fp16',
                           '--max_steps=%d' % FP16_STEPS, *mnist_flags(mnist_sample))
  return train_dir, logs


@pytest.fixture(scope='module')
def float32_after_fp16_run(module_tasks, mnist_sample, tmp_path_factory):
  """1 ps + 1 float32 worker, from an fp16 checkpoint of step FP16_STEPS, 2 steps more."""
  root = tmp_path_factory.mktemp('float32')
  fp16 = mnist_checkpoint(mnist_sample, root / 'fp16', FP16_STEPS, use_fp16=True)
  assert LOSS_SCALE_VARIABLES <= set(helpers.checkpoint(fp16))  # what the run must ignore
  train_dir = str(root / 'train')
  helpers.copy_checkpoint(fp16, train_dir)
  logs = run_job(module_tasks, 1, 1, train_dir, '--max_steps=%d' % (FP16_STEPS + 2),
                           *mnist_flags(mnist_sample))
  return train_dir, logs


@pytest.fixture(scope='module')
def fp16_sync_after_float32_run(module_tasks, mnist_sample, tmp_path_factory):
  """1 ps + 2 sync workers in fp16, from a float32 checkpoint of step FP16_STEPS + 2."""
  root = tmp_path_factory.mktemp('fp16_sync')
  float32 = mnist_checkpoint(mnist_sample, root / 'float32', FP16_STEPS + 2, use_fp16=False)
  train_dir = str(root / 'train')
  helpers.copy_checkpoint(float32, train_dir)
  logs = run_job(module_tasks, 1, 2, train_dir, '--use_fp16', '--sync_replicas',
                           '--max_steps=%d' % (FP16_STEPS + 12), *mnist_flags(mnist_sample))
  return train_dir, logs


def assert_float32_variables(checkpoint):
  """Weights and their moving averages float32; only the counters are integers."""
  assert {n for n, v in checkpoint.items() if v.dtype != np.float32} <= {
      'global_step', 'loss_scale/good_steps', 'loss_scale/skipped_steps'}
  assert any(n.endswith('/ExponentialMovingAverage') for n in checkpoint)


@pytest.mark.slow
def test_async_fp16_workers_skip_own_overflows_without_claiming_steps(fp16_async_run):
  train_dir, logs = fp16_async_run
  skips, local_steps = [], 0
  for worker in ('worker0', 'worker1'):
    skips += matches(SKIP_LINE, logs[worker])
    [done] = matches(DONE_LINE, logs[worker])
    assert int(done.group(3)) == FP16_STEPS
    local_steps += int(done.group(2))
  checkpoint = helpers.checkpoint(train_dir)
  assert LOSS_SCALE_VARIABLES <= set(checkpoint) and checkpoint['global_step'] == FP16_STEPS
  assert_float32_variables(checkpoint)
  # The first worker to overflow halves 32768; each skip halves from the scale its
  # own gradients were taken at (or keeps a lower one another worker set).
  assert ('32768', '16384') in [s.groups()[1:] for s in skips]
  assert all(float(s.group(3)) <= float(s.group(2)) / 2 for s in skips)
  # Every worker step either claimed one global step or skipped and claimed none,
  # and every skip was said by its worker.
  assert len(skips) == checkpoint['loss_scale/skipped_steps'] > 0
  assert local_steps == FP16_STEPS + len(skips)
  assert checkpoint['loss_scale/scale'] < 32768


@pytest.mark.slow
def test_fp16_checkpoint_resumed_by_float32_cluster_ignores_loss_scale(
    float32_after_fp16_run):
  train_dir, logs = float32_after_fp16_run
  assert matches(RESUMING_LINE, logs['worker0'])[0].group(2) == str(FP16_STEPS)
  assert re.search(r'^ps tasks \S+ hold 397510 trainable parameters$', '\n'.join(
      logs['worker0']), re.M)  # the book's network
  assert not [line for line in logs['worker0'] if 'float16' in line or 'skipped' in line]
  checkpoint = helpers.checkpoint(train_dir)
  assert checkpoint['global_step'] == FP16_STEPS + 2
  assert not LOSS_SCALE_VARIABLES & set(checkpoint)  # a float32 graph holds none
  assert_float32_variables(checkpoint)


@pytest.mark.slow
def test_sync_fp16_from_float32_checkpoint_chief_says_skips_global_step_waits(
    fp16_sync_after_float32_run):
  train_dir, logs = fp16_sync_after_float32_run
  start, end = FP16_STEPS + 2, FP16_STEPS + 12
  assert ('model.ckpt-%d holds no loss scale (a float32 run\'s): it starts at 32768' % start
          in '\n'.join(logs['worker0']))
  for worker in ('worker0', 'worker1'):
    assert int(matches(DONE_LINE, logs[worker])[0].group(3)) == end
  # The chief's queue runner skips; the chief says each skip, the others none.
  skips = [s.groups() for s in matches(SKIP_LINE, logs['worker0'])]
  assert not matches(SKIP_LINE, logs['worker1'])
  checkpoint = helpers.checkpoint(train_dir)
  assert len(skips) == checkpoint['loss_scale/skipped_steps'] > 0
  # The skipped updates left the global step where it was: the first ones all
  # name the next step. One halving per skip, from 32768.
  assert skips[0] == (str(start + 1), '32768', '16384')
  assert [float(s[1]) for s in skips] == [32768 / 2 ** i for i in range(len(skips))]
  assert checkpoint['loss_scale/scale'] == 32768 / 2 ** len(skips)
  assert checkpoint['global_step'] == end
  assert_float32_variables(checkpoint)


BF16_UNITS = helpers.bfloat16_units()


@pytest.mark.slow
@pytest.mark.skipif(not BF16_UNITS.ok, reason='--use_bf16 is refused here: %s' % BF16_UNITS.what)
def test_bf16_worker_says_bfloat16_towers_checkpoint_float32(tasks, tmp_path):
  logs = run_job(tasks, 1, 1, tmp_path, '--use_bf16', '--max_steps=5',
                           '--summary_steps=0', *STEADY_FLAGS)
  assert re.search(r'^bfloat16 towers on .+, float32 variables; LRN, softmax and loss in '
                   r'float32; no loss scale$', '\n'.join(logs['worker0']), re.M), logs
  assert int(matches(DONE_LINE, logs['worker0'])[0].group(3)) == 5
  checkpoint = helpers.checkpoint(tmp_path)
  assert checkpoint['global_step'] == 5 and not LOSS_SCALE_VARIABLES & set(checkpoint)
  assert_float32_variables(checkpoint)


@pytest.mark.parametrize('model_name', ['cifar10', 'mnist'])
def test_tower_reads_each_variable_from_the_ps_once_a_step(model_name):
  """A step's forward pass, weight decay and gradients share one read of each variable:
  under replica_device_setter every read consumed on the worker is one transfer of the
  whole variable from the ps (the decay's own read of local3's weights was 3.5 MB a step)."""
  model = {'cifar10': cifar10, 'mnist': mnist}[model_name]
  shape = [2, 24, 24, 3] if model_name == 'cifar10' else [2, 784]
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2']})
  with tf.Graph().as_default() as graph:
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device='/job:worker/task:0')):
      with tf.name_scope('tower_0') as scope:
        loss = multi_gpu_train.tower_loss(scope, tf.zeros(shape), tf.zeros([2], tf.int32),
                                          model=model)
      variables = tf.compat.v1.trainable_variables()
      tf.gradients(loss, variables)
  for var in variables:
    reads = [op.outputs[0] for op in graph.get_operations()
             if op.type == 'ReadVariableOp' and op.inputs[0] is var.handle]
    sent = [read for read in reads
            if any(c.device.startswith('/job:worker/') for c in read.consumers())]
    assert len(sent) == 1, (var.name, [(r.name, [c.name for c in r.consumers()]) for r in sent])


@pytest.mark.parametrize('num_ps, most', [(2, 0.55), (4, 0.30)])
def test_variables_split_and_dealt_to_the_ps_tasks_by_size_and_said_at_start_up(num_ps, most):
  """replica_device_setter's round robin put every weight of the model on ps 1 (4.27 of
  4.27 MB) and every bias on ps 0; dealt by size but whole, the task holding
  local3/weights held 83% of the bytes however many ran. Split, it holds its share."""
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:%d' % (i + 1) for i in range(num_ps)],
                                  'worker': ['127.0.0.1:9']})
  with tf.Graph().as_default():
    with tf.compat.v1.device(ps_placement.replica_devices(cluster, 0)):
      tf.compat.v1.train.get_or_create_global_step()
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       partitioner=ps_placement.partitioner(num_ps)), \
          tf.name_scope('tower_0') as scope:
        multi_gpu_train.tower_loss(scope, tf.zeros([2, 24, 24, 3]), tf.zeros([2], tf.int32))
    variables = tf.compat.v1.trainable_variables()
    said = ps_placement.bytes_by_ps_task(num_ps)
  held = [sum(var.shape.num_elements() * 4 for var in variables
              if var.device == '/job:ps/task:%d' % task) for task in range(num_ps)]
  assert sum(held) == 1068298 * 4 and max(held) <= most * sum(held), held
  assert said == ' (%s)' % ', '.join('ps%d %.2f MB' % (task, size / 1e6)
                                     for task, size in enumerate(held))
  parts = [var for var in variables if var.op.name.startswith('local3/weights/part_')]
  assert len(parts) == num_ps and len({var.device for var in parts}) == num_ps, parts


def test_one_ps_task_leaves_the_variables_whole():
  assert ps_placement.partitioner(1) is None and ps_placement.bytes_by_ps_task(1) == ''


@pytest.mark.slow
def test_checkpoint_of_split_variables_is_the_models_whatever_reads_it(tasks, sample,
                                                                      tmp_path):
  """Saved by 2 ps tasks, each split variable is one tensor under its own name: a job
  of 4 ps tasks resumes from it, and so do multi_gpu_train.py and cifar10_eval.py."""
  train_dir = tmp_path / 'train'
  run_job(tasks, 2, 1, train_dir, *sample.flags, '--max_steps=2', '--summary_steps=0')
  saved = helpers.checkpoint(train_dir)
  assert saved['local3/weights'].shape == (2304, 384) and not [
      name for name in saved if 'part_' in name], sorted(saved)
  logs = run_job(tasks, 4, 1, train_dir, *sample.flags, '--max_steps=4', '--summary_steps=0')
  assert [m.groups() for m in matches(RESUMING_LINE, logs['worker0'])] == [('2', '2')], logs
  resumed = helpers.run(['multi_gpu_train.py', '--train_dir=%s' % train_dir, '--max_steps=5',
                         '--batch_size=8', '--summary_steps=0'] + sample.flags)
  assert resumed.code == 0 and [m.groups() for m in matches(
      RESUMING_LINE, resumed.out.splitlines())] == [('4', '4')], resumed.log()
  scored = helpers.run(['cifar10_eval.py', '--run_once', '--checkpoint_dir=%s' % train_dir,
                        '--eval_dir=%s' % (tmp_path / 'eval')] + sample.flags)
  assert scored.code == 0 and matches(helpers.PRECISION_LINE, scored.out.splitlines()), (
      scored.log())


def test_moving_averages_computed_on_the_ps_task_of_their_variable():
  """Under replica_device_setter each average's arithmetic sits beside its variable;
  on the worker it would pull every variable and its average over the network and push
  the new average back, each step (updates.then_average)."""
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1', '127.0.0.1:2'],
                                  'worker': ['127.0.0.1:3']})
  with tf.Graph().as_default() as graph:
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device='/job:worker/task:0')):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      cifar10.inference(tf.zeros([1, 24, 24, 3]))
      ema = updates.moving_averages(global_step, cifar10)
      before = len(graph.get_operations())
      updates.then_average(tf.no_op(), ema)
    # NoOps group; a resource's reads carry no device, the placer puts them by it.
    made = [op for op in graph.get_operations()[before:]
            if op.type != 'NoOp' and not (op.type == 'ReadVariableOp' and not op.device)]
    variables = {v.device for v in tf.compat.v1.trainable_variables()}
  assert variables == {'/job:ps/task:0', '/job:ps/task:1'}
  assert made and all(op.device.startswith('/job:ps/') for op in made), sorted(
      (op.name, op.device) for op in made if not op.device.startswith('/job:ps/'))[:5]
  assign_subs = [op for op in made if op.type in ('AssignSub', 'AssignSubVariableOp')]
  assert len(assign_subs) == 10  # one per variable, on its average's task
  assert {op.device for op in assign_subs} == variables
  assert all(op.device == op.inputs[0].op.device for op in assign_subs)


def test_chief_run_record_says_a_constant_is_overridden_by_the_flag_given(tmp_path,
                                                                         monkeypatch):
  # As multi_gpu_train.py's record: an edited BATCH_SIZE with --batch_size given. The
  # training knobs are multi_gpu_train.py's, recorded there; dist_train.py's own beside.
  cluster = tf.compat.v1.train.ClusterSpec({'ps': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2']})
  run = dist_train.WorkerRun('worker 0', cluster, 0, True, 1, ['127.0.0.1:1'], '127.0.0.1:2',
                             None, None, ['/cpu:0'], '', None, 0, None)
  settings = helpers.trainer_settings(str(tmp_path), '', synthetic=True, batch_size=32)

  def record():
    return chief.record(run, settings, data_sets.DATASETS['cifar10'], {'batch_size': 32},
                        dist_train, multi_gpu_train, ['batch_size'])
  first = record()
  assert 'BATCH_SIZE' not in first['constants']['dist_train.py']
  assert first['constants']['dist_train.py']['STEP_TIMEOUT_SECS'] == dist_train.STEP_TIMEOUT_SECS
  run_record.write_run_record(str(tmp_path), first)
  monkeypatch.setattr(multi_gpu_train, 'BATCH_SIZE', 16)
  changed = run_record.changes_since(str(tmp_path), record())
  assert changed.endswith(': BATCH_SIZE 128 -> 16 (multi_gpu_train.py), overridden by '
                          '--batch_size=32'), changed
