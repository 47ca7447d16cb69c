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
the job. Both sides build the same queue, by name (shared_name) on the same
device, /job:ps/task:i, so they reach the same one in the ps task's memory.
"""
import collections
import threading
import time

import tensorflow as tf

GRACE_SECS = 30            # after the chief reports, the ps tasks wait this long for the rest
POLL_SECS = 0.5            # a ps task looks at its queue this often; a stop is seen as often
REPORT_TIMEOUT_SECS = 30   # a worker gives up saying it has finished to a ps that is gone

WorkersSeen = collections.namedtuple('WorkersSeen', [
    'reported',  # sorted worker indexes that said they finished
    'why',       # 'all': every worker reported; 'grace': the chief did, and GRACE_SECS
                 # passed; 'stopped': should_stop() said so first
])


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


def finished_op(num_ps, worker_index):
  """The op that tells every ps task this worker has finished: one enqueue each.

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
      enqueues.append(queue.enqueue(tf.constant(worker_index, tf.int32)))
  return tf.group(*enqueues, name='worker%d_finished' % worker_index)


def report_finished(target, num_ps, worker_index, config=None,
                    timeout_secs=REPORT_TIMEOUT_SECS):
  """Tells every ps task this worker has finished; False if not within timeout_secs.

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
      op = finished_op(num_ps, worker_index)
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
      sess.run(op, options=tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000)))
    done.append(True)

  # Daemon: a thread still waiting on a ps that is gone must not hold the exit.
  thread = threading.Thread(target=report, daemon=True, name='report_finished')
  thread.start()
  thread.join(timeout_secs)
  return bool(done)


def wait_for_workers(server, ps_index, num_workers, grace_secs=GRACE_SECS,
                     should_stop=None, log=print, poll_secs=POLL_SECS):
  """A ps task's wait for the end of training: returns what it saw.

  Opens a session on this ps task's own server that sees only this task, and
  looks at its queue every poll_secs, in Python, where Ctrl-C and should_stop
  are heard. Returns when every worker has reported, when the chief has
  reported and grace_secs have passed since, or when should_stop() is true.

  Args:
    server: this ps task's tf.compat.v1.train.Server.
    ps_index: int, this ps task.
    num_workers: int, the workers of the cluster; worker 0 is the chief.
    grace_secs: float, how long the others may take after the chief.
    should_stop: callable -> bool, or None; e.g. a StopSignals' `requested`.
    log: callable(str), for a line per report and one at the end.
    poll_secs: float, between looks at the queue.

  Returns:
    WorkersSeen(reported, why).
  """
  with tf.Graph().as_default() as graph:
    queue = finished_queue(ps_index)
    reports = queue.dequeue_many(queue.size())  # never waits: only this task dequeues
  config = tf.compat.v1.ConfigProto(device_filters=['/job:ps/task:%d' % ps_index])
  reported, chief_at = set(), None
  with tf.compat.v1.Session(server.target, graph=graph, config=config) as sess:
    while True:
      for worker in sess.run(reports):
        worker = int(worker)
        if worker not in reported:
          reported.add(worker)
          log('ps task %d: worker %d has finished (%d of %d)'
              % (ps_index, worker, len(reported & set(range(num_workers))), num_workers))
      if set(range(num_workers)) <= reported:
        return WorkersSeen(sorted(reported), 'all')
      if 0 in reported:
        chief_at = chief_at or time.time()
        if time.time() - chief_at >= grace_secs:
          missing = sorted(set(range(num_workers)) - reported)
          log('ps task %d: the chief finished %g s ago; worker(s) %s have not said so: '
              'ending' % (ps_index, grace_secs, ','.join(map(str, missing))))
          return WorkersSeen(sorted(reported), 'grace')
      if should_stop is not None and should_stop():
        return WorkersSeen(sorted(reported), 'stopped')
      time.sleep(poll_secs)
