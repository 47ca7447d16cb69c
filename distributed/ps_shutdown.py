"""A ps task that ends when training ends: each worker says it has finished.

A ps task only serves variables, so it cannot tell when training is over; left
alone it runs until it is killed, and a Slurm step or a Kubernetes job that
waits for every task never ends. Here each ps task holds a queue that each
worker fills once, with its worker index, when it has finished (the chief after
its last checkpoint):

    # worker, after its session is closed (the chief's last save is done):
    ps_shutdown.report_finished(server.target, num_ps, task_index, config)

    # ps task, instead of sleeping until it is killed:
    seen = ps_shutdown.wait_for_workers(server, ps_index, num_workers)

The ps task returns once every worker has reported, or once the chief (worker 0)
has reported and GRACE_SECS have passed without the rest: a worker that died
without a word must not keep the ps tasks waiting forever; the chief speaks for
the job. A chief that gives up (an error: exit 1, or 138 for a peer gone) says so
too, with its exit code, and the ps tasks end at once with the same code: a job
whose chief failed has nothing left to serve, and an orchestrator that restarts
on that code restarts them with it. Both sides build the same queue, by name
(shared_name) on the same
device, /job:ps/task:i, so they reach the same one in the ps task's memory.

A job stopped whole (Slurm's scancel, a time limit, a Kubernetes job deleted) signals
every task at once. The chief's variables live on the ps tasks, so a ps task that
left at once would take the chief's last save with it: asked to stop, a ps task
serves on until the chief says it has stopped (after its save), for at most
STOP_WAIT_SECS. Each worker that stops on a signal says so in the same queue:

    ps_shutdown.report_finished(server.target, num_ps, task_index, config, stopped=True)
"""
import collections
import threading
import time

import tensorflow as tf

GRACE_SECS = 30            # after the chief reports, the ps tasks wait this long for the rest
POLL_SECS = 0.5            # a ps task looks at its queue this often; a stop is seen as often
REPORT_TIMEOUT_SECS = 30   # a worker gives up saying it has finished to a ps that is gone
STOP_WAIT_SECS = 15        # a ps task asked to stop serves the chief's save this long at most
                           # (the chief's stop takes at most run_match.STOP_TOGETHER_SECS and
                           # its save), then exits: inside the 30 s Slurm (KillWait) and
                           # Kubernetes (terminationGracePeriodSeconds) give before SIGKILL,
                           # with room for the exit of a task on a loaded machine
OTHERS_STOP_SECS = 3       # ... then the other workers' last steps and closes this long at
                           # most (a worker closing on a ps task gone would hang there; one
                           # cut off from this task by the network never says it closed:
                           # with 15, its job's ps tasks ended 15.3 s after the signal, the
                           # chief at 8.5; the others close as the chief saves:
                           # tests/test_dist_network.py's whole-job SIGTERM, this project's
                           # 2-core EPYC, 2026-12-02)

WorkersSeen = collections.namedtuple('WorkersSeen', [
    'reported',  # sorted worker indexes that said they finished
    'why',       # 'all': every worker reported; 'grace': the chief did, and GRACE_SECS
                 # passed; 'stopped': should_stop() said so, then the chief stopped
                 # (or STOP_WAIT_SECS passed); 'gave up': the chief gave up
    'chief_exit_code',  # 'gave up': the chief's exit code, which the ps task takes
], defaults=[None])


GAVE_UP = -(1 << 16)         # the chief's word that it gave up: GAVE_UP - its exit code


def queued_value(worker_index, stopped, gave_up=None):
  """What a worker puts in the queue: its index when it has finished training,
  -1 - its index when it stopped on a signal (the chief: after its save), and
  GAVE_UP - its exit code when the chief gave up (a failure: 1, or 138)."""
  if gave_up is not None:
    return GAVE_UP - gave_up
  return -1 - worker_index if stopped else worker_index


def finished_queue(ps_index):
  """ps task ps_index's queue of finished workers' indexes (int32 scalars).

  Built on /job:ps/task:ps_index with a shared_name, so every graph that builds
  it, on any task, reaches the same queue. A negative capacity is no limit, so
  an enqueue never waits, however often restarted workers report.
  """
  with tf.device('/job:ps/task:%d' % ps_index):
    return tf.queue.FIFOQueue(capacity=-1, dtypes=[tf.int32], shapes=[[]],
                              shared_name='finished_workers_ps%d' % ps_index,
                              name='finished_workers_ps%d' % ps_index)


def finished_op(num_ps, worker_index, stopped=False, gave_up=None):
  """The op that tells every ps task this worker has finished (or stopped): one enqueue each.

  Placed on the ps tasks explicitly, so it may be built under the worker's
  replica_device_setter too (which leaves explicit ps devices alone); build it
  before the graph is finalized (MonitoredSession finalizes it).

  Args:
    num_ps: int, the cluster's ps tasks.
    worker_index: int, this worker; 0 is the chief.

  Returns:
    A tf.Operation; run it once, with a timeout (see report_finished).
  """
  enqueues = []
  for ps_index in range(num_ps):
    queue = finished_queue(ps_index)
    with tf.device('/job:ps/task:%d' % ps_index):
      enqueues.append(queue.enqueue(tf.constant(queued_value(worker_index, stopped, gave_up),
                                                tf.int32)))
  return tf.group(*enqueues, name='worker%d_%s' % (worker_index, 'gave_up' if gave_up else
                                                   'stopped' if stopped else 'finished'))


def report_finished(target, num_ps, worker_index, config=None,
                    timeout_secs=REPORT_TIMEOUT_SECS, stopped=False, gave_up=None):
  """Tells every ps task this worker has finished (or stopped, after its last save);
  False if not within timeout_secs.

  Call it at the very end, after the worker's training session is closed: the
  ps tasks may exit as soon as it returns. Builds its own small graph, and runs
  it in a thread: TensorFlow waits without end to open a session on a ps task
  that is gone, and no RunOptions timeout covers that wait.

  Args:
    target: str, this worker's server.target ('grpc://...').
    num_ps, worker_index: as for finished_op.
    config: the worker's tf.compat.v1.ConfigProto, or None for one that sees only
      the ps tasks and this worker.
    timeout_secs: float, how long to try.
    stopped: True: stopped on a signal, not finished (the ps tasks may leave once
      the chief has said so).
    gave_up: the chief's exit code when it gave up: the ps tasks end with it.

  Returns:
    True once every ps task has the report; False when some did not answer in
    time (gone already: nothing waits for this worker there).
  """
  if config is None:
    config = tf.compat.v1.ConfigProto(
        device_filters=['/job:ps', '/job:worker/task:%d' % worker_index])
  done = []

  def report():
    with tf.Graph().as_default() as graph:
      op = finished_op(num_ps, worker_index, stopped, gave_up)
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
      sess.run(op, options=tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000)))
    done.append(True)

  # Daemon: a thread still waiting on a ps that is gone must not hold the exit.
  thread = threading.Thread(target=report, daemon=True, name='report_finished')
  thread.start()
  thread.join(timeout_secs)
  return bool(done)


def wait_for_workers(server, ps_index, num_workers, grace_secs=GRACE_SECS,
                     should_stop=None, log=print, poll_secs=POLL_SECS,
                     stop_wait_secs=STOP_WAIT_SECS, others_secs=OTHERS_STOP_SECS):
  """A ps task's wait for the end of training: returns what it saw.

  Opens a session on this ps task's own server that sees only this task, and
  looks at its queue every poll_secs, in Python, where Ctrl-C and should_stop
  are heard. Returns when every worker has reported, when the chief has
  reported and grace_secs have passed since, or, once should_stop() is true,
  when the chief has said it stopped (within stop_wait_secs before the stop, or
  after it) and the other workers have too (or others_secs have passed since the
  chief), or when stop_wait_secs have passed.

  Args:
    server: this ps task's tf.compat.v1.train.Server.
    ps_index: int, this ps task.
    num_workers: int, the workers of the cluster; worker 0 is the chief.
    grace_secs: float, how long the others may take after the chief.
    should_stop: callable -> bool, or None; e.g. a StopSignals' `requested`.
    log: callable(str), for a line per report and one at the end.
    poll_secs: float, between looks at the queue.
    stop_wait_secs: float, how long a stopped ps task serves the chief's save.
    others_secs: float, how long it then serves the other workers' last steps.

  Returns:
    WorkersSeen(reported, why).
  """
  with tf.Graph().as_default() as graph:
    queue = finished_queue(ps_index)
    reports = queue.dequeue_many(queue.size())  # never waits: only this task dequeues
  config = tf.compat.v1.ConfigProto(device_filters=['/job:ps/task:%d' % ps_index])
  heard, stop_at = Heard(ps_index, num_workers, log), None
  with tf.compat.v1.Session(server.target, graph=graph, config=config) as sess:
    while True:
      # Read before the queue: a chief's word that came with the stop is heard now.
      stopping = should_stop is not None and should_stop()
      heard.take(sess.run(reports))
      if heard.chief_gave_up is not None:
        return WorkersSeen(sorted(heard.finished), 'gave up', heard.chief_gave_up)
      if heard.all_finished():
        return WorkersSeen(sorted(heard.finished), 'all')
      if heard.chief_finished_for(grace_secs):
        return WorkersSeen(sorted(heard.finished), 'grace')
      if stopping:
        if stop_at is None:
          stop_at = time.time()
          log('ps task %d: asked to stop; serving the chief until it has saved, at most '
              '%g s' % (ps_index, stop_wait_secs))
        if heard.all_stopped_since(stop_at - stop_wait_secs, others_secs) or (
            time.time() - stop_at >= stop_wait_secs):
          return WorkersSeen(sorted(heard.finished), 'stopped')
      time.sleep(poll_secs)


class Heard:
  """What the workers have said in one ps task's queue: who finished, and when each
  last said it finished or stopped."""

  def __init__(self, ps_index, num_workers, log):
    self._ps_index, self._num_workers, self._log = ps_index, num_workers, log
    self.finished, self._said_at, self._chief_finished_at = set(), {}, None
    self.chief_gave_up = None  # its exit code, once it said so

  def take(self, values):
    for value in map(int, values):
      if value <= GAVE_UP:
        self.chief_gave_up = GAVE_UP - value
        self._log('ps task %d: the chief gave up (exit %d); nothing is left to serve: '
                  'ending with it' % (self._ps_index, self.chief_gave_up))
        continue
      worker = -1 - value if value < 0 else value  # queued_value's stop, or finish
      self._said_at[worker] = time.time()
      if value < 0:
        self._log('ps task %d: worker %d stopped on a signal%s' % (
            self._ps_index, worker, ', after its save' if worker == 0 else ''))
      elif value not in self.finished:
        self.finished.add(value)
        self._log('ps task %d: worker %d has finished (%d of %d)' % (
            self._ps_index, value, len(self.finished & set(range(self._num_workers))),
            self._num_workers))
    if 0 in self.finished and self._chief_finished_at is None:
      self._chief_finished_at = time.time()

  def all_finished(self):
    return set(range(self._num_workers)) <= self.finished

  def chief_finished_for(self, grace_secs):
    """True, saying so, once the chief has finished grace_secs ago and others have not."""
    at = self._chief_finished_at
    if at is None or time.time() - at < grace_secs:
      return False
    missing = sorted(set(range(self._num_workers)) - self.finished)
    self._log('ps task %d: the chief finished %g s ago; worker(s) %s have not said so: '
              'ending' % (self._ps_index, grace_secs, ','.join(map(str, missing))))
    return True

  def all_stopped_since(self, since, others_secs):
    """Whether the chief has said it stopped or finished at `since` or later, and every
    other worker too, or others_secs have passed since the chief did."""
    recent = {w for w, at in self._said_at.items() if at >= since} | self.finished
    if 0 not in recent:
      return False
    return (set(range(self._num_workers)) <= recent or
            time.time() - self._said_at.get(0, 0) >= others_secs)
