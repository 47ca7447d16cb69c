"""Every worker trains the chief's model, and a sync chief waits for its workers.

Two variables on the ps tasks, in no collection (no checkpoint holds them, no
worker's initialisation touches them):
- `run_description`: the chief writes what defines its run (its model module's
  constants, fp16's, and the flags below) each time its session opens. Every
  other worker compares its own before its first step and refuses to train
  another model in one line. Without this, a worker built from another
  LAYER1_NODE died in a long traceback at its first step while the chief trained
  on, and one with another learning rate was never noticed.
- `workers_joined`: one flag a worker, set once its comparison passed. A sync
  chief waits for every flag before its first step: an update averages the first
  gradients computed from its variables, whichever workers send them, and a chief
  that started first took every one of them itself until the others came.
"""
import json
import time

import tensorflow as tf

from distributed import worker_sessions
from training import errors, mixed_precision, run_record

# The flags that change what an update computes. Not --num_gpus (machines differ) nor
# the directories and waits (each task's own).
COMPARED_FLAGS = ('dataset', 'batch_size', 'max_steps', 'use_fp16', 'use_bf16')
POLL_SECS = 0.2
SHOWN_DIFFERENCES = 3


def describe(settings, worker, data):
  """{name: value} of what every worker must share with the chief."""
  described = {'--%s' % name: getattr(settings, name) for name in COMPARED_FLAGS}
  described['--sync_replicas'] = worker.sync_replicas
  described['--replicas_to_aggregate'] = worker.replicas_to_aggregate
  modules = {'%s/model.py' % data.model.__name__: data.model}  # as the run record names it
  if settings.use_fp16:
    modules['training/mixed_precision.py'] = mixed_precision
  for path, module in modules.items():
    for name, value in run_record.constants_of(module).items():
      described['%s %s' % (path, name)] = value
  return described


class RunMatch:
  """The two variables, and this worker's own description and place.

  Build it inside the ps tasks' device scope (replica_device_setter). The chief's
  local_init_op runs publish_op.
  """

  def __init__(self, described, num_workers, task_index):
    self.described = _as_shown(described)
    self._task_index = task_index
    self._description = tf.compat.v1.Variable('', trainable=False, collections=[],
                                              name='run_description', dtype=tf.string)
    self._joined = tf.compat.v1.Variable(tf.zeros([num_workers], tf.int32), trainable=False,
                                         collections=[], name='workers_joined')
    self._published = tf.identity(tf.compat.v1.is_variable_initialized(self._description))
    with tf.control_dependencies([self._keep_or_clear_joined(num_workers)]):
      self.publish_op = self._description.assign(json.dumps(described, sort_keys=True))
    self._join_op = tf.compat.v1.scatter_update(self._joined, [task_index], [1])

  def _keep_or_clear_joined(self, num_workers):
    """The flags, kept when a restarted chief finds them (its workers joined before)."""
    def clear():
      with tf.control_dependencies([self._joined.assign(tf.zeros([num_workers], tf.int32))]):
        return tf.constant(True)
    return tf.cond(tf.compat.v1.is_variable_initialized(self._joined),
                   lambda: tf.constant(True), clear)

  def before_first_step(self, run_fetch, run, mode, timeout_secs, should_stop):
    """A worker checks that it trains the chief's model and joins; the sync chief
    waits for the others to join (mode.wait_for_workers).

    run: dist_train.py's WorkerRun; mode: its AsyncUpdates or SyncUpdates.
    """
    # A wait of its own: the session's opening may have used most of its deadline.
    run.arm_watchdog(timeout_secs + worker_sessions.WATCHDOG_SLACK_SECS,
                     '%s: reading what the chief trains, on the ps tasks %s, hung' % (
                         run.who, ','.join(run.ps_hosts)))
    if run.is_chief:
      mode.wait_for_workers(self, run_fetch, timeout_secs, should_stop)
    else:
      self.join(run_fetch, run.who, run.chief_host, timeout_secs)

  def join(self, run_fetch, who, chief_host, timeout_secs):
    """A non-chief, before its first step: compares, then sets its flag.

    Raises errors.TrainingError naming what differs from the chief's run; PeerGone
    if the chief has published nothing within timeout_secs.
    run_fetch: a function that runs a fetch in this worker's session and returns it.
    """
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
                   if chiefs.get(name) != self.described.get(name)]
    if differences:
      more = len(differences) - SHOWN_DIFFERENCES
      raise errors.TrainingError(
          '%s does not train what the chief (worker 0 at %s) trains: %s%s. Start every '
          'task from the same code and the same flags.' % (
              who, chief_host, '; '.join(differences[:SHOWN_DIFFERENCES]),
              ' (and %d more)' % more if more > 0 else ''))
    run_fetch(self._join_op)

  def wait_for_workers(self, run_fetch, who, timeout_secs, should_stop):
    """The sync chief: returns once every other worker has joined, or at once when
    should_stop() (it then saves and stops); PeerGone after timeout_secs."""
    deadline = time.time() + timeout_secs
    said = False
    while not should_stop():
      missing = [i for i, joined in enumerate(run_fetch(self._joined))
                 if not joined and i != self._task_index]
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
