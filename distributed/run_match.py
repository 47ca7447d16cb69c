"""Every worker trains the chief's run, and a sync chief waits for its workers.

Variables on the ps tasks (without ps tasks, all-reduce's, on the chief's own CPU), in
no collection (no checkpoint holds them, no worker's initialisation touches them):
- `run_description`: the chief writes what defines its run each time its session
  opens: the flags below, its model module's constants (fp16's too), the learning
  rate's decay_steps, the md5 of each training file (or --synthetic), and a
  fingerprint of its training graph (tower 0: the model, its loss and its gradients,
  as built, devices aside), which changed code changes. Every other worker
  compares its own before its session opens, and refuses to train another run in
  one line naming the first difference. Before its session: that session waits for
  the chief to initialise every variable the worker has, and one the chief lacks
  (fp16's loss scale, for a worker alone with --use_fp16) kept both waiting.
- `workers_joined`: one flag a worker, set to JOINED once its session is open and its
  comparison passed, to REFUSED when it refused, to STOPPED after its last step on a
  signal. A sync chief waits for every flag before its first step (an update averages
  the first gradients computed from its variables, whichever workers send them, and a
  chief that started first took every one of them itself until the others came), and
  stops in one line, exit 1, when a worker refused.
- `stopped_at`: a whole job stopped at once (every task signalled together: Slurm,
  Kubernetes, a hand-started job) stops together (stop_together): the chief, after its
  last step, waits for every joined worker's STOPPED, then writes the global step
  here and saves that step as its session closes; each other worker reads it, and
  its `Stopped ... at step N` names that step. Before, an async worker's update could
  land after the chief's save, and the worker claimed a step that was never saved.
"""
import hashlib
import json
import os
import time

import tensorflow as tf

from distributed import worker_sessions
from training import errors, input_data, mixed_precision, run_record

# The flags that change what an update computes. Not --num_gpus (machines differ, and
# its effect on the schedule is compared as decay_steps) nor the directories and waits.
COMPARED_FLAGS = ('dataset', 'batch_size', 'max_steps', 'use_fp16', 'use_bf16', 'synthetic')
GRAPH = 'training graph'     # the fingerprint's name in a description
JOINED, STOPPED, REFUSED = 1, 2, -1   # a worker's flag in workers_joined
STOP_TOGETHER_SECS = 5       # stopping, the chief waits this long for the others' last
                             # steps (sync: each released within STOP_STEP_SECS and a token's
                             # OP_RUNNER_SECS); they wait a little longer for its step (within
                             # worker_sessions.STOPPED_WORKER_SECS, and the 30 s grace). With
                             # 8, a sync job stopped while a worker was cut off from the ps
                             # task ended 15.4 s after the signal (tests/test_dist_network.py,
                             # this project's 2-core EPYC, 2026-12-02)
POLL_SECS = 0.2
SHOWN_DIFFERENCES = 3


def describe(settings, worker, data, decay_steps, graph_def):
  """{name: value} of what every worker must share with the chief.

  graph_def: this worker's GraphDef, its towers built (graph_fingerprint).
  """
  described = {'--%s' % name: getattr(settings, name) for name in COMPARED_FLAGS}
  described['--sync_replicas'] = worker.sync_replicas
  described['--replicas_to_aggregate'] = worker.replicas_to_aggregate
  modules = {'%s/model.py' % data.model.__name__: data.model}  # as the run record names it
  if settings.use_fp16:
    modules['training/mixed_precision.py'] = mixed_precision
  for path, module in modules.items():
    for name, value in run_record.constants_of(module).items():
      described['%s %s' % (path, name)] = value
  described['decay_steps'] = decay_steps  # from --batch_size and the towers, per update
  if not settings.synthetic:
    for path in data.input.train_files(settings.data_dir):
      described['md5 of %s' % os.path.basename(path)] = input_data.md5_of(path)
  described[GRAPH] = graph_fingerprint(graph_def, '%s_0/' % data.model.TOWER_NAME)
  return described


def graph_fingerprint(graph_def, scope):
  """A sha256 of the nodes under name scope `scope` (tower 0: what the model's code
  builds, its loss and its gradients): their names, ops, inputs and attributes, with
  devices and colocations, which differ by task, taken out. Hex, 16 digits."""
  digest = hashlib.sha256()
  for node in sorted((n for n in graph_def.node if n.name.startswith(scope)),
                     key=lambda n: n.name):
    digest.update(('%s %s %s\n' % (node.name, node.op, ','.join(node.input))).encode())
    for key in sorted(set(node.attr) - {'_class'}):
      digest.update(key.encode() + node.attr[key].SerializeToString(deterministic=True))
  return digest.hexdigest()[:16]


class RunMatch:
  """The two variables, and this worker's own description and place.

  Build it inside the ps tasks' device scope (replica_device_setter), then publish()
  once the graph is built; the chief's local_init_op runs publish_op.
  """

  def __init__(self, num_workers, task_index, global_step):
    self._num_workers, self._task_index = num_workers, task_index
    self._description = tf.compat.v1.Variable('', trainable=False, collections=[],
                                              name='run_description', dtype=tf.string)
    self._joined = tf.compat.v1.Variable(tf.zeros([num_workers], tf.int32), trainable=False,
                                         collections=[], name='workers_joined')
    self._published = tf.identity(tf.compat.v1.is_variable_initialized(self._description))
    self._stopped_at = tf.compat.v1.Variable(tf.constant(-1, tf.int64), trainable=False,
                                             collections=[], name='stopped_at')
    self._join_op, self._refuse_op, self._stop_op = [
        tf.compat.v1.scatter_update(self._joined, [task_index], [flag])
        for flag in (JOINED, REFUSED, STOPPED)]
    self._say_stopped_at = self._stopped_at.assign(global_step)
    self.described, self.publish_op = None, None

  def publish(self, described):
    """Takes this worker's description (describe()); builds publish_op, the chief's."""
    self.described = _as_shown(described)
    with tf.control_dependencies([self._keep_or_clear_joined(self._num_workers),
                                  self._stopped_at.initializer]):  # not stopped, in this run
      self.publish_op = self._description.assign(json.dumps(described, sort_keys=True))

  def _keep_or_clear_joined(self, num_workers):
    """The flags, kept when a restarted chief finds them (its workers joined before)."""
    def clear():
      with tf.control_dependencies([self._joined.assign(tf.zeros([num_workers], tf.int32))]):
        return tf.constant(True)
    return tf.cond(tf.compat.v1.is_variable_initialized(self._joined),
                   lambda: tf.constant(True), clear)

  def compare_before_session(self, run, timeout_secs):
    """A non-chief, before its session opens: reads the chief's description in a
    session of its own; raises errors.TrainingError naming what differs (having set
    its flag to REFUSED, so that a sync chief stops too), or PeerGone if the chief has
    published nothing within timeout_secs. The chief: nothing to do.

    run: dist_train.py's WorkerRun.
    """
    if run.is_chief:
      return
    run.arm_watchdog(timeout_secs + worker_sessions.WATCHDOG_SLACK_SECS,
                     '%s: reading what the chief trains, on the ps tasks %s, hung' % (
                         run.who, ','.join(run.ps_hosts)))
    with tf.compat.v1.Session(run.server.target, config=run.config) as sess:
      differences = self._differences(sess.run, run.who, run.chief_host, timeout_secs)
      if differences:
        sess.run(self._refuse_op)
    run.arm_watchdog(None, '')
    if differences:
      more = len(differences) - SHOWN_DIFFERENCES
      raise errors.TrainingError(
          '%s does not train what the chief (worker 0 at %s) trains: %s%s. Start every '
          'task from the same code and the same flags.' % (
              run.who, run.chief_host, '; '.join(differences[:SHOWN_DIFFERENCES]),
              ' (and %d more)' % more if more > 0 else ''))

  def before_first_step(self, run_fetch, run, mode, timeout_secs, should_stop):
    """A worker joins (compare_before_session passed); the sync chief waits for the
    others to join (mode.wait_for_workers).

    run: dist_train.py's WorkerRun; mode: its AsyncUpdates or SyncUpdates.
    """
    # A wait of its own: the session's opening may have used most of its deadline.
    run.arm_watchdog(timeout_secs + worker_sessions.WATCHDOG_SLACK_SECS,
                     '%s: reading what the chief trains, on the ps tasks %s, hung' % (
                         run.who, ','.join(run.ps_hosts)))
    if run.is_chief:
      mode.wait_for_workers(self, run_fetch, timeout_secs, should_stop)
    else:
      run_fetch(self._join_op)

  def stop_together(self, run_fetch, run, timeout_secs=STOP_TOGETHER_SECS):
    """After the loop of a worker stopped by a signal, its session still open: the step
    the chief saves, or None if the chief has not said it in time (a worker stopped
    alone: its line then names its own last step).

    The chief waits up to timeout_secs for every other joined worker's last step, then
    says the global step, which its session's close saves. Another worker says it has
    stopped, then waits a little longer for that step.
    """
    if not run.is_chief:
      run_fetch(self._stop_op)
      deadline = time.time() + timeout_secs + 2
      while time.time() < deadline:
        step = run_fetch(self._stopped_at)
        if step >= 0:
          return int(step)
        time.sleep(POLL_SECS)
      print('%s: the chief has not said within %d s which step it saves; the step below '
            'is this worker\'s last' % (run.who, timeout_secs + 2), flush=True)
      return None
    deadline = time.time() + timeout_secs
    while True:
      stepping = [i for i, flag in enumerate(run_fetch(self._joined))
                  if flag == JOINED and i != self._task_index]
      if not stepping:
        break
      if time.time() > deadline:
        print('%s: worker(s) %s still training %d s after the stop; saving without '
              'waiting for them (their later updates are not in this save)' % (
                  run.who, ', '.join(map(str, stepping)), timeout_secs), flush=True)
        break
      time.sleep(POLL_SECS)
    return int(run_fetch(self._say_stopped_at))

  def _differences(self, run_fetch, who, chief_host, timeout_secs):
    """What differs from the chief's description, in words, the graph last and only
    when nothing else explains it; PeerGone if it is not published in time."""
    deadline = time.time() + timeout_secs
    while not run_fetch(self._published):
      if time.time() > deadline:
        raise errors.PeerGone(
            '%s: the chief (worker 0 at %s) has not said what it trains within %d s; '
            'start every task from the same version of this program' % (
                who, chief_host, timeout_secs))
      time.sleep(POLL_SECS)
    chiefs = _as_shown(json.loads(run_fetch(self._description).decode()))
    differences = ['%s is %s here and %s on the chief' % (
                       name, self.described.get(name, 'unset'), chiefs.get(name, 'unset'))
                   for name in sorted(set(chiefs) | set(self.described))
                   if chiefs.get(name) != self.described.get(name) and name != GRAPH]
    if not differences and chiefs.get(GRAPH) != self.described.get(GRAPH):
      differences.append('its training graph (tower 0: the model, its loss and gradients, '
                         'devices aside) is not the chief\'s: the code differs')
    return differences

  def wait_for_workers(self, run_fetch, who, timeout_secs, should_stop):
    """The sync chief: returns once every other worker has joined, or at once when
    should_stop() (it then saves and stops); PeerGone after timeout_secs."""
    deadline = time.time() + timeout_secs
    said = False
    while not should_stop():
      flags = run_fetch(self._joined)
      refused = [i for i, joined in enumerate(flags) if joined == REFUSED]
      if refused:
        raise errors.TrainingError(
            '%s: worker(s) %s refused to join: they do not train what this chief trains '
            '(their own error line says what differs). Start every task from the same '
            'code and the same flags.' % (who, ', '.join(map(str, refused))))
      missing = [i for i, joined in enumerate(flags)  # STOPPED: in an earlier session
                 if joined != JOINED and i != self._task_index]
      if not missing:
        return
      if time.time() > deadline:
        raise errors.PeerGone(
            '%s waited %d s for worker(s) %s to join. In sync mode each update is meant '
            'to average a gradient from each worker; without them the chief would '
            'average its own, several to an update. Start every worker in '
            '--worker_hosts (or look at their logs), name only those that run, give '
            '--replicas_to_aggregate to average fewer (backup workers), or train async '
            '(without --sync_replicas).' % (who, timeout_secs,
                                            ', '.join(map(str, missing))))
      if not said:
        print('%s: sync: waiting for worker(s) %s to join, up to %d s' % (
            who, ', '.join(map(str, missing)), timeout_secs), flush=True)
        said = True
      time.sleep(POLL_SECS)


def _as_shown(described):
  """{name: its value as JSON text}: compared as text, a NaN equals itself and a tuple
  equals the list it comes back as."""
  return {name: json.dumps(value, sort_keys=True) for name, value in described.items()}
