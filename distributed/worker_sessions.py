"""A distributed worker's sessions: opened, waited for, reopened, and what the chief writes.

dist_train.py's workers open their sessions through these:

    wait_for_peers(hosts, secs, who)   # their ports answer (ps tasks, or workers), or PeerGone
    arm = start_watchdog()             # exits 138 when a wait inside TensorFlow hangs
    open_session(run, graph, ...)      # the MonitoredSession, through one of these:
    ChiefSessions(...), WorkerSessions(...)  # MonitoredSession's session creators
    SaveCheckpoints(...), WriteSummaries(...)  # the chief's hooks: training/'s files

A ps task that goes away (killed, restarted) aborts every worker's step;
MonitoredSession then asks the creator for a new session, and these wait for the
ps tasks to answer again and say so, the chief restoring its latest checkpoint.
Nothing here builds a model or reads flags.
"""
import contextlib
import os
import socket
import sys
import threading
import time

import tensorflow as tf
from tensorflow.python.training import monitored_session  # its base, for SessionNotReopened

from training import checkpoints, errors, mixed_precision, signals, steps, summaries

WATCHDOG_SLACK_SECS = 30     # past a deadline, a task stuck inside TensorFlow exits
STEP_SLACK_SECS = 8          # ... a step, this long past --step_timeout_secs: a step cut off
                             # from the ps tasks by the network (packets dropped) is not
                             # ended by TensorFlow's own timeout, which waits on them (a
                             # chief ended by the watchdog at 35 s, timeout 5 s:
                             # tests/test_dist_network.py, 2026-12-02); the slack is for the
                             # sync message's read (OP_RUNNER_SECS)
RECOVERY_WAIT_SECS = 1       # a non-chief looks this often for the chief's variables
STOP_STEP_SECS = 2           # sync, stopping: a step still waiting this long is released
OP_RUNNER_SECS = 3           # a token handed out, or the ps tasks' state read, in this long
CLOSED_SESSION_TRIES = 3     # a fetch asked again of a session MonitoredSession reopened
STOPPED_WORKER_SECS = 22     # a stopped non-chief still running this long after its step
                             # exits (inside the 30 s before Slurm's or Kubernetes' SIGKILL)
END_SAVE_TRIES = 5           # the chief's last save, again while other workers move the step
STOP_CHECK_SECS = 2          # a worker awaiting the chief looks for a stop this often
QUEUE_RUNNER_STOP_SECS = 2   # sync chief: its queue runner waits in take_grad for gradients
                             # that never come; closing the session, after this, ends it
# What a step, the session's close or its reopening raise once the ps tasks are gone.
PS_GONE_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                  tf.errors.CancelledError, errors.PeerGone)


def wait_for_peers(hosts, timeout_secs, who, should_stop=None, what='ps task'):
  """Returns once every one of hosts (the ps tasks) accepts TCP connections; PeerGone
  after timeout_secs, or at once when should_stop() says this task is stopping.

  TensorFlow itself would wait forever, silently, to open a session on a ps task
  that is not there. what='worker': the other workers, for all-reduce.
  """
  deadline = time.time() + timeout_secs
  missing = list(hosts)
  flag = '--ps_hosts' if what == 'ps task' else '--worker_hosts'
  while True:
    missing = [host for host in missing if not port_answers(host)]
    if not missing:
      return
    if should_stop is not None and should_stop():
      raise errors.PeerGone('%s was asked to stop while the %s(s) at %s did not '
                            'answer' % (who, what, ', '.join(missing)))
    if time.time() > deadline:
      raise errors.PeerGone(
          '%s waited %d s for the %s(s) at %s: nothing accepts connections there. '
          'Start them first (python dist_train.py --job_name=%s --task_index=i with the same '
          '--ps_hosts and --worker_hosts), check %s, or raise --startup_timeout_secs.'
          % (who, timeout_secs, what, ', '.join(missing), what.split()[0], flag))
    time.sleep(0.5)


def without_hooks(sess, step_fn):
  """step_fn(raw session) run through MonitoredSession.run_step_fn, without the hooks.

  When the ps tasks' connection fails in it, MonitoredSession opens a new session and
  calls step_fn again, but with the session it first had, closed by then: 'Attempted
  to use a closed Session' (seen after TCP resets toward a ps task, a worker restarted
  while they ended). Asked again, run_step_fn hands it the new session.
  """
  for tries_left in reversed(range(CLOSED_SESSION_TRIES)):
    try:
      return sess.run_step_fn(lambda step_context: step_fn(step_context.session))
    except RuntimeError as e:
      if 'closed Session' not in str(e) or not tries_left:
        raise


def port_answers(host):
  """Whether 'host:port' accepts a TCP connection within 1 s."""
  name, _, port = host.rpartition(':')
  try:
    socket.create_connection((name.strip('[]'), int(port)), timeout=1).close()
    return True
  except OSError:
    return False


def open_session(run, graph, settings, startup_timeout_secs, stop):
  """dist_train.py's MonitoredSession: the chief initialises or restores, saves and
  summarises.

  What MonitoredTrainingSession builds, with session creators that say what
  happened and wait for the ps tasks when a session must be reopened (unless a
  stop was asked for: then they raise errors.PeerGone at once). Without ps tasks
  (all-reduce) every worker initialises its own copy, and no session is reopened:
  after a failed collective TensorFlow needs a new process.
  """
  tf.get_logger().addFilter(not_said_on_reopening)
  secs = startup_timeout_secs + WATCHDOG_SLACK_SECS
  peers = run.ps_hosts or [host for host in run.cluster.job_tasks('worker')
                           if host != run.cluster.task_address('worker', run.task_index)]
  run.arm_watchdog(secs, '%s could not open a session with the %s %s within %d s. '
                   'Check that they are running and reachable, or raise '
                   '--startup_timeout_secs.' % (run.who, 'ps tasks' if run.ps_hosts else
                                                'workers', ','.join(peers), secs))
  if run.is_chief:
    # fp16: also a float32 run's checkpoint; built before MonitoredSession finalizes the graph
    restore_fp16 = (mixed_precision.restorer(tf.compat.v1.global_variables())
                    if settings.use_fp16 else None)
    creator = ChiefSessions(
        run.who, run.ps_hosts, startup_timeout_secs, run.arm_watchdog, settings.train_dir,
        restore_fp16, lambda: stop.requested,
        scaffold=graph.scaffold, master=run.server.target, config=run.config,
        # The checkpoint start() found and read whole, not the state file's latest.
        checkpoint_filename_with_path=run.checkpoint)
  elif not run.ps_hosts:  # its own copy, which becomes the chief's before the first step
    creator = tf.compat.v1.train.ChiefSessionCreator(
        scaffold=graph.scaffold, master=run.server.target, config=run.config)
  else:
    creator = WorkerSessions(
        run.who, run.ps_hosts, run.chief_host, startup_timeout_secs, run.arm_watchdog,
        graph.scaffold, run.server.target, run.config, lambda: stop.requested)
  if not run.ps_hosts:
    return SessionNotReopened(creator, graph.hooks, QUEUE_RUNNER_STOP_SECS)
  return tf.compat.v1.train.MonitoredSession(
      session_creator=creator, hooks=graph.hooks,
      stop_grace_period_secs=QUEUE_RUNNER_STOP_SECS)


class SessionNotReopened(monitored_session._MonitoredSession):  # pylint: disable=protected-access
  """MonitoredSession that lets a failed step's error through instead of opening a new
  session (should_recover=False, as TensorFlow's SingularMonitoredSession): all-reduce's
  collectives, once aborted by a worker's going away, stay aborted in this process."""

  def __init__(self, session_creator, hooks, stop_grace_period_secs):
    super().__init__(session_creator, hooks, should_recover=False,
                     stop_grace_period_secs=stop_grace_period_secs)


class ChiefSessions(tf.compat.v1.train.ChiefSessionCreator):
  """The chief's sessions: each initialises or restores the variables, unless the ps
  tasks still hold them all.

  MonitoredSession opens another when a step fails because a ps task went away, or
  the network dropped the connection (AbortedError, UnavailableError): it waits for
  the ps tasks to answer again. Whatever the session, first or reopened, it restores
  a checkpoint only when the ps tasks lost their variables (a ps task that restarted:
  some are uninitialised there); a ps task that only went out of reach, or a chief
  restarted while the ps tasks served on, finds them live, at a global step the other
  workers may have moved on since the checkpoint, and goes on from it. TensorFlow's
  SessionManager decides the same way for a non-chief; its chief restores always.

  fp16: restore_fp16 (mixed_precision.restorer's) restores, after everything is
  initialised, so that a float32 run's checkpoint (no loss_scale/) resumes too.
  """

  def __init__(self, who, ps_hosts, timeout_secs, arm_watchdog, train_dir, restore_fp16,
               should_stop, **kwargs):
    super().__init__(**kwargs)
    self._who, self._ps_hosts, self._timeout_secs = who, ps_hosts, timeout_secs
    self._arm_watchdog, self._train_dir, self._opened = arm_watchdog, train_dir, 0
    self._restore_fp16, self._should_stop = restore_fp16, should_stop

  def create_session(self):
    if self._opened:
      say_reopening(self._who, self._ps_hosts, self._timeout_secs, self._arm_watchdog,
                    'goes on from the variables the ps tasks hold, or restores the latest '
                    'checkpoint into ps tasks that restarted', self._should_stop)
      # The newest of this directory's checkpoints that reads whole, found as at start.
      self._checkpoint_filename_with_path = checkpoints.checkpoint_to_resume(
          self._train_dir)[0]
    self._opened += 1
    path = self._checkpoint_filename_with_path
    with quiet_deprecations():  # of the Saver's restore
      live = self._session_if_variables_live(path)
      if live is not None:
        return live
      if self._opened > 1 and path:
        print('%s: the ps tasks restarted: restoring step %d from %s' % (
            self._who, checkpoints.checkpoint_step(path), path), flush=True)
      if not (self._restore_fp16 and path):
        return super().create_session()
      self._scaffold.finalize()
      return self._get_session_manager().prepare_session(
          self._master, config=self._config, init_op=self._scaffold.init_op,
          init_fn=lambda sess: self._restore_into(sess, path))

  def _session_if_variables_live(self, path):
    """A session on the ps tasks' variables, if every one is initialised there (then
    said, with the global step); else None."""
    self._scaffold.finalize()
    try:
      sess = self._get_session_manager().wait_for_session(
          self._master, config=self._config, max_wait_secs=0)
    except tf.errors.DeadlineExceededError:
      return None  # uninitialised: a new job, or a ps task that restarted
    step = sess.run(tf.compat.v1.train.get_global_step())
    print('%s: the ps tasks still hold the variables, at global step %d: going on from '
          'it%s' % (self._who, step, ', not from %s' % path if path else ''), flush=True)
    return sess

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
               master, config, should_stop):
    self._who, self._ps_hosts, self._chief_host = who, ps_hosts, chief_host
    self._timeout_secs, self._arm_watchdog = timeout_secs, arm_watchdog
    self._scaffold, self._master, self._config = scaffold, master, config
    self._opened, self._should_stop = 0, should_stop

  def create_session(self):
    if self._opened:
      say_reopening(self._who, self._ps_hosts, self._timeout_secs, self._arm_watchdog,
                    'waits for the chief (which restores them if the ps tasks restarted)',
                    self._should_stop)
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
    deadline = time.time() + self._timeout_secs
    while True:  # in slices, so that a stop is heard while the chief is awaited
      try:
        return manager.wait_for_session(
            self._master, config=self._config,
            max_wait_secs=max(min(STOP_CHECK_SECS, deadline - time.time()), 0))
      except tf.errors.DeadlineExceededError:
        if self._should_stop():
          raise errors.PeerGone('%s was asked to stop while it waited for the chief'
                                % self._who) from None
        if time.time() >= deadline:
          raise errors.PeerGone(
              '%s waited %d s for the chief (worker 0 at %s) to %s the variables on the ps '
              'tasks. Start worker 0 (or look at its log for an error), or raise '
              '--startup_timeout_secs.' % (self._who, self._timeout_secs, self._chief_host,
                                           'restore' if self._opened > 1 else
                                           'initialise or restore')) from None


def not_said_on_reopening(record):
  """A logging filter: False for MonitoredSession's error on closing a session that a
  ps task's leaving aborted; say_reopening says what happened, in one line."""
  return not record.getMessage().startswith(
      'An error occurred when attempting to close the session')


def say_reopening(who, ps_hosts, timeout_secs, arm_watchdog, then, should_stop):
  """After a ps task went away: says so, waits for the ps tasks to answer again;
  PeerGone at once for a task that is stopping (its ps tasks stopped with it)."""
  if should_stop():
    raise errors.PeerGone('%s: the session was aborted while stopping: the ps tasks (%s) '
                          'have left' % (who, ','.join(ps_hosts)))
  print('%s: the session was aborted: a ps task (%s) went away or restarted, or the '
        'network dropped its connection. Waiting up to %d s for the ps tasks to answer; '
        'then this worker %s.' % (who, ','.join(ps_hosts), timeout_secs, then), flush=True)
  arm_watchdog(2 * timeout_secs + WATCHDOG_SLACK_SECS,
               '%s could not open a new session with the ps tasks %s within %d s. Check '
               'that they are running, or raise --startup_timeout_secs.'
               % (who, ','.join(ps_hosts), 2 * timeout_secs + WATCHDOG_SLACK_SECS))
  wait_for_peers(ps_hosts, timeout_secs, who, should_stop)


class Progress:
  """Where a worker's loop is: the global step it last saw, its own steps so far, and
  an Event set while a step runs (for watch_stopping_step)."""

  def __init__(self, step):
    self.step, self.local_step, self.stepping = step, 0, threading.Event()


def watch_stopping_step(stop, progress, who, is_chief, release=None, save=None,
                        stuck_on='the ps tasks have left', after_secs=STOP_STEP_SECS):
  """Once a stop is asked for, sees that the step under way ends; starts a daemon thread.

  Stopped together (a whole job preempted), the workers each finish the step they
  are in. Sync: a step begun just before the others stopped waits for an update
  that needs their gradients, until --step_timeout_secs, long past any
  orchestrator's grace period, and the chief would never save. After after_secs,
  release() hands it a token, so that it returns (its gradient stays in the
  accumulators, stale to any later update). A step still running after_secs later
  waits on peers that have left (stuck_on says which): the task then says where it
  stopped and exits with the signal's code, as it would have after the step; first,
  save() saves what it can.

  Args:
    stop: a StopSignals; progress: the loop's Progress.
    release: sync: a function of no arguments that hands this worker a token; else None.
    save: all-reduce's chief: a function of no arguments that saves its own copy of the
      variables and returns the step saved (None if it could not); else None.
    stuck_on: what the stuck step waits for, for the task's last line.
  """
  def watch():
    while not stop.requested:
      time.sleep(0.2)
    if release and not _step_ends(progress, after_secs):
      print('%s: stopping, its step still waits %g s on, for workers that have stopped: '
            'it hands itself a token' % (who, after_secs), flush=True)
      release()
    if not _step_ends(progress, after_secs):
      _exit_stopped(stop, progress, is_chief, 'its last step never returned (%s)' % stuck_on,
                    save and save(), who)
    if not is_chief:  # nothing to save: its close must not outlast the grace period
      time.sleep(STOPPED_WORKER_SECS)
      _exit_stopped(stop, progress, is_chief, 'its session did not close (%s)' % stuck_on)

  threading.Thread(target=watch, daemon=True, name='watch_stopping_step').start()


def _exit_stopped(stop, progress, is_chief, what, saved=None, who=None):
  """The stopped task's line and exit code, from a thread: the main thread is stuck.
  saved: the step of the checkpoint `who`, the chief, wrote of its own copy just now."""
  if saved is not None:  # then the line of a stop after a step
    line = ('%s: %s; its own copy of the variables is saved at step %d.\n'
            'Stopped by %s at step %d; rerun the same command to resume.\n'
            % (who, what, saved, stop.name, saved))
  else:
    line = ('Stopped by %s at step %d%s; %s. Rerun the same command to resume%s.\n' % (
        stop.name, progress.step, ' without saving it' if is_chief else '', what,
        ' from the last checkpoint' if is_chief else ''))
  os.write(1, line.encode())  # not print(): the main thread may hold stdout's lock
  signals.exit_now(stop.exit_code)


def _step_ends(progress, secs):
  """Whether no step runs, or the one running ends, within secs."""
  deadline = time.time() + secs
  while progress.stepping.is_set() and time.time() < deadline:
    time.sleep(0.1)
  return not progress.stepping.is_set()


def op_runner(target, config, fetches, timeout_secs=OP_RUNNER_SECS):
  """A function that runs fetches once in a session of its own and returns what they
  fetched; None where the ps tasks are gone, or do not answer within timeout_secs.

  Opening the session sends the graph to the ps tasks (ExtendSession) with no deadline
  TensorFlow keeps, and a sync worker cut off from the ps tasks, stopping, waited there
  until its watchdog ended it, 46 s after the SIGTERM (exit 138, not 143: issue 60's
  run, each task in a namespace of its own, iptables DROP between worker and ps).
  """
  graph = tf.nest.flatten(fetches)[0].graph
  options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
  return lambda: in_session_of_its_own(
      target, graph, config, lambda sess: sess.run(fetches, options=options), timeout_secs)


def in_session_of_its_own(target, graph, config, work, timeout_secs):
  """work(session) in a new session of graph on target, in a daemon thread waited for
  timeout_secs; what it returned, or None (a TensorFlow error, or still running)."""
  found = []

  def run_once():
    try:
      with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
        found.append(work(sess))
    except tf.errors.OpError:
      pass

  running = threading.Thread(target=run_once, daemon=True, name='in_session_of_its_own')
  running.start()
  running.join(timeout_secs)
  return found[0] if found else None


def start_watchdog():
  """Exits the process when a wait outlives its deadline; returns arm(secs, message).

  The backstop for the waits TensorFlow cannot time out itself: opening a session
  on a task that has gone away, and MonitoredSession reopening one after a ps
  task failed. It exits PEER_GONE_EXIT_CODE: a peer went away, restart this task.
  arm(None, '') disarms.
  """
  state = {'deadline': None, 'message': ''}

  def watch():
    while True:
      time.sleep(1)
      deadline, message = state['deadline'], state['message']
      if deadline and time.time() > deadline:
        print('error: %s' % message, file=sys.stderr, flush=True)
        # The main thread is stuck inside TensorFlow: no clean way out.
        signals.exit_now(errors.PEER_GONE_EXIT_CODE)

  threading.Thread(target=watch, daemon=True).start()

  def arm(secs, message):
    state.update(deadline=time.time() + secs if secs else None, message=message)
  return arm


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



class SaveCheckpoints(tf.compat.v1.train.SessionRunHook):
  """The chief's checkpoints, through the same machinery as multi_gpu_train.py's.

  checkpoints.save_if_finite writes them: never with a NaN or infinite variable,
  rotation within --train_dir only, the state file with relative names, and a
  failed write that stops the run with one line instead of going on. Saved as the
  session opens (unless that step's checkpoint is the one restored), every
  save_every_n_steps global steps, and at the end.
  """

  def __init__(self, train_dir, save_every_n_steps, keep, saver, global_step, all_finite,
               model_name, resumed_step):
    """all_finite: checkpoints.all_variables_finite(); resumed_step: the step of the
    checkpoint the chief restores, or None."""
    self._train_dir, self._every, self._keep = train_dir, save_every_n_steps, keep
    self._saver, self._global_step = saver, global_step
    self._all_finite, self._model_name = all_finite, model_name
    self.last_saved = resumed_step  # the newest checkpoint on disk, or None

  def after_create_session(self, session, coord):
    del coord
    step = session.run(self._global_step)
    if step != self.last_saved:  # a reopened session restores the last one saved
      self._save(session, step)

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    # The step read within the step's run may precede its own update (+1): a save
    # may be due only if it is due by then. Only then is the step read again, for
    # the checkpoint's name: no second round trip to the ps on the other steps.
    if self.last_saved is not None and not steps.crossed(
        self.last_saved, run_values.results + 1, self._every):
      return
    step = run_context.session.run(self._global_step)
    if steps.crossed(self.last_saved, step, self._every):
      self._save(run_context.session, step)

  def end(self, session):
    # Async, the other workers' last updates may land while the chief saves: saved
    # again until the step holds still, the newest checkpoint holds the step its name
    # says (a few tries: the others are stopping or done too).
    for _ in range(END_SAVE_TRIES):
      step = session.run(self._global_step)
      if step == self.last_saved:
        return
      self._save(session, step)

  def _save(self, session, step):
    self.last_saved = checkpoints.save_if_finite(
        session, self._saver, self._train_dir, step, self._keep, self._all_finite,
        self._model_name, self.last_saved)


class WriteSummaries(tf.compat.v1.train.SessionRunHook):
  """The chief's TensorBoard summaries, through the single-machine trainer's machinery.

  summaries.SummaryWriter writes them: a failed write is said once, plainly,
  and training goes on. The event file opens with the run record; then the
  summary op runs with the step every summary_steps global steps, and beside it
  examples_per_sec: the median of the chief's steps since the last summary that
  computed none (SummaryWriter.write_summary), examples_per_step images each.
  """

  def __init__(self, train_dir, summary_steps, summary_op, global_step, record,
               examples_per_step):
    self._train_dir, self._every = train_dir, summary_steps
    self._summary_op, self._global_step, self._record = summary_op, global_step, record
    self._examples_per_step, self._started = examples_per_step, None
    self._writer, self._last, self._due = None, None, True

  def after_create_session(self, session, coord):
    del coord
    if self._writer is None:  # the first session; a reopened one writes on
      self._writer = summaries.start_writer(self._train_dir, session.graph, self._record,
                                            self._record['start_step'])

  def before_run(self, run_context):
    del run_context
    fetches = {'step': self._global_step}
    if self._due:
      fetches['summary'] = self._summary_op
    self._started = time.time()
    return tf.compat.v1.train.SessionRunArgs(fetches)

  def after_run(self, run_context, run_values):
    del run_context
    duration = time.time() - self._started
    step = run_values.results['step']
    if 'summary' in run_values.results:
      self._writer.write_summary(run_values.results['summary'], step)
      self._last = step
    else:
      self._writer.note_speed(self._examples_per_step / duration)
    self._due = self._last is None or steps.crossed(self._last, step, self._every)

  def end(self, session):
    step = session.run(self._global_step)
    if step != self._last:  # every run ends with a summary of where it stopped
      self._writer.write_summary(session.run(self._summary_op), step)
    self._writer.close()
