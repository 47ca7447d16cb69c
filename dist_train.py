"""Trains the CIFAR-10 model on several machines with TensorFlow's parameter servers.

    # One machine: 1 ps task and 2 workers as subprocesses on 127.0.0.1.
    python dist_train.py --local_cluster=1,2 --max_steps=10000

    # Several machines: one command per task, the same host lists everywhere.
    python dist_train.py --job_name=ps --task_index=0 \
        --ps_hosts=10.0.0.1:2222 --worker_hosts=10.0.0.2:2222,10.0.0.3:2222 \
        --allow_nonloopback_hosts
    python dist_train.py --job_name=worker --task_index=0 ...   # the chief
    python dist_train.py --job_name=worker --task_index=1 ...

ps tasks hold the variables and serve them until they are stopped. Each worker
builds multi_gpu_train.py's graph: --num_gpus towers whose gradients are averaged
on the worker, so one gradient per worker step leaves the machine.
- Async (default): each worker applies its own gradient as soon as it is ready.
  The global step counts these updates; exactly --max_steps of them are applied.
- Sync (--sync_replicas): SyncReplicasOptimizer averages --replicas_to_aggregate
  gradients (default: one per worker) and applies them once; the global step
  counts these averaged updates, and gradients computed on variables that have
  changed since are dropped. Fewer than the number of workers leaves the others
  as backup workers, so an update does not wait for the slowest one.
Worker 0, the chief, initialises or restores the variables and writes
checkpoints and summaries to --train_dir; the other workers only train.

SECURITY: TensorFlow servers have no authentication and no encryption. Anyone
who can reach a ps or worker port can run any graph there, reading and writing
files as the user running it. Hosts other than loopback are refused unless
--allow_nonloopback_hosts is passed; pass it only on a network you trust.

Per worker step, expect multi_gpu_train.py's time per step plus the time to send
the 1,068,298 parameters and their gradients (4 MB each way) to the ps tasks.
"""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # TensorFlow's INFO lines off the loss lines

import datetime
import ipaddress
import socket
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import cifar10
import cifar10_input
import training_run
import multi_gpu_train  # the graph, the session config and the flags both scripts share

# ---- Cluster knobs: edit, save, rerun -------------------------------------------
STARTUP_TIMEOUT_SECS = 120   # a worker waits this long for its ps tasks, then for the chief
STEP_TIMEOUT_SECS = 300      # one step may take this long (sync: waiting for the update too)
WATCHDOG_SLACK_SECS = 30     # past a deadline above, a task stuck inside TensorFlow exits
QUEUE_RUNNER_STOP_SECS = 2   # sync chief: its queue runner waits in take_grad for gradients
                             # that never come; closing the session, after this, ends it
CLOSE_TIMEOUT_SECS = 30      # closing the session at the end may take this long
STOP_TASKS_SECS = 5          # --local_cluster: SIGTERM to SIGKILL for tasks still running

SECURITY_WARNING = (
    'WARNING: TensorFlow servers have no authentication and no encryption: anyone '
    'who can reach a ps or worker port can run any graph there, reading and writing '
    'files as this user. Keep the ports on loopback or on a network you trust.')

FLAGS = flags.FLAGS
# From multi_gpu_train, meaning the same per worker: --num_gpus, --batch_size,
# --max_steps, --train_dir, --data_dir, --data_url, --data_md5, --log_frequency,
# --save_every_n_steps, --summary_steps, --synthetic and the session options.
flags.DEFINE_enum('job_name', None, ['ps', 'worker'], 'This task\'s job.')
flags.DEFINE_integer('task_index', 0, 'This task\'s index in its job; worker 0 is the chief.')
flags.DEFINE_string('ps_hosts', '', 'Comma-separated host:port of the ps tasks.')
flags.DEFINE_string('worker_hosts', '', 'Comma-separated host:port of the workers.')
flags.DEFINE_boolean('sync_replicas', False, 'Average the workers\' gradients before '
                     'each update (SyncReplicasOptimizer) instead of applying each.')
flags.DEFINE_integer('replicas_to_aggregate', None, 'Sync: gradients averaged per update; '
                     'default: the number of workers. Fewer leaves backup workers.')
flags.DEFINE_integer('startup_timeout_secs', STARTUP_TIMEOUT_SECS, 'Seconds a worker '
                     'waits for the ps tasks to answer and for the chief to initialise.')
flags.DEFINE_integer('step_timeout_secs', STEP_TIMEOUT_SECS, 'Seconds one step may take '
                     '(sync: including the wait for the averaged update).')
flags.DEFINE_boolean('allow_nonloopback_hosts', False, 'Accept hosts other than loopback '
                     '(127.0.0.1, localhost). The servers have no authentication: use only '
                     'on a network where everyone who can reach the ports is trusted.')
flags.DEFINE_string('local_cluster', '', 'P,W: start P ps tasks and W workers on 127.0.0.1 '
                    'with free ports, print their logs, and stop them all at the end.')

# multi_gpu_train flags that mean nothing here, and why.
REFUSED_FLAGS = {
    'fresh': 'the chief restores whatever --train_dir holds; to start from step 0, '
             'point --train_dir at an empty directory',
    'async_towers': 'the towers of a worker are averaged before its gradient leaves it; '
                    'workers are asynchronous by default (without --sync_replicas)',
}
LAUNCHER_FLAGS = ['local_cluster', 'job_name', 'task_index', 'ps_hosts', 'worker_hosts']


class TrainingError(Exception):
  """The run cannot go on; the message says why and what to do."""


def parse_hosts(flag_name, value):
  """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'], refusing empty entries, bad ports, repeats."""
  hosts = [h.strip() for h in value.split(',')] if value else []
  if not hosts:
    raise ValueError('--%s is empty; give comma-separated host:port entries, e.g. '
                     '--%s=127.0.0.1:2222' % (flag_name, flag_name))
  for host in hosts:
    name, _, port = host.rpartition(':')
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError('--%s entry %r is not host:port with a port 1..65535'
                       % (flag_name, host))
  if len(set(hosts)) != len(hosts):
    raise ValueError('--%s names the same host:port twice: %s' % (flag_name, value))
  return hosts


def is_loopback(host):
  """True for 'localhost:p', '127.x.y.z:p' and '[::1]:p'; a DNS name could be anywhere."""
  name = host.rpartition(':')[0].strip('[]')
  if name == 'localhost':
    return True
  try:
    return ipaddress.ip_address(name).is_loopback
  except ValueError:
    return False


def check_loopback(ps_hosts, worker_hosts):
  """Raises ValueError naming the first host that is not loopback, and why it matters."""
  for flag_name, hosts in (('ps_hosts', ps_hosts), ('worker_hosts', worker_hosts)):
    for host in hosts:
      if not is_loopback(host):
        raise ValueError(
            '--%s names %s, which is not a loopback address. TensorFlow servers have no '
            'authentication: anyone who can reach that port can run any code there as '
            'this user. If every machine that can reach these ports is trusted (a '
            'private cluster network, an SSH tunnel), pass --allow_nonloopback_hosts.'
            % (flag_name, host))


def wait_for_ps(ps_hosts, timeout_secs, who):
  """Returns once every ps port accepts TCP connections; TrainingError after timeout_secs.

  TensorFlow itself would wait forever, silently, to open a session on a ps task
  that is not there.
  """
  deadline = time.time() + timeout_secs
  missing = list(ps_hosts)
  while True:
    for host in list(missing):
      name, _, port = host.rpartition(':')
      try:
        socket.create_connection((name.strip('[]'), int(port)), timeout=1).close()
        missing.remove(host)
      except OSError:
        pass
    if not missing:
      return
    if time.time() > deadline:
      raise TrainingError(
          '%s waited %d s for the ps task(s) at %s: nothing accepts connections there. '
          'Start them first (python dist_train.py --job_name=ps --task_index=i with the '
          'same --ps_hosts and --worker_hosts), check --ps_hosts, or raise '
          '--startup_timeout_secs.' % (who, timeout_secs, ', '.join(missing)))
    time.sleep(0.5)


def wait_for_chief(target, config, not_ready, timeout_secs, who, chief_host):
  """Non-chief: returns once the chief has initialised or restored the variables.

  MonitoredTrainingSession waits for that too, but looks only every 30 s.
  """
  print('%s: waiting for the chief (worker 0 at %s) to initialise the variables'
        % (who, chief_host), flush=True)
  message = ('%s waited %d s for the chief (worker 0 at %s) to initialise or restore the '
             'variables on the ps tasks. Start worker 0, look at its log for an error, or '
             'raise --startup_timeout_secs.' % (who, timeout_secs, chief_host))
  deadline = time.time() + timeout_secs
  options = tf.compat.v1.RunOptions(timeout_in_ms=timeout_secs * 1000)
  with tf.compat.v1.Session(target, config=config) as probe:
    try:
      while probe.run(not_ready, options=options).size:
        if time.time() > deadline:
          raise TrainingError(message)
        time.sleep(0.5)
    except tf.errors.DeadlineExceededError as e:
      raise TrainingError(message) from e


def start_watchdog():
  """Exits the process when a wait outlives its deadline; returns arm(secs, message).

  The backstop for the waits TensorFlow cannot time out itself: opening a session
  on a task that has gone away, and MonitoredSession reopening one after a ps
  task failed. arm(None, '') disarms.
  """
  state = {'deadline': None, 'message': ''}

  def watch():
    while True:
      time.sleep(1)
      deadline, message = state['deadline'], state['message']
      if deadline and time.time() > deadline:
        print('error: %s' % message, file=sys.stderr, flush=True)
        os._exit(1)  # the main thread is stuck inside TensorFlow: no clean way out

  threading.Thread(target=watch, daemon=True).start()

  def arm(secs, message):
    state.update(deadline=time.time() + secs if secs else None, message=message)
  return arm


class ClaimedUpdates:
  """Async: an optimizer whose every update first claims its global step.

  Async workers apply their updates independently. Stopping "once the global step
  reaches max_steps" would let every worker that is mid-step land one more update.
  Here each update first takes the next global step with count_up_to, atomically
  on the ps; the claim past max_steps fails with OutOfRangeError, which ends that
  worker's loop. Exactly max_steps updates land, whichever workers make them, and
  a restored checkpoint's global step is where the counting resumes.
  """

  def __init__(self, opt, max_steps):
    self._opt, self._max_steps = opt, max_steps

  def compute_gradients(self, *args, **kwargs):
    return self._opt.compute_gradients(*args, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    # The claim waits for the gradients: taken earlier, the global step would
    # count an update still being computed.
    with tf.control_dependencies([g for g, _ in grads_and_vars]), \
        tf.compat.v1.colocate_with(global_step):
      claim = tf.compat.v1.count_up_to(global_step, self._max_steps)
    with tf.control_dependencies([claim]):
      return self._opt.apply_gradients(grads_and_vars, name=name)  # counted by the claim


class SyncReplicasWithAverages(tf.compat.v1.train.SyncReplicasOptimizer):
  """SyncReplicasOptimizer fitted to build_train_graph(): placement and moving averages.

  Placement: SyncReplicasOptimizer puts its token queue and gradient accumulators
  beside global_step (on the ps) with tf.device() scopes of its own, and leaves
  its per-worker local step unplaced. Under build_train_graph()'s device
  functions replica_device_setter would put that local step on the ps too, one
  variable shared by every worker. apply_gradients() builds under this worker's
  device alone, where the optimizer's own scopes still put the queue on the ps.

  Moving averages: build_train_graph() runs ema.apply() after apply_gradients()
  in its train op. Under SyncReplicasOptimizer that op only pushes this worker's
  gradient and waits for a token, so every worker would step the averages once
  per token: total_num_replicas times per global step, racing each other. They
  belong where the averaged update lands, on the chief's queue runner, right after
  each update: what SyncReplicasOptimizer's variable_averages argument does. That
  argument needs the ExponentialMovingAverage at construction, which
  build_train_graph() creates later, so average_after_updates() wires the same
  thing once the graph exists, and workers run build_train_graph's apply_ops.
  """

  def __init__(self, opt, replicas_to_aggregate, total_num_replicas, worker_device):
    super().__init__(opt, replicas_to_aggregate=replicas_to_aggregate,
                     total_num_replicas=total_num_replicas)
    self._worker_device = worker_device
    self._runner = None

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    # device(None) drops the enclosing device functions; the ops given no device
    # of their own (the local step) stay on this worker.
    with tf.compat.v1.device(None), tf.compat.v1.device(self._worker_device):
      train_op = super().apply_gradients(grads_and_vars, global_step, name)
    self._runner = super().get_chief_queue_runner()
    return train_op

  def average_after_updates(self, ema, variables):
    """Makes the chief's queue runner step `ema` over `variables` after each update."""
    runner = super().get_chief_queue_runner()
    with tf.control_dependencies(runner.enqueue_ops):
      update_averages = ema.apply(variables)  # the shadow variables already exist
    # Closing the session at the end cancels the update that waits for gradients.
    self._runner = tf.compat.v1.train.QueueRunner(
        runner.queue, [update_averages],
        queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))

  def get_chief_queue_runner(self):
    return self._runner


class PrintSaves(tf.compat.v1.train.CheckpointSaverListener):
  """Prints each checkpoint's path, as multi_gpu_train.py does."""

  def __init__(self, train_dir):
    self._prefix = os.path.join(train_dir, training_run.CHECKPOINT_PREFIX)

  def after_save(self, session, global_step_value):
    print('Saved checkpoint %s-%d' % (self._prefix, global_step_value), flush=True)


def run_ps(cluster, task_index):
  """Serves this ps task's share of the variables until the process is stopped."""
  try:
    server = tf.compat.v1.train.Server(cluster, job_name='ps', task_index=task_index)
  except tf.errors.OpError as e:
    raise TrainingError('ps task %d cannot listen on %s: %s. Is the port in use?'
                        % (task_index, cluster.task_address('ps', task_index),
                           str(e).splitlines()[0])) from e
  print('ps task %d serving at %s; it runs until stopped (Ctrl-C)'
        % (task_index, server.target), flush=True)
  # Not server.join(): that waits inside TensorFlow, where Ctrl-C never arrives.
  try:
    while True:
      time.sleep(3600)
  except KeyboardInterrupt:
    print('ps task %d stopped' % task_index)


def train(cluster, task_index, train_dir, data_dir, num_gpus, batch_size, max_steps,
          sync_replicas=False, replicas_to_aggregate=None,
          log_frequency=multi_gpu_train.LOG_FREQUENCY,
          summary_steps=multi_gpu_train.SUMMARY_STEPS,
          save_every_n_steps=multi_gpu_train.SAVE_EVERY_N_STEPS,
          startup_timeout_secs=STARTUP_TIMEOUT_SECS, step_timeout_secs=STEP_TIMEOUT_SECS,
          synthetic=False, data_url=None, data_md5=None, config_options=None):
  """Runs worker `task_index` until global step max_steps; worker 0 is the chief."""
  num_workers = cluster.num_tasks('worker')
  is_chief = task_index == 0
  who = 'worker %d' % task_index
  ps_hosts = ','.join(cluster.job_tasks('ps'))
  chief_host = cluster.task_address('worker', 0)
  replicas_to_aggregate = replicas_to_aggregate or num_workers
  if is_chief:  # a checkpoint that cannot be read stops the run here, with the fix
    os.makedirs(train_dir, exist_ok=True)
    checkpoint, start_step = training_run.checkpoint_to_resume(train_dir)[:2]
  if not synthetic:
    cifar10_input.maybe_download_and_extract(data_dir, data_url, data_md5)
  devices, num_cpu_devices, where = multi_gpu_train.tower_devices(num_gpus)
  config = multi_gpu_train.session_config(num_cpu_devices, **(config_options or {}))
  # Only the ps tasks and this worker: no worker waits for another to start.
  config.device_filters.extend(['/job:ps', '/job:worker/task:%d' % task_index])
  try:
    server = tf.compat.v1.train.Server(cluster, job_name='worker', task_index=task_index,
                                       config=config)
  except tf.errors.OpError as e:
    raise TrainingError('%s cannot listen on %s: %s. Is the port in use?'
                        % (who, cluster.task_address('worker', task_index),
                           str(e).splitlines()[0])) from e
  arm_watchdog = start_watchdog()
  wait_for_ps(cluster.job_tasks('ps'), startup_timeout_secs, who)

  with tf.Graph().as_default():
    worker_device = '/job:worker/task:%d' % task_index
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device=worker_device)):
      with tf.device('/cpu:0'):
        if synthetic:
          dataset = cifar10_input.synthetic_dataset(batch_size)
        else:
          dataset = cifar10_input.distorted_dataset(data_dir, batch_size)
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)

      def wrap(opt):
        if sync_replicas:
          return SyncReplicasWithAverages(opt, replicas_to_aggregate, num_workers,
                                          worker_device)
        return ClaimedUpdates(opt, max_steps)

      # variables_device '': replica_device_setter puts the variables on the ps tasks.
      graph = multi_gpu_train.build_train_graph(
          iterator.get_next, devices, batch_size, async_towers=False,
          summaries=summary_steps > 0, variables_device='', wrap_optimizer=wrap)
      global_step, loss, opt = graph['global_step'], graph['loss'], graph['optimizer']
      hooks = [tf.compat.v1.train.StopAtStepHook(last_step=max_steps)]
      if sync_replicas:
        opt.average_after_updates(graph['ema'], tf.compat.v1.trainable_variables())
        train_op = graph['apply_ops'][0]  # push the gradient, wait for the update
        hooks.append(opt.make_session_run_hook(is_chief))
        # At the end the chief hands out one token per worker: a worker waiting for
        # an update that will never come gets it, sees the last step and stops.
        release_workers = opt.get_init_tokens_op(num_workers) if is_chief else None
      else:
        train_op = graph['train_ops'][0]  # the update, then the moving averages
      with tf.control_dependencies([train_op]):
        step_after = tf.identity(global_step.read_value())  # this worker's update included
      if not is_chief:
        not_ready = tf.compat.v1.report_uninitialized_variables(
            tf.compat.v1.global_variables())
      # Not sharded: the chief writes every file, so only it needs --train_dir.
      scaffold = tf.compat.v1.train.Scaffold(
          saver=training_run.make_saver(multi_gpu_train.KEEP_CHECKPOINTS),
          summary_op=graph['summary_op'])
      checkpoint_hook = tf.compat.v1.train.CheckpointSaverHook(
          train_dir, save_steps=save_every_n_steps, scaffold=scaffold,
          checkpoint_basename=training_run.CHECKPOINT_PREFIX,
          listeners=[PrintSaves(train_dir)])
    num_params = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())

    print('TensorFlow %s; %s of %d (worker 0 is the chief); %s' % (
        tf.__version__, who, num_workers, where))
    print('ps tasks %s hold %d trainable parameters' % (ps_hosts, num_params))
    if sync_replicas:
      print('sync: each update averages %d gradients of %d images (%d x %d towers) from '
            '%d workers, %d of them backup' % (
                replicas_to_aggregate, batch_size * num_gpus, batch_size, num_gpus,
                num_workers, max(num_workers - replicas_to_aggregate, 0)))
    else:
      print('async: each of %d workers applies its own updates of %d images (%d x %d '
            'towers)' % (num_workers, batch_size * num_gpus, batch_size, num_gpus))
    print('decay_steps %d = %d examples / %d per worker step x %g epochs; input: %s' % (
        graph['decay_steps'], cifar10.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
        graph['examples_per_update'], cifar10.NUM_EPOCHS_PER_DECAY,
        'synthetic' if synthetic else data_dir))
    if is_chief:
      print('Resuming from %s at step %d' % (checkpoint, start_step) if checkpoint else
            'Starting from step 0 in %s' % train_dir, flush=True)
    else:
      wait_for_chief(server.target, config, not_ready, startup_timeout_secs, who,
                     chief_host)

    arm_watchdog(startup_timeout_secs + WATCHDOG_SLACK_SECS,
                 '%s could not open a session with the ps tasks %s within %d s. Check that '
                 'they are running and reachable, or raise --startup_timeout_secs.'
                 % (who, ps_hosts, startup_timeout_secs + WATCHDOG_SLACK_SECS))
    run_options = tf.compat.v1.RunOptions(timeout_in_ms=step_timeout_secs * 1000)
    try:
      session = tf.compat.v1.train.MonitoredTrainingSession(
          master=server.target, is_chief=is_chief,
          checkpoint_dir=train_dir if is_chief else None, scaffold=scaffold, hooks=hooks,
          chief_only_hooks=[checkpoint_hook], save_checkpoint_steps=None,
          save_checkpoint_secs=None, save_summaries_steps=summary_steps or None,
          save_summaries_secs=None, log_step_count_steps=0, config=config,
          max_wait_secs=startup_timeout_secs, stop_grace_period_secs=QUEUE_RUNNER_STOP_SECS)
    except tf.errors.DeadlineExceededError as e:  # a non-chief's wait for the chief
      raise TrainingError('%s: the session was not ready within --startup_timeout_secs=%d: '
                          'the chief (worker 0 at %s) has not initialised the variables. '
                          'Look at its log, or raise --startup_timeout_secs.'
                          % (who, startup_timeout_secs, chief_host)) from e
    local_step = 0
    with session as sess:
      step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
      print('%s: training from global step %d' % (who, step), flush=True)
      if step >= max_steps:
        print('%s: global step %d is not below --max_steps=%d: nothing to do. Raise '
              '--max_steps to train further.' % (who, step, max_steps))
      while step < max_steps and not sess.should_stop():
        arm_watchdog(step_timeout_secs + WATCHDOG_SLACK_SECS,
                     '%s: a step has not returned in %d s and TensorFlow did not time it '
                     'out: the ps tasks %s%s stopped answering. Restart them, or raise '
                     '--step_timeout_secs.' % (who, step_timeout_secs + WATCHDOG_SLACK_SECS,
                                               ps_hosts, ' or the chief' if sync_replicas
                                               else ''))
        start_time = time.time()
        try:
          _, loss_value, step = sess.run([train_op, loss, step_after], options=run_options)
        except tf.errors.OutOfRangeError:
          break  # async: the other workers have claimed the last updates
        except tf.errors.DeadlineExceededError as e:
          if sync_replicas:
            raise TrainingError(
                '%s: no averaged update within --step_timeout_secs=%d. Each update waits '
                'for %d gradients and for the chief (worker 0 at %s) to apply them: check '
                'that the chief is running and that workers are sending gradients, or '
                'raise --step_timeout_secs.' % (who, step_timeout_secs,
                                                replicas_to_aggregate, chief_host)) from e
          raise TrainingError(
              '%s: a step took more than --step_timeout_secs=%d waiting for the ps tasks '
              '%s. Check that they are running, or raise --step_timeout_secs.'
              % (who, step_timeout_secs, ps_hosts)) from e
        duration = time.time() - start_time
        local_step += 1

        if not np.isfinite(loss_value):
          raise TrainingError(
              'loss is %s at step %d on %s: the model diverged. Lower '
              'INITIAL_LEARNING_RATE (cifar10/model.py) or --batch_size; the chief\'s last '
              'checkpoint is untouched.' % (loss_value, step, who))
        if local_step % log_frequency == 0 or local_step == 1:
          examples_per_sec = batch_size * num_gpus / duration
          sec_per_batch = duration / num_gpus
          print('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch) '
                '[worker %d, local step %d]' % (
                    datetime.datetime.now(), step, loss_value, examples_per_sec,
                    sec_per_batch, task_index, local_step))
          sys.stdout.flush()
      # The hooks may have stopped the loop on an update another worker waited for.
      step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
      if sync_replicas and is_chief:
        sess.run_step_fn(lambda step_context: step_context.session.run(release_workers))
      arm_watchdog(CLOSE_TIMEOUT_SECS + WATCHDOG_SLACK_SECS,
                   '%s: closing the session hung after the last step (%d)' % (who, step))
    arm_watchdog(None, '')
    print('%s done: %d local steps, global step %d' % (who, local_step, step), flush=True)


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1, found by binding port 0."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def task_command(job_name, task_index, ps_hosts, worker_hosts, extra_flags=()):
  """The argv that starts one task of the cluster with this script."""
  return [sys.executable, '-u', os.path.abspath(__file__), '--job_name=%s' % job_name,
          '--task_index=%d' % task_index, '--ps_hosts=%s' % ','.join(ps_hosts),
          '--worker_hosts=%s' % ','.join(worker_hosts)] + list(extra_flags)


def launch_local_cluster(num_ps, num_workers, extra_flags):
  """Runs num_ps ps tasks and num_workers workers on 127.0.0.1, printing their logs.

  Returns 0 once every worker has exited 0, 1 as soon as any task fails. The tasks
  still running are then stopped; the ps tasks always are, as they never exit.
  """
  ports = free_ports(num_ps + num_workers)
  ps_hosts = ['127.0.0.1:%d' % p for p in ports[:num_ps]]
  worker_hosts = ['127.0.0.1:%d' % p for p in ports[num_ps:]]
  print('local cluster: ps %s, workers %s' % (','.join(ps_hosts), ','.join(worker_hosts)),
        flush=True)
  print_lock = threading.Lock()

  def relay(name, stream):
    for line in stream:
      with print_lock:
        sys.stdout.write('[%s] %s' % (name, line))
        sys.stdout.flush()

  tasks, readers = {}, []  # tasks: 'ps0' -> Popen, in start order
  try:
    for job_name, hosts in (('ps', ps_hosts), ('worker', worker_hosts)):
      for i in range(len(hosts)):
        name = '%s%d' % (job_name, i)
        tasks[name] = subprocess.Popen(
            task_command(job_name, i, ps_hosts, worker_hosts, extra_flags),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        readers.append(threading.Thread(target=relay, args=(name, tasks[name].stdout),
                                        daemon=True))
        readers[-1].start()
    while True:
      ended = {name: p.returncode for name, p in tasks.items() if p.poll() is not None}
      failed = [name for name, code in ended.items()
                if code != 0 or name.startswith('ps')]
      if failed:
        print('local cluster: %s exited with %d; stopping the other tasks'
              % (failed[0], ended[failed[0]]), flush=True)
        return 1
      if len(ended) == num_workers:
        print('local cluster: all %d workers finished; stopping the ps tasks' % num_workers,
              flush=True)
        return 0
      time.sleep(0.2)
  finally:
    for process in tasks.values():
      if process.poll() is None:
        process.terminate()
    deadline = time.time() + STOP_TASKS_SECS
    for process in tasks.values():
      try:
        process.wait(max(deadline - time.time(), 0.1))
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for reader in readers:
      reader.join(STOP_TASKS_SECS)


def main(argv):
  del argv  # absl has already refused unknown flags
  for name, why in REFUSED_FLAGS.items():
    if FLAGS[name].present:
      sys.exit('error: --%s is a multi_gpu_train.py flag that dist_train.py does not '
               'take: %s.' % (name, why))
  multi_gpu_train.check_flags(also_positive=('startup_timeout_secs', 'step_timeout_secs'))
  if FLAGS.replicas_to_aggregate is not None:
    if not FLAGS.sync_replicas:
      sys.exit('error: --replicas_to_aggregate=%d needs --sync_replicas: async workers '
               'apply their gradients one by one' % FLAGS.replicas_to_aggregate)
    if FLAGS.replicas_to_aggregate < 1:
      sys.exit('error: --replicas_to_aggregate must be at least 1, got %d'
               % FLAGS.replicas_to_aggregate)
  print(SECURITY_WARNING, flush=True)

  if FLAGS.local_cluster:
    for name in LAUNCHER_FLAGS[1:]:
      if FLAGS[name].present:
        sys.exit('error: --local_cluster starts every task itself on 127.0.0.1; drop --%s'
                 % name)
    try:
      num_ps, num_workers = [int(n) for n in FLAGS.local_cluster.split(',')]
    except ValueError:
      num_ps = num_workers = 0
    if num_ps < 1 or num_workers < 1:
      sys.exit('error: --local_cluster takes P,W with at least 1 ps task and 1 worker, '
               'e.g. --local_cluster=1,2; got %r' % FLAGS.local_cluster)
    if not FLAGS.synthetic:
      try:  # once, here, rather than racing in every worker
        cifar10_input.maybe_download_and_extract(FLAGS.data_dir, FLAGS.data_url,
                                                 FLAGS.data_md5)
      except cifar10_input.DataError as e:
        sys.exit('error: %s' % e)
    passed = {}  # every flag given on this command line goes to every task
    for name in FLAGS:
      flag = FLAGS[name]
      if flag.present and flag.name not in LAUNCHER_FLAGS:
        passed[flag.name] = flag.serialize()
    sys.exit(launch_local_cluster(num_ps, num_workers, list(passed.values())))

  if FLAGS.job_name is None:
    sys.exit('error: give --job_name=ps or --job_name=worker with --task_index, '
             '--ps_hosts and --worker_hosts, or --local_cluster=P,W for one machine')
  try:
    ps_hosts = parse_hosts('ps_hosts', FLAGS.ps_hosts)
    worker_hosts = parse_hosts('worker_hosts', FLAGS.worker_hosts)
    if not FLAGS.allow_nonloopback_hosts:
      check_loopback(ps_hosts, worker_hosts)
  except ValueError as e:
    sys.exit('error: %s' % e)
  hosts = ps_hosts if FLAGS.job_name == 'ps' else worker_hosts
  if not 0 <= FLAGS.task_index < len(hosts):
    sys.exit('error: --task_index=%d is not a %s task: --%s_hosts lists %d (0..%d)'
             % (FLAGS.task_index, FLAGS.job_name, FLAGS.job_name, len(hosts),
                len(hosts) - 1))
  cluster = tf.compat.v1.train.ClusterSpec({'ps': ps_hosts, 'worker': worker_hosts})
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # MonitoredSession's INFO
  try:
    if FLAGS.job_name == 'ps':
      run_ps(cluster, FLAGS.task_index)
      return
    train(cluster, FLAGS.task_index, FLAGS.train_dir, FLAGS.data_dir, FLAGS.num_gpus,
          FLAGS.batch_size, FLAGS.max_steps, sync_replicas=FLAGS.sync_replicas,
          replicas_to_aggregate=FLAGS.replicas_to_aggregate,
          log_frequency=FLAGS.log_frequency, summary_steps=FLAGS.summary_steps,
          save_every_n_steps=FLAGS.save_every_n_steps,
          startup_timeout_secs=FLAGS.startup_timeout_secs,
          step_timeout_secs=FLAGS.step_timeout_secs, synthetic=FLAGS.synthetic,
          data_url=FLAGS.data_url, data_md5=FLAGS.data_md5,
          config_options=dict(log_device_placement=FLAGS.log_device_placement,
                              allow_growth=FLAGS.allow_growth,
                              gpu_memory_fraction=FLAGS.gpu_memory_fraction,
                              intra_op_threads=FLAGS.intra_op_threads,
                              inter_op_threads=FLAGS.inter_op_threads))
  except (TrainingError, multi_gpu_train.TrainingError, cifar10_input.DataError) as e:
    sys.exit('error: %s' % e)


if __name__ == '__main__':
  app.run(main)
