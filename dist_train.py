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

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's errors only; no INFO, WARNING

import collections
import contextlib
import ctypes
import datetime
import errno
import fcntl
import glob
import ipaddress
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import input_lib
import multi_gpu_train  # the graph, the session config and the flags both scripts share
import training_run

# ---- Cluster knobs: edit, save, rerun -------------------------------------------
STARTUP_TIMEOUT_SECS = 120   # a worker waits this long for its ps tasks, then for the chief
STEP_TIMEOUT_SECS = 300      # one step may take this long (sync: waiting for the update too)
WATCHDOG_SLACK_SECS = 30     # past a deadline above, a task stuck inside TensorFlow exits
QUEUE_RUNNER_STOP_SECS = 2   # sync chief: its queue runner waits in take_grad for gradients
                             # that never come; closing the session, after this, ends it
CLOSE_TIMEOUT_SECS = 30      # closing the session at the end may take this long
STOP_TASKS_SECS = 5          # --local_cluster: SIGTERM to SIGKILL for tasks still running
RECOVERY_WAIT_SECS = 1       # a non-chief looks this often for the chief's variables
STOP_CHIEF_SECS = 60         # --local_cluster stopped: the chief's last step and save

# Linux constants for enter_private_network(): <sched.h>, <linux/sockios.h>, <net/if.h>
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
PR_SET_PDEATHSIG = 1                                       # <linux/prctl.h>
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

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
DIE_WITH_LAUNCHER_ENV = 'DIST_TRAIN_LAUNCHER_PID'  # set by --local_cluster for its tasks

# TensorFlow's lines that look like errors in every normal --local_cluster run: a
# notice at start-up, rendezvous cleaned up after some steps. The relay holds them
# back and shows them only if a task fails; so too everything but the workers' own
# last lines once a worker closes its session (FINAL_LINE): receives and queue runners
# cancelled as the sessions close, in many forms.
QUIET_LINES = (
    r'^WARNING: All log messages before absl::InitializeLog\(\) is called are written',
    r'^W\d{4} [\d:.]+ +\d+ local_rendezvous\.cc:\d+\] Local rendezvous is aborting with '
    r'status: ABORTED: Cleanup \d+ ',
    # oneDNN on (TensorFlow's default on CPUs with AVX512_VNNI and newer): its notice
    # speaks of round-off errors, and its uint8 kernels fall back on older CPUs.
    r'^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\.',
    r'^E\d{4} [\d:.]+ +\d+ util\.cc:\d+\] oneDNN supports DT_UINT8 only on platforms',
)
FINAL_LINE = re.compile(
    r'^(worker \d+: closing the session |worker \d+ done: |Stopped by |Saved checkpoint |error: )')
# Without an NVIDIA device on this machine, every task says it found no CUDA driver.
NO_GPU_LINES = (
    r'^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your '
    r'machine, GPU will not be used\.$',
    r'^E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: INTERNAL: CUDA '
    r'error: Failed call to cuInit: UNKNOWN ERROR \(303\)$',
)
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


class ChiefSessions(tf.compat.v1.train.ChiefSessionCreator):
  """The chief's sessions: the first initialises or restores the variables.

  MonitoredSession opens another when a step fails because a ps task went away
  (AbortedError, UnavailableError): it waits for the ps tasks to answer again,
  then restores the latest checkpoint into them, as a restarted chief does.
  """

  def __init__(self, who, ps_hosts, timeout_secs, arm_watchdog, train_dir, **kwargs):
    super().__init__(**kwargs)
    self._who, self._ps_hosts, self._timeout_secs = who, ps_hosts, timeout_secs
    self._arm_watchdog, self._train_dir, self._opened = arm_watchdog, train_dir, 0

  def create_session(self):
    if self._opened:
      say_reopening(self._who, self._ps_hosts, self._timeout_secs, self._arm_watchdog,
                    'restores the variables from the latest checkpoint')
      # The newest of this directory's checkpoints that reads whole, found as at start.
      self._checkpoint_filename_with_path = training_run.checkpoint_to_resume(
          self._train_dir)[0]
    self._opened += 1
    with quiet_deprecations():  # of the Saver's restore
      return super().create_session()


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
        quiet_deprecations(), tf.compat.v1.colocate_with(global_step):
      # count_up_to's notice ('use Dataset.range') does not apply: this counter is a
      # variable on the ps that every worker shares, which no Dataset can be.
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
    with tf.compat.v1.device(None), tf.compat.v1.device(self._worker_device), \
        quiet_deprecations():  # of the QueueRunner it makes
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
          synthetic=False, data_url=None, data_md5=None, config_options=None, stop=None,
          dataset='cifar10'):
  """Runs worker `task_index` until global step max_steps; worker 0 is the chief.

  Args:
    dataset: a key of multi_gpu_train.DATASETS: the model and the input.
    stop: a training_run.StopSignals, or None (tests): when it is requested the
      loop ends after the current step, the chief saves, and training_run.Stopped
      is raised.
  """
  stop = stop or multi_gpu_train.NEVER
  data = multi_gpu_train.DATASETS[dataset]
  run = start(cluster, task_index, train_dir, data_dir, num_gpus, synthetic, data_url,
              data_md5, startup_timeout_secs, config_options, data.input)
  with tf.Graph().as_default():
    graph = build(run, data_dir, batch_size, max_steps, sync_replicas,
                  replicas_to_aggregate or run.num_workers, summary_steps,
                  save_every_n_steps, synthetic, train_dir, data)
    print_start(run, graph, data_dir, batch_size, synthetic, train_dir)
    with open_session(run, graph, train_dir, summary_steps, startup_timeout_secs) as sess:
      step, local_step = loop(sess, run, graph, max_steps, log_frequency, batch_size,
                              step_timeout_secs, stop)
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
    'lock',          # chief: the open lock file on --train_dir, held to the end
    'checkpoint',    # chief: the checkpoint it restores, or None
    'start_step',    # chief: its global step
    'arm_watchdog',  # arm(secs, message): see start_watchdog()
])


def start(cluster, task_index, train_dir, data_dir, num_gpus, synthetic, data_url, data_md5,
          startup_timeout_secs, config_options, data_input):
  """Checks, the chief's lock and resume point, the data, the server; the ps tasks up."""
  who = 'worker %d' % task_index
  lock, checkpoint, start_step = None, None, 0
  if task_index == 0:  # before anything is written: a second chief stops here
    lock = lock_train_dir(train_dir)
    checkpoint, start_step, _, notes = training_run.checkpoint_to_resume(train_dir)
    for note in notes:
      print(note)
  if not synthetic:
    data_input.prepare(data_dir, data_url, data_md5)
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
  return WorkerRun(who, cluster, task_index, cluster.num_tasks('worker'), cluster.job_tasks('ps'),
                   cluster.task_address('worker', 0), server, config, devices, where, lock,
                   checkpoint, start_step, arm_watchdog)


def lock_train_dir(train_dir):
  """The chief's exclusive lock on train_dir (created if missing) for its whole run."""
  training_run.check_train_dir(train_dir)
  training_run.make_train_dir(train_dir)
  return training_run.lock_train_dir(train_dir)


TrainGraph = collections.namedtuple('TrainGraph', [
    'global_step',      # int64 variable, on the ps
    'loss',             # float32 scalar: this worker's loss
    'train_op',         # this worker's step: its gradient applied (async) or pushed (sync)
    'step_after',       # int64: async, the global step this update claimed; sync, the
                        # token: the global step of the update this worker waited for
    'hooks',            # for every worker's session
    'checkpoint_hook',  # the chief's
    'scaffold',
    'release_workers',  # sync chief: one token per worker, handed out at the end
    'built',            # multi_gpu_train.build_train_graph's dict, for start-up lines
    'sync_replicas',    # bool
    'replicas_to_aggregate',  # int
])


def build(run, data_dir, batch_size, max_steps, sync_replicas, replicas_to_aggregate,
          summary_steps, save_every_n_steps, synthetic, train_dir, data):
  """Input, towers and the update, placed by replica_device_setter; hooks and saver."""
  worker_device = '/job:worker/task:%d' % run.task_index
  with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
      cluster=run.cluster, worker_device=worker_device)):
    with tf.device('/cpu:0'):
      if synthetic:
        dataset = data.input.synthetic_dataset(batch_size)
      else:
        dataset = data.input.train_dataset(data_dir, batch_size)
      iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)

    def wrap(opt):
      if sync_replicas:
        with quiet_deprecations():
          return SyncReplicasWithAverages(opt, replicas_to_aggregate, run.num_workers,
                                          worker_device)
      return ClaimedUpdates(opt, max_steps)

    # variables_device '': replica_device_setter puts the variables on the ps tasks.
    built = multi_gpu_train.build_train_graph(
        iterator.get_next, run.devices, batch_size, async_towers=False,
        summaries=summary_steps > 0, variables_device='', wrap_optimizer=wrap,
        model=data.model)
    global_step, opt = built['global_step'], built['optimizer']
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=max_steps)]
    release_workers = None
    if sync_replicas:
      with quiet_deprecations():
        opt.average_after_updates(built['ema'], tf.compat.v1.trainable_variables())
      train_op = built['apply_ops'][0]  # push the gradient, wait for a token
      step_after = tf.identity(train_op)  # the token: it names the global step
      hooks.append(opt.make_session_run_hook(run.task_index == 0))
      if run.task_index == 0:
        # At the end the chief hands out one token per worker: a worker waiting for
        # an update that will never come gets it, sees the last step and stops.
        release_workers = opt.get_init_tokens_op(run.num_workers)
    else:
      train_op = built['train_ops'][0]  # the update, then the moving averages
      with tf.control_dependencies([train_op]):
        step_after = tf.identity(global_step.read_value())  # this worker's update included
    # Not sharded: the chief writes every file, so only it needs --train_dir.
    scaffold = tf.compat.v1.train.Scaffold(
        saver=training_run.make_saver(),
        summary_op=built['summary_op'])
    checkpoint_hook = SaveCheckpoints(train_dir, save_every_n_steps, scaffold.saver,
                                      global_step)
  return TrainGraph(global_step, built['loss'], train_op, step_after, hooks, checkpoint_hook,
                    scaffold, release_workers, built, sync_replicas, replicas_to_aggregate)


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


def print_start(run, graph, data_dir, batch_size, synthetic, train_dir):
  """The start-up lines: who, where, the parameters, the mode, the schedule, the step."""
  num_params = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
  num_towers = len(run.devices)
  print('TensorFlow %s; %s of %d (worker 0 is the chief); %s' % (
      tf.__version__, run.who, run.num_workers, run.where))
  print('ps tasks %s hold %d trainable parameters' % (','.join(run.ps_hosts), num_params))
  if graph.sync_replicas:
    print('sync: each update averages %d gradients of %d images (%d x %d towers) from '
          '%d workers, %d of them backup' % (
              graph.replicas_to_aggregate, batch_size * num_towers, batch_size, num_towers,
              run.num_workers, max(run.num_workers - graph.replicas_to_aggregate, 0)))
  else:
    print('async: each of %d workers applies its own updates of %d images (%d x %d '
          'towers)' % (run.num_workers, batch_size * num_towers, batch_size, num_towers))
  print('decay_steps %d = %d examples / %d per worker step x %g epochs; input: %s' % (
      graph.built['decay_steps'], graph.built['model'].NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
      graph.built['examples_per_update'], graph.built['model'].NUM_EPOCHS_PER_DECAY,
      'synthetic' if synthetic else data_dir))
  print(multi_gpu_train.schedule_line(graph.built['model'], graph.built['decay_steps']))
  if run.task_index == 0:
    print('Resuming from %s at step %d' % (run.checkpoint, run.start_step) if run.checkpoint
          else 'Starting from step 0 in %s' % train_dir)
  sys.stdout.flush()


def open_session(run, graph, train_dir, summary_steps, startup_timeout_secs):
  """MonitoredSession: the chief initialises or restores, saves and summarises.

  What MonitoredTrainingSession builds, with session creators that say what
  happened and wait for the ps tasks when a session must be reopened.
  """
  run.arm_watchdog(startup_timeout_secs + WATCHDOG_SLACK_SECS,
                   '%s could not open a session with the ps tasks %s within %d s. Check '
                   'that they are running and reachable, or raise --startup_timeout_secs.'
                   % (run.who, ','.join(run.ps_hosts),
                      startup_timeout_secs + WATCHDOG_SLACK_SECS))
  hooks = list(graph.hooks)
  if run.task_index == 0:
    hooks.append(graph.checkpoint_hook)
    if summary_steps:
      hooks.append(tf.compat.v1.train.SummarySaverHook(
          save_steps=summary_steps, output_dir=train_dir, scaffold=graph.scaffold))
    creator = ChiefSessions(run.who, run.ps_hosts, startup_timeout_secs, run.arm_watchdog,
                            train_dir, scaffold=graph.scaffold,
                            # The checkpoint training_run found and read whole,
                            # not the state file's latest as TensorFlow reads it.
                            checkpoint_filename_with_path=run.checkpoint,
                            master=run.server.target, config=run.config)
  else:
    creator = WorkerSessions(run.who, run.ps_hosts, run.chief_host, startup_timeout_secs,
                             run.arm_watchdog, graph.scaffold, run.server.target,
                             run.config)
  return tf.compat.v1.train.MonitoredSession(
      session_creator=creator, hooks=hooks, stop_grace_period_secs=QUEUE_RUNNER_STOP_SECS)


def loop(sess, run, graph, max_steps, log_frequency, batch_size, step_timeout_secs, stop):
  """The step loop: run, check, log. Returns (global step, this worker's steps)."""
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
      _, loss_value, step_after = sess.run([graph.train_op, graph.loss, graph.step_after],
                                           options=run_options)
    except tf.errors.OutOfRangeError:
      break  # async: the other workers have claimed the last updates
    except tf.errors.DeadlineExceededError as e:
      raise TrainingError(slow_step_message(run, graph, step_timeout_secs)) from e
    duration = time.time() - start_time
    local_step += 1
    # Sync: this worker's gradient goes into the update after the one its token
    # came from; the token it gets back is that of an update already applied.
    shown = step + 1 if graph.sync_replicas else step_after

    if not np.isfinite(loss_value):
      raise TrainingError(
          'loss is %s at step %d on %s: the model diverged. Lower '
          'INITIAL_LEARNING_RATE (%s/model.py) or --batch_size; the chief\'s last '
          'checkpoint is untouched.' % (loss_value, shown, run.who,
                                        graph.built['model'].__name__))
    if shown // log_frequency != last_shown // log_frequency or local_step == 1:
      examples_per_sec = batch_size * num_towers / duration
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
             ' or the chief' if graph.sync_replicas else ''))


def slow_step_message(run, graph, step_timeout_secs):
  if graph.sync_replicas:
    return ('%s: no averaged update within --step_timeout_secs=%d. Each update waits for '
            '%d gradients, at most one from each worker, and for the chief (worker 0 at '
            '%s) to apply them: check that the chief and at least %d workers are running, '
            'or raise --step_timeout_secs.' % (
                run.who, step_timeout_secs, graph.replicas_to_aggregate, run.chief_host,
                graph.replicas_to_aggregate))
  return ('%s: a step took more than --step_timeout_secs=%d waiting for the ps tasks %s. '
          'Check that they are running, or raise --step_timeout_secs.'
          % (run.who, step_timeout_secs, ','.join(run.ps_hosts)))


def enter_private_network():
  """Moves this process into a new network namespace whose only interface is loopback.

  Linux only. Every process started from here on shares it: the tasks reach each
  other on 127.0.0.1, and no one outside the namespace, not even another process
  on this machine, can reach their ports. TensorFlow's servers listen on all
  interfaces; here the only one is loopback. As root this needs CLONE_NEWNET
  alone; otherwise a user namespace too (CLONE_NEWUSER), mapping this user to
  itself, which Linux grants only to a single-threaded process.

  Returns:
    None once inside, or why it was not possible (str) and nothing has changed.

  Raises:
    TrainingError: the namespace was made but its loopback could not be brought up.
  """
  if not sys.platform.startswith('linux'):
    return 'network namespaces are Linux only'
  libc = ctypes.CDLL(None, use_errno=True)
  as_root = os.geteuid() == 0
  if libc.unshare(CLONE_NEWNET if as_root else CLONE_NEWUSER | CLONE_NEWNET) != 0:
    error = ctypes.get_errno()
    threads = len(os.listdir('/proc/self/task'))
    if not as_root and error == errno.EINVAL and threads > 1:
      return ('a user namespace needs a single-threaded process, and TensorFlow has '
              'started %d threads in this one; run as root to get one' % threads)
    return 'unshare(%s) failed: %s' % ('CLONE_NEWNET' if as_root else
                                       'CLONE_NEWUSER | CLONE_NEWNET', os.strerror(error))
  try:
    if not as_root:  # this user stays itself inside; setgroups must go before gid_map
      for name, text in (('setgroups', 'deny'), ('uid_map', '%d %d 1' % ((os.geteuid(),) * 2)),
                         ('gid_map', '%d %d 1' % ((os.getegid(),) * 2))):
        with open('/proc/self/%s' % name, 'w') as f:
          f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
      ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack('16sh22x', b'lo', 0))
      lo_flags = struct.unpack('16sh22x', ifreq)[1]
      fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack('16sh22x', b'lo', lo_flags | IFF_UP))
  except OSError as e:
    raise TrainingError('--local_cluster made a private network namespace but could not '
                        'bring its loopback interface up: %s' % e) from None
  return None


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


def launch_local_cluster(num_ps, num_workers, extra_flags, stop):
  """Runs num_ps ps tasks and num_workers workers on 127.0.0.1, printing their logs.

  Returns 0 once every worker has exited 0, 1 as soon as any task fails. On a stop
  signal the chief stops first, saving at its current step (the ps tasks hold its
  variables, and in sync mode its update waits for the other workers), then the
  rest; returns stop.exit_code. Every task still running is then stopped: the ps
  tasks always are, as they never exit.
  """
  ports = free_ports(num_ps + num_workers)
  ps_hosts = ['127.0.0.1:%d' % p for p in ports[:num_ps]]
  worker_hosts = ['127.0.0.1:%d' % p for p in ports[num_ps:]]
  print('local cluster: ps %s, workers %s' % (','.join(ps_hosts), ','.join(worker_hosts)),
        flush=True)
  relay = Relay()
  tasks = {}  # 'ps0' -> Popen, in start order
  # One process group of their own: a Ctrl-C in the terminal reaches this launcher
  # alone, which stops the tasks in order. They die with it (DIE_WITH_LAUNCHER_ENV).
  env = dict(os.environ, **{DIE_WITH_LAUNCHER_ENV: str(os.getpid())})
  try:
    for job_name, hosts in (('ps', ps_hosts), ('worker', worker_hosts)):
      for i in range(len(hosts)):
        name = '%s%d' % (job_name, i)
        tasks[name] = subprocess.Popen(
            task_command(job_name, i, ps_hosts, worker_hosts, extra_flags), env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, process_group=tasks['ps0'].pid if tasks else 0)
        relay.start(name, tasks[name].stdout)
    while not stop.requested:
      ended = {name: p.returncode for name, p in tasks.items() if p.poll() is not None}
      failed = [name for name, code in ended.items()
                if code != 0 or name.startswith('ps')]
      if failed:
        relay.show_held()
        print('local cluster: %s exited with %d; stopping the other tasks'
              % (failed[0], ended[failed[0]]), flush=True)
        return 1
      if len(ended) == num_workers:
        print('local cluster: all %d workers finished; stopping the ps tasks' % num_workers,
              flush=True)
        return 0
      time.sleep(0.2)
    stop_chief(tasks['worker0'], stop)
    return stop.exit_code
  finally:
    stop_tasks(tasks.values())
    relay.join()


def stop_chief(chief, stop):
  """Passes the stop signal on to the chief and waits for it to save and exit."""
  print('local cluster: %s: stopping worker 0, the chief, which saves at its current '
        'step; then the other tasks' % stop.name, flush=True)
  if chief.poll() is None:
    chief.send_signal(stop.signum)
    try:
      chief.wait(STOP_CHIEF_SECS)
    except subprocess.TimeoutExpired:
      print('local cluster: the chief has not stopped within %d s; stopping every task '
            'without its checkpoint' % STOP_CHIEF_SECS, flush=True)


def stop_tasks(processes):
  """SIGTERM to every process still running, SIGKILL to those left after STOP_TASKS_SECS."""
  for process in processes:
    if process.poll() is None:
      process.terminate()
  deadline = time.time() + STOP_TASKS_SECS
  for process in processes:
    try:
      process.wait(max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


class Relay:
  """Prints each task's output, line by line, as '[worker1] ...'.

  Lines TensorFlow prints in every normal run that look like errors and are not
  (QUIET_LINES, and all but FINAL_LINEs once a worker closes its session) are held
  back; show_held() prints them when a task has failed, where they may say why.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._readers, self._held = [], []
    self._finishing = False  # a worker closes its session: the others' steps are cancelled
    self._quiet = re.compile('|'.join(QUIET_LINES + (
        [] if glob.glob('/dev/nvidia*') else NO_GPU_LINES)))

  def start(self, name, stream):
    self._readers.append(threading.Thread(target=self._relay, args=(name, stream),
                                          daemon=True))
    self._readers[-1].start()

  def _relay(self, name, stream):
    held = False  # a held line's continuation lines start with a tab
    for line in stream:
      final = FINAL_LINE.match(line)
      held = not final and (self._finishing or bool(self._quiet.search(line)) or
                            (held and line.startswith('\t')))
      if final and 'closing the session' in line:
        self._finishing = True
      with self._lock:
        if held:
          self._held.append('[%s] %s' % (name, line))
        else:
          sys.stdout.write('[%s] %s' % (name, line))
          sys.stdout.flush()

  def show_held(self):
    with self._lock:
      if self._held:
        print('local cluster: TensorFlow lines held back until now:\n%s'
              % ''.join(self._held), end='', flush=True)
      self._held = []

  def join(self):
    for reader in self._readers:
      reader.join(STOP_TASKS_SECS)


def die_with_launcher():
  """A --local_cluster task: dies with its launcher, however the launcher ends."""
  launcher = os.environ.get(DIE_WITH_LAUNCHER_ENV)
  if launcher and sys.platform.startswith('linux'):
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(launcher):  # it died before prctl
      os._exit(1)


def main(argv):
  del argv  # absl has already refused unknown flags
  # First, so that no Ctrl-C or SIGTERM is lost: a worker finishes its step, the
  # chief saves. ps tasks keep Python's default: they hold nothing of their own.
  stop = training_run.StopSignals(FLAGS.train_dir) if FLAGS.job_name == 'worker' else None
  die_with_launcher()
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
  if FLAGS.local_cluster:
    sys.exit(main_local_cluster())
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
  if DIE_WITH_LAUNCHER_ENV not in os.environ:  # --local_cluster has said what applies
    print(SECURITY_WARNING % ('port %s of this machine (this task, %s %d)' % (
        hosts[FLAGS.task_index].rpartition(':')[2], FLAGS.job_name, FLAGS.task_index)),
          flush=True)
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
                              inter_op_threads=FLAGS.inter_op_threads),
          stop=stop, dataset=FLAGS.dataset)
  except (TrainingError, multi_gpu_train.TrainingError, input_lib.DataError) as e:
    sys.exit('error: %s' % e)
  except training_run.Stopped as e:  # train() has saved and said so
    sys.exit(e.exit_code)
  except KeyboardInterrupt:  # a second signal: stop now, without saving
    sys.exit('Stopped by a second %s without saving; the last checkpoint in %s is '
             'untouched.' % (stop.name, FLAGS.train_dir))


def main_local_cluster():
  """--local_cluster=P,W: checks, the data, a private network, the tasks; the exit code."""
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
    try:  # once, here, rather than racing in every worker; before leaving the network
      data_input = multi_gpu_train.DATASETS[FLAGS.dataset].input
      data_input.prepare(FLAGS.data_dir, FLAGS.data_url, FLAGS.data_md5)
    except input_lib.DataError as e:
      sys.exit('error: %s' % e)
  try:
    why_not = enter_private_network()
  except TrainingError as e:
    sys.exit('error: %s' % e)
  if why_not:
    print('%s\nlocal cluster: the tasks cannot have a private network here (%s): their '
          'ports are open on every interface of this machine while they run.'
          % (SECURITY_WARNING % 'the ports listed below', why_not), flush=True)
  else:
    print('local cluster: the tasks run in a private network namespace whose only '
          'interface is loopback: nothing outside it, on this machine or another, can '
          'reach their ports.', flush=True)
  passed = {}  # every flag given on this command line goes to every task
  for name in FLAGS:
    flag = FLAGS[name]
    if flag.present and flag.name not in LAUNCHER_FLAGS:
      passed[flag.name] = flag.serialize()
  stop = training_run.StopSignals()
  try:
    return launch_local_cluster(num_ps, num_workers, list(passed.values()), stop)
  except KeyboardInterrupt:  # a second signal
    print('local cluster: stopped by a second %s: every task was stopped, the chief '
          'perhaps before it saved' % stop.name, flush=True)
    return stop.exit_code


if __name__ == '__main__':
  training_run.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
