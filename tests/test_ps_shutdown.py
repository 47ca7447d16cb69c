"""ps_shutdown.py: real TensorFlow servers on 127.0.0.1 in this process.

Each test starts its own servers on free loopback ports (a server cannot be
stopped in-process, and a fresh one holds a fresh queue); a ps task waits in a
thread while worker servers report, as their processes would at the end.
"""
import threading
import time

import tensorflow as tf

import helpers
from distributed.local_cluster import free_ports
from distributed import ps_shutdown

WAIT_SECS = 60  # a wait that ends in well under a second has failed by then


def start_cluster(num_ps, num_workers):
  """(ps servers, worker servers) of one cluster on 127.0.0.1."""
  ports = free_ports(num_ps + num_workers)
  cluster = tf.train.ClusterSpec({
      'ps': ['127.0.0.1:%d' % p for p in ports[:num_ps]],
      'worker': ['127.0.0.1:%d' % p for p in ports[num_ps:]]})
  ps = [tf.compat.v1.train.Server(cluster, job_name='ps', task_index=i) for i in range(num_ps)]
  workers = [tf.compat.v1.train.Server(cluster, job_name='worker', task_index=i)
             for i in range(num_workers)]
  return ps, workers


class Waiting:
  """wait_for_workers on a thread: .result, .elapsed and the lines it logged."""

  def __init__(self, server, ps_index, num_workers, **kwargs):
    self.lines, self.result, self.elapsed = [], None, None
    self._thread = threading.Thread(target=self._wait, daemon=True,
                                    args=(server, ps_index, num_workers), kwargs=kwargs)
    self._start = time.time()
    self._thread.start()

  def _wait(self, *args, **kwargs):
    self.result = ps_shutdown.wait_for_workers(*args, log=self.lines.append, poll_secs=0.1,
                                               **kwargs)
    self.elapsed = time.time() - self._start

  def wait_for_line(self, text):
    """Returns once a logged line ends with text."""
    helpers.wait_until(lambda: any(line.endswith(text) for line in self.lines),
                       'line ending %r in %s' % (text, self.lines), timeout=WAIT_SECS)

  def polled(self, stop, polls):
    """Returns once wait_for_workers has made polls more whole polls, or has returned."""
    calls = stop.calls + polls + 1  # a call starts a poll: the one after polls ended
    helpers.wait_until(lambda: stop.calls >= calls or not self._thread.is_alive(),
                       '%d polls' % polls, timeout=WAIT_SECS)

  def join(self, timeout=WAIT_SECS):
    self._thread.join(timeout)
    assert not self._thread.is_alive(), 'still waiting after %d s: %s' % (timeout, self.lines)
    return self.result


class CountedStop(threading.Event):
  """An event whose check, wait_for_workers' should_stop, counts its calls: one a poll."""

  def __init__(self):
    super().__init__()
    self.calls = 0

  def __call__(self):
    self.calls += 1
    return self.is_set()


def test_wait_for_workers_two_workers_report_every_ps_returns_all():
  ps, workers = start_cluster(num_ps=2, num_workers=2)
  waits = [Waiting(ps[i], i, 2, grace_secs=60) for i in range(2)]
  assert ps_shutdown.report_finished(workers[1].target, 2, 1, timeout_secs=WAIT_SECS)
  for wait in waits:  # each ps has taken worker 1's word, and goes on waiting
    wait.wait_for_line('worker 1 has finished (1 of 2)')
  assert all(w.result is None for w in waits)
  assert ps_shutdown.report_finished(workers[0].target, 2, 0, timeout_secs=WAIT_SECS)
  for i, wait in enumerate(waits):
    assert wait.join() == ps_shutdown.WorkersSeen([0, 1], 'all')
    assert wait.lines == ['ps task %d: worker 1 has finished (1 of 2)' % i,
                          'ps task %d: worker 0 has finished (2 of 2)' % i]
    assert wait.elapsed < 30  # not the chief's grace: every worker said so


def test_wait_for_workers_chief_only_returns_after_grace():
  ps, workers = start_cluster(num_ps=1, num_workers=3)
  wait = Waiting(ps[0], 0, 3, grace_secs=1)
  reported_at = time.time()
  assert ps_shutdown.report_finished(workers[0].target, 1, 0, timeout_secs=WAIT_SECS)
  assert wait.join() == ps_shutdown.WorkersSeen([0], 'grace')
  assert time.time() - reported_at >= 1
  assert wait.lines == ['ps task 0: worker 0 has finished (1 of 3)',
                        'ps task 0: the chief finished 1 s ago; worker(s) 1,2 have not said '
                        'so: ending']


def test_wait_for_workers_without_chief_waits_until_stopped_counting_each_worker_once():
  ps, workers = start_cluster(num_ps=1, num_workers=2)
  stop = CountedStop()
  wait = Waiting(ps[0], 0, 2, grace_secs=0, should_stop=stop, stop_wait_secs=0)
  for _ in range(2):  # a restarted worker 1 says it twice
    assert ps_shutdown.report_finished(workers[1].target, 1, 1, timeout_secs=WAIT_SECS)
  wait.wait_for_line('worker 1 has finished (1 of 2)')
  wait.polled(stop, 5)  # time to end, were a grace period (0 s) started
  assert wait.result is None  # no chief: no grace period starts
  stop.set()
  assert wait.join() == ps_shutdown.WorkersSeen([1], 'stopped')
  assert wait.lines == ['ps task 0: worker 1 has finished (1 of 2)',
                        'ps task 0: asked to stop; serving the chief until it has saved, '
                        'at most 0 s']


def test_wait_for_workers_stopped_serves_until_every_worker_says_it_stopped():
  # A whole job stopped at once: the ps task outlives the chief's save, then leaves.
  ps, workers = start_cluster(num_ps=1, num_workers=2)
  stop = CountedStop()
  stop.set()
  wait = Waiting(ps[0], 0, 2, should_stop=stop, stop_wait_secs=60, others_secs=60)
  wait.wait_for_line('at most 60 s')
  assert ps_shutdown.report_finished(workers[1].target, 1, 1, stopped=True,
                                     timeout_secs=WAIT_SECS)
  wait.wait_for_line('worker 1 stopped on a signal')
  wait.polled(stop, 5)  # the chief has not said it saved
  assert wait.result is None
  assert ps_shutdown.report_finished(workers[0].target, 1, 0, stopped=True,
                                     timeout_secs=WAIT_SECS)
  assert wait.join() == ps_shutdown.WorkersSeen([], 'stopped')
  assert wait.elapsed < 30
  assert wait.lines[-1] == 'ps task 0: worker 0 stopped on a signal, after its save'


def test_wait_for_workers_stopped_chief_saved_others_silent_leaves_after_others_secs():
  ps, workers = start_cluster(num_ps=1, num_workers=3)
  stop = threading.Event()
  stop.set()
  wait = Waiting(ps[0], 0, 3, should_stop=stop.is_set, stop_wait_secs=60, others_secs=1)
  said_at = time.time()
  assert ps_shutdown.report_finished(workers[0].target, 1, 0, stopped=True,
                                     timeout_secs=WAIT_SECS)
  assert wait.join() == ps_shutdown.WorkersSeen([], 'stopped')
  assert 1 <= time.time() - said_at < 30


def test_wait_for_workers_chief_stopped_long_before_the_ps_stop_waits_for_it_again():
  # A chief stopped alone, then restarted: its old word must not let a later stop
  # of the ps leave before the new chief's save.
  ps, workers = start_cluster(num_ps=1, num_workers=1)
  stop = threading.Event()
  wait = Waiting(ps[0], 0, 1, should_stop=stop.is_set, stop_wait_secs=1)
  assert ps_shutdown.report_finished(workers[0].target, 1, 0, stopped=True,
                                     timeout_secs=WAIT_SECS)
  wait.wait_for_line('worker 0 stopped on a signal, after its save')
  time.sleep(1.5)  # past stop_wait_secs: that word is old when the stop comes
  stop.set()
  stopped_at = time.time()
  assert wait.join() == ps_shutdown.WorkersSeen([], 'stopped')
  assert time.time() - stopped_at >= 1  # the whole stop_wait_secs


def test_wait_for_workers_report_before_ps_waits_is_kept():
  ps, workers = start_cluster(num_ps=1, num_workers=1)
  assert ps_shutdown.report_finished(workers[0].target, 1, 0, timeout_secs=WAIT_SECS)
  wait = Waiting(ps[0], 0, 1)
  assert wait.join() == ps_shutdown.WorkersSeen([0], 'all')


def test_report_finished_ps_gone_returns_false_within_timeout():
  # The ps port is free: nothing listens, as after the ps task has ended.
  ps_port, worker_port = free_ports(2)
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:%d' % ps_port],
                                  'worker': ['127.0.0.1:%d' % worker_port]})
  worker = tf.compat.v1.train.Server(cluster, job_name='worker', task_index=0)
  start = time.time()
  assert ps_shutdown.report_finished(worker.target, 1, 0, timeout_secs=1) is False
  assert 1 <= time.time() - start < 30  # its own 1 s, not a wait without end


def test_finished_op_under_replica_device_setter_placed_on_each_ps():
  cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:1', '127.0.0.1:2'],
                                  'worker': ['127.0.0.1:3', '127.0.0.1:4']})
  with tf.Graph().as_default() as graph:
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device='/job:worker/task:1')):
      tf.compat.v1.get_variable('w', [1])  # what replica_device_setter is for
      done = ps_shutdown.finished_op(2, 1)
  enqueues = [op for op in graph.get_operations() if op.type == 'QueueEnqueueV2']
  queues = [op for op in graph.get_operations() if op.type == 'FIFOQueueV2']
  where = lambda op: (tf.DeviceSpec.from_string(op.device).job,
                      tf.DeviceSpec.from_string(op.device).task)
  assert sorted(map(where, enqueues)) == [('ps', 0), ('ps', 1)]
  assert sorted(map(where, queues)) == [('ps', 0), ('ps', 1)]  # on the ps's CPU
  assert sorted(op.get_attr('shared_name') for op in queues) == [
      b'finished_workers_ps0', b'finished_workers_ps1']
  assert queues[0].get_attr('capacity') == -1  # no limit: an enqueue never waits
  # tf.group makes one NoOp per device; running `done` runs both enqueues.
  needed, todo = set(), [done]
  while todo:
    op = todo.pop()
    needed.add(op.name)
    todo.extend(op.control_inputs)
  assert {op.name for op in enqueues} <= needed
