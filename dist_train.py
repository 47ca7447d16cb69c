r"""Trains the CIFAR-10 model on several machines with TensorFlow's parameter servers.

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

SECURITY: TensorFlow servers have no authentication and no encryption, and each
task listens on every network interface of its machine on its port, whatever
host --ps_hosts and --worker_hosts name. Anyone who can reach such a port can
run any graph there, reading and writing files as the user running it: firewall
those ports. Hosts other than loopback are refused unless
--allow_nonloopback_hosts is passed. --local_cluster runs its tasks in a private
network namespace with only a loopback interface, where Linux permits it.

Per worker step, expect multi_gpu_train.py's time per step plus the time to send
the 1,068,298 parameters and their gradients (4 MB each way) to the ps tasks.
"""
import os
import sys

import onednn

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's errors only; no INFO, WARNING
if __name__ == '__main__':  # a program, not a module imported by another (tests)
  onednn.choose(sys.argv)  # before TensorFlow is imported: --onednn, the default, the env

import collections
import contextlib
import datetime
import ipaddress
import socket
import threading
import time
import typing

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import local_cluster
import mixed_precision
import multi_gpu_train  # the towers, the average, the schedule and the flags both share
import placement
import training_run

# ---- Cluster knobs: edit, save, rerun -------------------------------------------
STARTUP_TIMEOUT_SECS = 120   # a worker waits this long for its ps tasks, then for the chief
STEP_TIMEOUT_SECS = 300      # one step may take this long (sync: waiting for the update too)
WATCHDOG_SLACK_SECS = 30     # past a deadline above, a task stuck inside TensorFlow exits
QUEUE_RUNNER_STOP_SECS = 2   # sync chief: its queue runner waits in take_grad for gradients
                             # that never come; closing the session, after this, ends it
CLOSE_TIMEOUT_SECS = 30      # closing the session at the end may take this long
RECOVERY_WAIT_SECS = 1       # a non-chief looks this often for the chief's variables


SECURITY_WARNING = (
    'WARNING: TensorFlow servers have no authentication and no encryption, and every '
    'task listens on all network interfaces of its machine on its port, whatever host '
    'the cluster spec names: anyone who can reach %s can run any graph there, '
    'reading and writing files as this user. Firewall the ports of --ps_hosts and '
    '--worker_hosts. TensorFlow\'s own advice on running graphs over gRPC: '
    'https://github.com/tensorflow/tensorflow/blob/master/SECURITY.md')

FLAGS = flags.FLAGS
# From multi_gpu_train, meaning the same per worker: --dataset, --num_gpus, --batch_size,
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
    'seed': 'the workers\' updates reach the ps tasks in whatever order the network and '
            'the machines give, so a distributed run cannot repeat exactly; use '
            'multi_gpu_train.py --seed for runs to compare',
}
for _flag in FLAGS.get_key_flags_for_module(multi_gpu_train):  # in our --helpshort too
  if _flag.name not in REFUSED_FLAGS:
    flags.declare_key_flag(_flag.name)
LAUNCHER_FLAGS = ['local_cluster', 'job_name', 'task_index', 'ps_hosts', 'worker_hosts']
TrainingError = training_run.TrainingError


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


class ChiefSessions(tf.compat.v1.train.ChiefSessionCreator):
  """The chief's sessions: the first initialises or restores the variables.

  MonitoredSession opens another when a step fails because a ps task went away
  (AbortedError, UnavailableError): it waits for the ps tasks to answer again,
  then restores the latest checkpoint into them, as a restarted chief does.

  fp16: restore_fp16 (mixed_precision.restorer's) restores, after everything is
  initialised, so that a float32 run's checkpoint (no loss_scale/) resumes too.
  """

  def __init__(self, who, ps_hosts, timeout_secs, arm_watchdog, train_dir, restore_fp16,
               **kwargs):
    super().__init__(**kwargs)
    self._who, self._ps_hosts, self._timeout_secs = who, ps_hosts, timeout_secs
    self._arm_watchdog, self._train_dir, self._opened = arm_watchdog, train_dir, 0
    self._restore_fp16 = restore_fp16

  def create_session(self):
    if self._opened:
      say_reopening(self._who, self._ps_hosts, self._timeout_secs, self._arm_watchdog,
                    'restores the variables from the latest checkpoint')
      # The newest of this directory's checkpoints that reads whole, found as at start.
      self._checkpoint_filename_with_path = training_run.checkpoint_to_resume(
          self._train_dir)[0]
    self._opened += 1
    path = self._checkpoint_filename_with_path
    with quiet_deprecations():  # of the Saver's restore
      if not (self._restore_fp16 and path):
        return super().create_session()
      self._scaffold.finalize()
      return self._get_session_manager().prepare_session(
          self._master, config=self._config, init_op=self._scaffold.init_op,
          init_fn=lambda sess: self._restore_into(sess, path))

  def _restore_into(self, sess, path):
    if self._restore_fp16(sess, path):
      print('%s holds no loss scale (a float32 run\'s): it starts at %g' % (
          path, mixed_precision.INITIAL_LOSS_SCALE), flush=True)


class WorkerSessions(tf.compat.v1.train.SessionCreator):
  """A non-chief's sessions: each waits for the chief to initialise or restore the variables.

  TensorFlow's WorkerSessionCreator looks every 30 s, and gives up at once when
  its deadline is nearer than that; this one looks every RECOVERY_WAIT_SECS.
  """

  def __init__(self, who, ps_hosts, chief_host, timeout_secs, arm_watchdog, scaffold,
               master, config):
    self._who, self._ps_hosts, self._chief_host = who, ps_hosts, chief_host
    self._timeout_secs, self._arm_watchdog = timeout_secs, arm_watchdog
    self._scaffold, self._master, self._config = scaffold, master, config
    self._opened = 0

  def create_session(self):
    if self._opened:
      say_reopening(self._who, self._ps_hosts, self._timeout_secs, self._arm_watchdog,
                    'waits for the chief to restore the variables from its checkpoint')
    else:
      print('%s: waiting for the chief (worker 0 at %s) to initialise the variables'
            % (self._who, self._chief_host), flush=True)
    self._opened += 1
    self._scaffold.finalize()
    manager = tf.compat.v1.train.SessionManager(
        local_init_op=self._scaffold.local_init_op,
        local_init_feed_dict=self._scaffold.local_init_feed_dict,
        ready_op=self._scaffold.ready_op,
        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
        graph=tf.compat.v1.get_default_graph(), recovery_wait_secs=RECOVERY_WAIT_SECS)
    try:
      return manager.wait_for_session(self._master, config=self._config,
                                      max_wait_secs=self._timeout_secs)
    except tf.errors.DeadlineExceededError:
      raise TrainingError(
          '%s waited %d s for the chief (worker 0 at %s) to %s the variables on the ps '
          'tasks. Start worker 0 (or look at its log for an error), or raise '
          '--startup_timeout_secs.' % (self._who, self._timeout_secs, self._chief_host,
                                       'restore' if self._opened > 1 else
                                       'initialise or restore')) from None


def say_reopening(who, ps_hosts, timeout_secs, arm_watchdog, then):
  """After a ps task went away: says so, waits for the ps tasks to answer again."""
  print('%s: the session was aborted: a ps task (%s) went away or restarted, and with '
        'it the variables it held. Waiting up to %d s for the ps tasks to answer; then '
        'this worker %s.' % (who, ','.join(ps_hosts), timeout_secs, then), flush=True)
  arm_watchdog(2 * timeout_secs + WATCHDOG_SLACK_SECS,
               '%s could not open a new session with the ps tasks %s within %d s. Check '
               'that they are running, or raise --startup_timeout_secs.'
               % (who, ','.join(ps_hosts), 2 * timeout_secs + WATCHDOG_SLACK_SECS))
  wait_for_ps(ps_hosts, timeout_secs, who)


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


def claim_then_apply(opt, grads, global_step, max_steps):
  """Async: an update that first claims its global step, then applies the gradients.

  Async workers apply their updates independently. Stopping "once the global step
  reaches max_steps" would let every worker that is mid-step land one more update.
  Here each update first takes the next global step with count_up_to, atomically
  on the ps; the claim past max_steps fails with OutOfRangeError, which ends that
  worker's loop. Exactly max_steps updates land, whichever workers make them, and
  a restored checkpoint's global step is where the counting resumes.
  """
  # The claim waits for the gradients: taken earlier, the global step would count
  # an update still being computed.
  with tf.control_dependencies([g for g, _ in grads]), \
      quiet_deprecations(), tf.compat.v1.colocate_with(global_step):
    # count_up_to's notice ('use Dataset.range') does not apply: this counter is a
    # variable on the ps that every worker shares, which no Dataset can be.
    claim = tf.compat.v1.count_up_to(global_step, max_steps)
  with tf.control_dependencies([claim]):
    return opt.apply_gradients(grads)  # counted by the claim


class SyncReplicas(tf.compat.v1.train.SyncReplicasOptimizer):
  """SyncReplicasOptimizer, its local step kept on this worker, its end quiet.

  Placement: SyncReplicasOptimizer puts its token queue and gradient accumulators
  beside global_step (on the ps) with tf.device() scopes of its own, and leaves
  its per-worker local step unplaced, where replica_device_setter would put it on
  the ps: one variable shared by every worker. apply_gradients() builds under this
  worker's device alone, where the optimizer's own scopes still put the queue on
  the ps.

  The end: the chief's queue runner waits in take_grad for gradients; closing
  the session cancels that wait, which is the normal end, not an error.

  fp16 (loss_scale given): the queue runner applies the aggregated gradient
  through SkipOverflow, which also steps the moving averages, only when it is
  finite.
  """

  def __init__(self, opt, replicas_to_aggregate, total_num_replicas, worker_device,
               ema, loss_scale=None):
    super().__init__(opt, replicas_to_aggregate=replicas_to_aggregate,
                     total_num_replicas=total_num_replicas,
                     variable_averages=None if loss_scale else ema,
                     variables_to_average=tf.compat.v1.trainable_variables())
    self._worker_device = worker_device
    self.skip_overflow = None
    if loss_scale:  # what the base's apply_gradients applies the aggregate with
      self.skip_overflow = self._opt = SkipOverflow(opt, ema, loss_scale,
                                                    self._accumulator_list)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    # device(None) drops the enclosing device functions; the ops given no device
    # of their own (the local step) stay on this worker.
    with tf.compat.v1.device(None), tf.compat.v1.device(self._worker_device), \
        quiet_deprecations():  # of the QueueRunner it makes
      return super().apply_gradients(grads_and_vars, global_step, name)

  def get_chief_queue_runner(self):
    runner = super().get_chief_queue_runner()
    return tf.compat.v1.train.QueueRunner(
        runner.queue, runner.enqueue_ops,
        queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))


class SkipOverflow:
  """Sync fp16: applies SyncReplicasOptimizer's aggregated gradient, or skips it.

  Runs on the chief's queue runner, once per update: the gradient (the mean of
  the workers' unscaled ones) is applied, then the moving averages, only when it
  is finite; else nothing is, the global step stays, and the shared scale halves
  (mixed_precision.apply_or_skip). The workers read the new scale after their
  token, so every gradient of an update is taken at one scale.

  The tokens: each take_grad moves the accumulators' step on by one, and the
  tokens handed out after an update name the global step, which the workers'
  next gradients carry. After a skip the global step has not moved: the
  accumulators are set back to it, so those gradients are not dropped as stale
  (they are not: no variable changed). After an update this sets nothing new.

  The chief's loop is not where a skip happens: each skip leaves a note,
  (step, scale, new scale), in the queue `skips` on the ps, for it to print.
  """

  def __init__(self, opt, ema, loss_scale, accumulators):
    self._opt, self._ema, self._loss_scale = opt, ema, loss_scale
    self._accumulators = accumulators  # [(accumulator, device)], filled by the base
    self.skips = None  # the notes' queue, made with the update

  def apply_gradients(self, grads_and_vars, global_step):
    grads = list(grads_and_vars)
    self.skips = tf.queue.FIFOQueue(-1, [tf.int64, tf.float32, tf.float32],
                                    shapes=[[], [], []], name='loss_scale_skips')
    update = mixed_precision.apply_or_skip(
        lambda: multi_gpu_train.then_average(
            self._opt.apply_gradients(grads, global_step), self._ema),
        mixed_precision.all_finite(grads), self._loss_scale)
    with tf.control_dependencies([update.train_op]):
      note = tf.cond(update.applied, tf.no_op, lambda: self.skips.enqueue(
          [global_step.read_value() + 1, update.scale, update.new_scale]))
      rewinds = []
      for accumulator, device in self._accumulators:
        with tf.compat.v1.device(device):
          rewinds.append(accumulator.set_global_step(global_step))
    return tf.group(update.train_op, note, *rewinds)


class SaveCheckpoints(tf.compat.v1.train.SessionRunHook):
  """The chief's checkpoints, through the same machinery as multi_gpu_train.py's.

  training_run.save_checkpoint writes them: rotation within --train_dir only,
  the state file with relative names, and a failed write that stops the run with
  one line instead of going on. Saved as the session opens, every
  save_every_n_steps global steps, and at the end.
  """

  def __init__(self, train_dir, save_every_n_steps, saver, global_step):
    self._train_dir, self._every = train_dir, save_every_n_steps
    self._saver, self._global_step = saver, global_step
    self._last = None

  def after_create_session(self, session, coord):
    del coord
    self._save(session, session.run(self._global_step))

  def after_run(self, run_context, run_values):
    del run_values
    step = run_context.session.run(self._global_step)
    if step // self._every != self._last // self._every:
      self._save(run_context.session, step)

  def end(self, session):
    step = session.run(self._global_step)
    if step != self._last:
      self._save(session, step)

  def _save(self, session, step):
    path = training_run.save_checkpoint(session, self._saver, self._train_dir, step,
                                        multi_gpu_train.KEEP_CHECKPOINTS)
    print('Saved checkpoint %s' % path, flush=True)
    self._last = step


class WriteSummaries(tf.compat.v1.train.SessionRunHook):
  """The chief's TensorBoard summaries, through multi_gpu_train.py's machinery.

  training_run.SummaryWriter writes them: a failed write is said once, plainly,
  and training goes on. The event file opens with the run record; then the
  summary op runs with the step every summary_steps global steps.
  """

  def __init__(self, train_dir, summary_steps, summary_op, global_step, record):
    self._train_dir, self._every = train_dir, summary_steps
    self._summary_op, self._global_step, self._record = summary_op, global_step, record
    self._writer, self._last, self._due = None, None, True

  def after_create_session(self, session, coord):
    del coord
    if self._writer is None:  # the first session; a reopened one writes on
      self._writer = training_run.SummaryWriter(self._train_dir, session.graph)
      self._writer.add_summary(training_run.text_summary('run_record', self._record),
                               self._record['start_step'])

  def before_run(self, run_context):
    del run_context
    fetches = {'step': self._global_step}
    if self._due:
      fetches['summary'] = self._summary_op
    return tf.compat.v1.train.SessionRunArgs(fetches)

  def after_run(self, run_context, run_values):
    del run_context
    step = run_values.results['step']
    if 'summary' in run_values.results:
      self._writer.add_summary(run_values.results['summary'], step)
      self._last = step
    self._due = self._last is None or step // self._every != self._last // self._every

  def end(self, session):
    del session
    self._writer.close()


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


class WorkerSettings(typing.NamedTuple):
  """What a worker needs beyond multi_gpu_train.Settings: the mode and the waits."""
  sync_replicas: bool = False
  replicas_to_aggregate: int = None   # sync: gradients per update; None: one per worker
  startup_timeout_secs: int = STARTUP_TIMEOUT_SECS
  step_timeout_secs: int = STEP_TIMEOUT_SECS


def train(cluster, task_index, settings, worker=WorkerSettings(), stop=None,
          flag_values=None):
  """Runs worker `task_index` until global step settings.max_steps; worker 0 is the chief.

  Args:
    cluster: tf.compat.v1.train.ClusterSpec with jobs 'ps' and 'worker'.
    settings: a multi_gpu_train.Settings (its fresh, seed and async_towers unused).
    worker: a WorkerSettings.
    stop: a training_run.StopSignals, or None (tests): when it is requested the
      loop ends after the current step, the chief saves, and training_run.Stopped
      is raised.
    flag_values: dict, the command line's flags, for the chief's run record.
  """
  stop = stop or multi_gpu_train.NEVER
  data = multi_gpu_train.DATASETS[settings.dataset]
  with contextlib.ExitStack() as exit_stack:  # the chief's lock on train_dir
    run = start(exit_stack, cluster, task_index, settings, worker, data.input)
    record = (chief_run_record(run, settings, data, flag_values) if run.task_index == 0
              else None)
    epoch = multi_gpu_train.examples_per_epoch(settings, data)
    with tf.Graph().as_default():
      graph = build(run, settings, worker, data, epoch, record)
      multi_gpu_train.check_memory([graph.train_op, graph.loss], settings)
      print_start(run, graph, settings, data.model, epoch)
      with open_session(run, graph, settings.train_dir, worker.startup_timeout_secs) as sess:
        step, local_step = loop(sess, run, graph, settings, worker.step_timeout_secs, stop)
        run.arm_watchdog(CLOSE_TIMEOUT_SECS + WATCHDOG_SLACK_SECS,
                         '%s: closing the session hung after the last step (%d)'
                         % (run.who, step))
      # Closed: the chief's SaveCheckpoints hook has saved the last step.
    run.arm_watchdog(None, '')
  if stop.requested:
    print('Stopped by %s at step %d; rerun the same command to resume.' % (stop.name, step),
          flush=True)
    raise training_run.Stopped(stop.exit_code)
  print('%s done: %d local steps, global step %d' % (run.who, local_step, step), flush=True)


WorkerRun = collections.namedtuple('WorkerRun', [
    'who',           # 'worker 1'
    'cluster',       # tf.compat.v1.train.ClusterSpec
    'task_index',    # int; 0 is the chief
    'num_workers',   # int
    'ps_hosts',      # ['host:port', ...]
    'chief_host',    # 'host:port' of worker 0
    'server',        # this task's tf.compat.v1.train.Server
    'config',        # its tf.compat.v1.ConfigProto
    'devices',       # the towers' devices, and where they are, said at start-up
    'where',
    'checkpoint',    # chief: the checkpoint it restores, or None
    'start_step',    # chief: its global step
    'arm_watchdog',  # arm(secs, message): see start_watchdog()
])


def start(exit_stack, cluster, task_index, settings, worker, data_input):
  """Checks, the chief's lock and resume point, the data, the server; the ps tasks up.

  The chief's lock on train_dir is held until exit_stack closes.
  """
  who = 'worker %d' % task_index
  checkpoint, start_step = None, 0
  if task_index == 0:  # before anything is written: a second chief stops here
    training_run.check_train_dir(settings.train_dir)
    training_run.make_train_dir(settings.train_dir)
    exit_stack.enter_context(training_run.lock_train_dir(settings.train_dir))
    checkpoint, start_step, _, notes = training_run.checkpoint_to_resume(settings.train_dir)
    for note in notes:
      print(note)
  if not settings.synthetic:
    data_input.prepare(settings.data_dir, settings.data_url, settings.data_md5)
  devices, num_cpu_devices, where = placement.tower_devices(settings.num_gpus)
  config = placement.session_config(num_cpu_devices, settings.session)
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
  wait_for_ps(cluster.job_tasks('ps'), worker.startup_timeout_secs, who)
  return WorkerRun(who, cluster, task_index, cluster.num_tasks('worker'),
                   cluster.job_tasks('ps'), cluster.task_address('worker', 0), server,
                   config, devices, where, checkpoint, start_step, arm_watchdog)


def chief_run_record(run, settings, data, flag_values):
  """Writes the chief's run record, as multi_gpu_train.py's; returns it."""
  record = multi_gpu_train.run_record(
      flag_values, settings, run.devices, run.start_step, data,
      extra_constants={'dist_train.py': training_run.constants_of(sys.modules[__name__])})
  record['cluster'] = run.cluster.as_dict()
  print('Run record: %s' % training_run.write_run_record(settings.train_dir, record),
        flush=True)
  return record


TrainGraph = collections.namedtuple('TrainGraph', [
    'global_step',      # int64 variable, on the ps
    'loss',             # float32 scalar: this worker's loss
    'train_op',         # this worker's step: its gradient applied (async) or pushed (sync)
    'step_after',       # int64: async, the global step this update claimed; sync, the
                        # token: the global step of the update this worker waited for
    'hooks',            # for this worker's session (the chief's: saves, summaries too)
    'scaffold',
    'release_workers',  # sync chief: one token per worker, handed out at the end
    'decay_steps',      # int: updates between two drops of the learning rate
    'examples_per_update',  # int: this worker's batch_size x towers
    'replicas_to_aggregate',  # sync: gradients averaged per update; async: None
    'loss_scale',       # fp16: mixed_precision.LossScale, on the ps; float32: None
    'restore_fp16',     # fp16 chief: mixed_precision.restorer's restore(sess, path)
    'skip_check',       # fp16, fetched with each step to see skips: async, this worker's
                        # (applied, scale, new_scale); sync chief, the skips noted since
                        # its last step, [steps], [scales], [new scales]; else None
])


def build(run, settings, worker, data, epoch, record):
  """Input, towers, the average and the update, placed by replica_device_setter.

  fp16: the loss scale lives on the ps with the variables (and in the checkpoint).
  Each worker step reads it once: the towers scale their losses by that snapshot
  and the worker divides its averaged gradient by it, so the gradient leaving the
  worker is unscaled float32 whatever the other workers did to the scale meanwhile.
  Who checks it and skips is the update's business (async_update, sync_update).
  """
  worker_device = '/job:worker/task:%d' % run.task_index
  examples_per_update = settings.batch_size * len(run.devices)
  model = data.model
  with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
      cluster=run.cluster, worker_device=worker_device)):
    with tf.device('/cpu:0'):
      if settings.synthetic:
        dataset = data.input.synthetic_dataset(settings.batch_size)
      else:
        dataset = data.input.train_dataset(settings.data_dir, settings.batch_size)
      next_batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, decay_steps = multi_gpu_train.learning_rate(global_step, examples_per_update,
                                                    epoch.count, model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    loss_scale = (mixed_precision.make_loss_scale(mixed_precision.INITIAL_LOSS_SCALE)
                  if settings.use_fp16 else None)
    with tf.compat.v1.device(placement.place('/cpu:0', '')):  # this worker's CPU
      snapshot = loss_scale and mixed_precision.read_once(loss_scale)
    # variables_device '': replica_device_setter puts the variables on the ps tasks.
    towers = multi_gpu_train.build_towers(next_batch, run.devices, opt, model,
                                          variables_device='', loss_scale=snapshot)
    with tf.compat.v1.device(placement.place('/cpu:0', '')):
      grads = multi_gpu_train.average_gradients(towers.grads)
      all_finite = None
      if snapshot:  # fp16: the gradient leaves the worker unscaled
        grads, all_finite = mixed_precision.unscale_and_check(grads, snapshot)
      loss = tf.reduce_mean(tf.stack(towers.losses), name='total_loss')
    ema = multi_gpu_train.moving_averages(global_step, model)
    update = sync_update if worker.sync_replicas else async_update
    train_op, step_after, hooks, release_workers, skip_check = update(
        run, worker, opt, grads, global_step, ema, settings.max_steps,
        loss_scale, snapshot and snapshot.scale, all_finite)
    summary_op = (multi_gpu_train.build_summaries(range(len(run.devices)), towers.losses,
                                                  grads, lr, model,
                                                  snapshot and snapshot.scale)
                  if settings.summary_steps else None)
    # Not sharded: the chief writes every file, so only it needs --train_dir.
    scaffold = tf.compat.v1.train.Scaffold(saver=training_run.make_saver(),
                                           summary_op=summary_op)
    restore_fp16 = (mixed_precision.restorer(tf.compat.v1.global_variables())
                    if loss_scale and run.task_index == 0 else None)
    if run.task_index == 0:
      hooks.append(SaveCheckpoints(settings.train_dir, settings.save_every_n_steps,
                                   scaffold.saver, global_step))
      if summary_op is not None:
        hooks.append(WriteSummaries(settings.train_dir, settings.summary_steps, summary_op,
                                    global_step, record))
  return TrainGraph(global_step, loss, train_op, step_after, hooks, scaffold,
                    release_workers, decay_steps, examples_per_update,
                    (worker.replicas_to_aggregate or run.num_workers)
                    if worker.sync_replicas else None, loss_scale, restore_fp16,
                    skip_check)


def async_update(run, worker, opt, grads, global_step, ema, max_steps, loss_scale=None,
                 scale=None, all_finite=None):
  """Each worker applies its own averaged gradient, then the moving averages.

  fp16 (loss_scale, the scale this step read, all_finite): the worker checks its
  own unscaled gradient. Finite, it claims its global step and applies; not, it
  claims nothing (the global step does not move) and halves the shared scale
  from the scale it read; the loop says so. Each worker skips its own overflows.

  Returns:
    (train op, the global step it claimed (fp16 skip: the global step), hooks,
     None, fp16: this step's (applied, scale, new_scale), else None).
  """
  del run, worker
  apply_fn = lambda: multi_gpu_train.then_average(
      claim_then_apply(opt, grads, global_step, max_steps), ema)
  skip_check = None
  if loss_scale:
    update = mixed_precision.apply_or_skip(apply_fn, all_finite, loss_scale, scale)
    train_op, skip_check = update.train_op, list(update[1:])
  else:
    train_op = apply_fn()
  with tf.control_dependencies([train_op]):
    step_after = tf.identity(global_step.read_value())  # this worker's update included
  return (train_op, step_after, [tf.compat.v1.train.StopAtStepHook(last_step=max_steps)],
          None, skip_check)


def sync_update(run, worker, opt, grads, global_step, ema, max_steps, loss_scale=None,
                scale=None, all_finite=None):
  """SyncReplicasOptimizer: replicas_to_aggregate gradients averaged per update, the
  moving averages stepped right after each update, on the chief's queue runner.

  fp16 (loss_scale given): each worker pushes its unscaled gradient; the chief's
  queue runner checks the aggregated one and applies it or skips it (SyncReplicas).
  No worker knows whether the update its gradient went into was skipped; the
  chief takes the queue runner's notes of skips after each of its steps and
  says them.

  Returns:
    (train op: push the gradient, wait for a token; the token, which names the
     global step; hooks; the chief's op handing every worker a token at the end;
     fp16 chief: the skips noted since its last step, else None).
  """
  del scale, all_finite  # the chief checks the aggregate instead
  with quiet_deprecations():
    sync = SyncReplicas(opt, worker.replicas_to_aggregate or run.num_workers,
                        run.num_workers, '/job:worker/task:%d' % run.task_index, ema,
                        loss_scale)
    train_op = sync.apply_gradients(grads, global_step=global_step)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=max_steps),
             sync.make_session_run_hook(run.task_index == 0)]
    # At the end the chief hands out one token per worker: a worker waiting for an
    # update that will never come gets it, sees the last step and stops.
    release_workers = (sync.get_init_tokens_op(run.num_workers) if run.task_index == 0
                       else None)
  skip_check = None
  if loss_scale and run.task_index == 0:
    skips = sync.skip_overflow.skips
    with tf.control_dependencies([train_op]):  # the update of this step's token is in
      skip_check = skips.dequeue_up_to(skips.size())  # every note left since the last step
  return train_op, tf.identity(train_op), hooks, release_workers, skip_check


@contextlib.contextmanager
def quiet_deprecations():
  """Keeps TensorFlow's deprecation notices for SyncReplicasOptimizer and QueueRunner,
  which this script uses on purpose, out of the log; other warnings still show."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel('ERROR')
  try:
    yield
  finally:
    logger.setLevel(level)


def print_start(run, graph, settings, model, epoch):
  """The start-up lines: who, where, the parameters, the mode, the schedule, the step."""
  num_params = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
  batch_size, num_towers = settings.batch_size, len(run.devices)
  print('TensorFlow %s; %s of %d (worker 0 is the chief); %s' % (
      tf.__version__, run.who, run.num_workers, run.where))
  print(onednn.start_line())
  print('ps tasks %s hold %d trainable parameters' % (','.join(run.ps_hosts), num_params))
  replicas_to_aggregate = graph.replicas_to_aggregate
  if replicas_to_aggregate:
    print('sync: each update averages %d gradients of %d images (%d x %d towers) from '
          '%d workers, %d of them backup' % (
              replicas_to_aggregate, batch_size * num_towers, batch_size, num_towers,
              run.num_workers, max(run.num_workers - replicas_to_aggregate, 0)))
  else:
    print('async: each of %d workers applies its own updates of %d images (%d x %d '
          'towers)' % (run.num_workers, batch_size * num_towers, batch_size, num_towers))
  print('decay_steps %d = %d examples (%s) / %d per worker step x %g epochs; input: %s' % (
      graph.decay_steps, epoch.count, epoch.source, graph.examples_per_update,
      model.NUM_EPOCHS_PER_DECAY, 'synthetic' if settings.synthetic else settings.data_dir))
  print(multi_gpu_train.schedule_line(model, graph.decay_steps))
  if graph.loss_scale is not None:
    print('float16 towers, float32 variables; dynamic loss scale from %g on the ps, shared '
          'by the workers (a resumed run keeps its own), doubled after %d clean updates, '
          'halved on an overflow by %s' % (
              mixed_precision.INITIAL_LOSS_SCALE, mixed_precision.LOSS_SCALE_PERIOD,
              'the chief' if graph.replicas_to_aggregate else 'the worker that had it'))
  if run.task_index == 0:
    print('Resuming from %s at step %d' % (run.checkpoint, run.start_step) if run.checkpoint
          else 'Starting from step 0 in %s' % settings.train_dir)
  sys.stdout.flush()


def open_session(run, graph, train_dir, startup_timeout_secs):
  """MonitoredSession: the chief initialises or restores, saves and summarises.

  What MonitoredTrainingSession builds, with session creators that say what
  happened and wait for the ps tasks when a session must be reopened.
  """
  run.arm_watchdog(startup_timeout_secs + WATCHDOG_SLACK_SECS,
                   '%s could not open a session with the ps tasks %s within %d s. Check '
                   'that they are running and reachable, or raise --startup_timeout_secs.'
                   % (run.who, ','.join(run.ps_hosts),
                      startup_timeout_secs + WATCHDOG_SLACK_SECS))
  if run.task_index == 0:
    creator = ChiefSessions(run.who, run.ps_hosts, startup_timeout_secs, run.arm_watchdog,
                            train_dir, graph.restore_fp16,
                            scaffold=graph.scaffold,
                            # The checkpoint training_run found and read whole,
                            # not the state file's latest as TensorFlow reads it.
                            checkpoint_filename_with_path=run.checkpoint,
                            master=run.server.target, config=run.config)
  else:
    creator = WorkerSessions(run.who, run.ps_hosts, run.chief_host, startup_timeout_secs,
                             run.arm_watchdog, graph.scaffold, run.server.target,
                             run.config)
  return tf.compat.v1.train.MonitoredSession(
      session_creator=creator, hooks=graph.hooks,
      stop_grace_period_secs=QUEUE_RUNNER_STOP_SECS)


def loop(sess, run, graph, settings, step_timeout_secs, stop):
  """The step loop: run, check, log. Returns (global step, this worker's steps)."""
  max_steps, log_frequency = settings.max_steps, settings.log_frequency
  model_name = multi_gpu_train.DATASETS[settings.dataset].model.__name__
  read_step = lambda step_context: step_context.session.run(graph.global_step)
  step = sess.run_step_fn(read_step)
  print('%s: training from global step %d' % (run.who, step), flush=True)
  if step >= max_steps:
    print('%s: global step %d is not below --max_steps=%d: nothing to do. Raise '
          '--max_steps to train further.' % (run.who, step, max_steps))
  run_options = tf.compat.v1.RunOptions(timeout_in_ms=step_timeout_secs * 1000)
  num_towers = len(run.devices)
  local_step, last_shown = 0, step
  while step < max_steps and not sess.should_stop() and not stop.requested:
    run.arm_watchdog(step_timeout_secs + WATCHDOG_SLACK_SECS, stuck_step_message(
        run, graph, step_timeout_secs + WATCHDOG_SLACK_SECS))
    start_time = time.time()
    try:
      _, loss_value, step_after, skip_check = sess.run(
          [graph.train_op, graph.loss, graph.step_after, graph.skip_check or []],
          options=run_options)
    except tf.errors.OutOfRangeError:
      break  # async: the other workers have claimed the last updates
    except tf.errors.DeadlineExceededError as e:
      raise TrainingError(slow_step_message(run, graph, step_timeout_secs)) from e
    duration = time.time() - start_time
    local_step += 1
    # Sync: this worker's gradient goes into the update after the one its token
    # came from; the token it gets back is that of an update already applied.
    shown = step + 1 if graph.replicas_to_aggregate else step_after

    if not np.isfinite(loss_value):
      raise TrainingError(
          'loss is %s at step %d on %s: the model diverged. Lower '
          'INITIAL_LEARNING_RATE (%s/model.py) or --batch_size; the chief\'s last '
          'checkpoint is untouched.' % (loss_value, shown, run.who,
                                        model_name))
    if graph.replicas_to_aggregate and skip_check:  # fp16 chief: updates skipped meanwhile
      for note in zip(*skip_check):                 # (step, scale, new scale)
        multi_gpu_train.check_skip(*note)
    elif skip_check and not skip_check[0]:  # async fp16: this worker's own step, unapplied
      multi_gpu_train.check_skip(step_after + 1, *skip_check[1:])
      step = step_after
      continue
    if shown // log_frequency != last_shown // log_frequency or local_step == 1:
      examples_per_sec = graph.examples_per_update / duration
      sec_per_batch = duration / num_towers
      print('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch) '
            '[worker %d, local step %d]' % (
                datetime.datetime.now(), shown, loss_value, examples_per_sec,
                sec_per_batch, run.task_index, local_step))
      sys.stdout.flush()
    step, last_shown = step_after, shown
  # The hooks may have stopped the loop on an update another worker waited for.
  step = sess.run_step_fn(read_step)
  print('%s: closing the session at global step %d' % (run.who, step), flush=True)
  if graph.release_workers is not None:
    sess.run_step_fn(lambda step_context: step_context.session.run(graph.release_workers))
  return step, local_step


def stuck_step_message(run, graph, secs):
  return ('%s: a step has not returned in %d s and TensorFlow did not time it out: the ps '
          'tasks %s%s stopped answering. Restart them, or raise --step_timeout_secs.'
          % (run.who, secs, ','.join(run.ps_hosts),
             ' or the chief' if graph.replicas_to_aggregate else ''))


def slow_step_message(run, graph, step_timeout_secs):
  if graph.replicas_to_aggregate:
    return ('%s: no averaged update within --step_timeout_secs=%d. Each update waits for '
            '%d gradients, at most one from each worker, and for the chief (worker 0 at '
            '%s) to apply them: check that the chief and at least %d workers are running, '
            'or raise --step_timeout_secs.' % (
                run.who, step_timeout_secs, graph.replicas_to_aggregate, run.chief_host,
                graph.replicas_to_aggregate))
  return ('%s: a step took more than --step_timeout_secs=%d waiting for the ps tasks %s. '
          'Check that they are running, or raise --step_timeout_secs.'
          % (run.who, step_timeout_secs, ','.join(run.ps_hosts)))


def main(argv):
  del argv  # absl has already refused unknown flags
  # First, so that no Ctrl-C or SIGTERM is lost: a worker finishes its step, the
  # chief saves. ps tasks keep Python's default: they hold nothing of their own.
  stop = training_run.StopSignals(FLAGS.train_dir) if FLAGS.job_name == 'worker' else None
  local_cluster.die_with_launcher()
  check_flags()
  if FLAGS.local_cluster:
    sys.exit(main_local_cluster())
  cluster = cluster_from_flags()
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # MonitoredSession's INFO
  with training_run.one_line_errors():
    if FLAGS.job_name == 'ps':
      run_ps(cluster, FLAGS.task_index)
      return
    worker = WorkerSettings(**{name: FLAGS[name].value for name in WorkerSettings._fields})
    flag_values = {flag.name: flag.value
                   for flag in FLAGS.get_key_flags_for_module(sys.argv[0])}
    train(cluster, FLAGS.task_index, multi_gpu_train.settings_from_flags(), worker,
          stop=stop, flag_values=flag_values)


def check_flags():
  """Stops the run, naming the flag, for a flag this program refuses or a bad value."""
  for name, why in REFUSED_FLAGS.items():
    if FLAGS[name].present:
      sys.exit('error: --%s is a multi_gpu_train.py flag that dist_train.py does not '
               'take: %s.' % (name, why))
  multi_gpu_train.apply_dataset_defaults()
  multi_gpu_train.check_flags(also_positive=('startup_timeout_secs', 'step_timeout_secs'))
  if FLAGS.replicas_to_aggregate is not None:
    if not FLAGS.sync_replicas:
      sys.exit('error: --replicas_to_aggregate=%d needs --sync_replicas: async workers '
               'apply their gradients one by one' % FLAGS.replicas_to_aggregate)
    if FLAGS.replicas_to_aggregate < 1:
      sys.exit('error: --replicas_to_aggregate must be at least 1, got %d'
               % FLAGS.replicas_to_aggregate)


def cluster_from_flags():
  """The ClusterSpec of --ps_hosts and --worker_hosts, once this task is checked in it."""
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
  if local_cluster.DIE_WITH_LAUNCHER_ENV not in os.environ:  # else the launcher said it
    print(SECURITY_WARNING % ('port %s of this machine (this task, %s %d)' % (
        hosts[FLAGS.task_index].rpartition(':')[2], FLAGS.job_name, FLAGS.task_index)),
          flush=True)
  return tf.compat.v1.train.ClusterSpec({'ps': ps_hosts, 'worker': worker_hosts})


def main_local_cluster():
  """--local_cluster=P,W: its checks and the data, then local_cluster.run; the exit code."""
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
  with training_run.one_line_errors():
    if not FLAGS.synthetic:  # once, here, rather than racing in every worker
      data_input = multi_gpu_train.DATASETS[FLAGS.dataset].input
      data_input.prepare(FLAGS.data_dir, FLAGS.data_url, FLAGS.data_md5)
    # Every flag given on this command line goes to every task.
    task_flags = [FLAGS[name].serialize() for name in FLAGS
                  if FLAGS[name].present and FLAGS[name].name not in LAUNCHER_FLAGS]
    return local_cluster.run(num_ps, num_workers, list(dict.fromkeys(task_flags)),
                             SECURITY_WARNING % 'the ports listed below')


if __name__ == '__main__':
  placement.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
