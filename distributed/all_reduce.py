"""Synchronous training without ps tasks: every worker keeps its own copy of the
variables, and the workers average their gradients by TensorFlow's collective
all-reduce, so that every copy takes the same update.

dist_train.py --all_reduce makes the mode once and asks it what worker_updates'
modes answer (see there), and:

    mode = AllReduceUpdates(run, save_every_n_steps)
    mode.step_feed(stop)             # each step says whether this worker is stopping
    mode.start_together(run_fetch, secs)  # before the first step: the chief's variables
    mode.after_step(run_fetch, outcome, secs)  # the stop all agreed on; copies compared
    mode.stops_before_step(stop)     # the loop ends after the step all agreed on

Each step all-reduces (mean) this worker's gradient, its towers averaged first
(multi_gpu_train.py's average_gradients), every variable's flattened into two vectors
(mean_of_workers), with a flag per worker that says it is stopping. Every worker gets
the same sums, so every copy applies the same update, bit for bit; the copies are
compared anyway at each save (compare_copies). A worker's port must reach every other
worker's: the ring sends each a share of the others' gradients.

A worker that goes away fails the others' next step, at once when its process has
gone (UnavailableError), at --step_timeout_secs when it hangs; TensorFlow's collective
executor is then aborted for the life of the process (its own words: "Restart your
program to reset"), so the others exit PEER_GONE_EXIT_CODE, and the job is rerun with
the same commands: the chief restores its checkpoint and sends it to every worker.
Nothing here reads flags.
"""
import contextlib
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import collective_ops  # tf.raw_ops' without its keys' bookkeeping

from distributed import chief, worker_sessions, worker_updates
from training import errors, mixed_precision, updates

GROUP_KEY = 1                # the collective group: every worker of the job
FROM_CHIEF_KEY = 1           # the collectives' instance keys, one per op: the start's ...
GRADIENTS_KEY = 2            # ... each step's gradients of the last layers ...
COMPARE_KEY = 3              # ... each save's comparison of the copies ...
LATE_GRADIENTS_KEY = 4       # ... and each step's gradients of the first layers
STEP_SLACK_SECS = 1          # a step's watchdog, past --step_timeout_secs: TensorFlow's timeout
                             # aborts the collective at once, and the step then waited 8 s
                             # more on a paused worker (tests/test_dist_all_reduce.py,
                             # 2026-12-02); the process can do nothing after an abort
OWN_COPY_SAVE_SECS = 5       # a stopping chief, cut off from the workers, saves its copy within
# What a collective raises once a worker has gone away (or since, once aborted); a
# worker killed before this one's request to it waits out the timeout (gRPC waits for
# the peer to come back).
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
               tf.errors.InternalError, tf.errors.DeadlineExceededError)
RERUN = ('Restart every worker with the same command: they resume from the chief\'s '
         'checkpoint')


def chief_device_scope():
  """Where the shared run state of run_match (what the chief trains, who joined) lives
  without ps tasks: on the chief's CPU, which every worker reaches."""
  return tf.compat.v1.device('/job:worker/task:0/cpu:0')


def mean_of_workers(grads_and_vars, flags, num_workers):
  """([(the mean over the workers of each gradient, variable)], the mean of `flags`).

  Two collective all-reduces, each of one float32 vector: first the gradients that
  backprop finishes first (the model's last layers, which hold most of the bytes:
  local3's weights are 83% of CIFAR-10's) with the flags, then the rest (the
  convolutions), so that the first crosses the network while the convolutions'
  gradients, most of a step's time, are computed. The ring moves 2 (n - 1) / n of the
  4.27 MB through each worker's link per step.
  """
  for grad, var in grads_and_vars:
    if isinstance(grad, tf.IndexedSlices):
      raise ValueError('%s has a sparse gradient; all-reduce sends dense ones' % var.name)
  late, early = _by_backprop_order(grads_and_vars)
  means, flags_mean = [], None
  for key, bucket, extra in ((GRADIENTS_KEY, late, flags), (LATE_GRADIENTS_KEY, early, None)):
    grads = [grad for grad, _ in bucket]
    tail = [extra] if extra is not None else []
    if not grads + tail:
      continue  # a model of one variable
    packed = tf.concat([tf.reshape(grad, [-1]) for grad in grads] + tail, 0)
    mean = collective_ops.all_reduce(packed, num_workers, GROUP_KEY, key, merge_op='Add',
                                     final_op='Div')
    parts = tf.split(mean, [grad.shape.num_elements() for grad in grads] +
                     [num_workers] * len(tail))
    means += [(tf.reshape(part, grad.shape), var)
              for part, (grad, var) in zip(parts, bucket)]
    if tail:
      flags_mean = parts[-1]
  order = {var.ref(): i for i, (_, var) in enumerate(grads_and_vars)}
  return sorted(means, key=lambda pair: order[pair[1].ref()]), flags_mean


def _by_backprop_order(grads_and_vars):
  """(the gradients backprop finishes first, holding at least half the bytes; the rest).
  Backprop runs from the model's last layer to its first: the last variables made."""
  total = sum(grad.shape.num_elements() for grad, _ in grads_and_vars)
  first, size = [], 0
  for pair in reversed(grads_and_vars):
    if size * 2 >= total:
      break
    first.append(pair)
    size += pair[0].shape.num_elements()
  return first, grads_and_vars[:len(grads_and_vars) - len(first)]


def from_chief(variables, is_chief, num_workers):
  """An op setting every worker's `variables` to the chief's: an all-reduce (sum) to which
  the chief gives its values and every other worker zeros, in float64, exact for the
  float32 weights and the int64 global step alike."""
  flat = [tf.reshape(tf.cast(var.read_value(), tf.float64), [-1]) for var in variables]
  sizes = [var.shape.num_elements() for var in variables]
  own = tf.concat(flat, 0) if is_chief else tf.zeros([sum(sizes)], tf.float64)
  chiefs = collective_ops.all_reduce(own, num_workers, GROUP_KEY, FROM_CHIEF_KEY,
                                     merge_op='Add', final_op='Id')
  return tf.group(*[var.assign(tf.cast(tf.reshape(part, var.shape), var.dtype.base_dtype))
                    for part, var in zip(tf.split(chiefs, sizes), variables)],
                  name='variables_from_chief')


def compare_copies(variables, num_workers):
  """(this worker's checksum of `variables`, [the largest of all workers', minus the
  smallest]): the copies are the same where both equal it. The checksum is the sum of
  every float32's bits read as an int32 (and every integer), in float64: exact, and
  moved by any one bit of any variable."""
  sums = []
  for var in variables:
    value = var.read_value()
    if value.dtype == tf.float32:
      value = tf.bitcast(value, tf.int32)
    sums.append(tf.reduce_sum(tf.cast(value, tf.float64)))
  checksum = tf.add_n(sums)
  extremes = collective_ops.all_reduce(tf.stack([checksum, -checksum]), num_workers,
                                       GROUP_KEY, COMPARE_KEY, merge_op='Max', final_op='Id')
  return checksum, extremes


class AllReduceUpdates(worker_updates.AppliedByEachWorker):
  """Every worker applies the mean of all workers' gradients to its own variables, then
  its moving averages, then counts the update: one global step per step, the same on
  every worker."""
  update_name = 'update'  # of num_workers worker steps
  step_slack_secs = STEP_SLACK_SECS
  stuck_on = 'the other workers do not answer'

  def __init__(self, run, save_every_n_steps):
    self._run = run  # dist_train.py's WorkerRun
    self.gradients_per_update = run.num_workers
    self._save_every_n_steps = save_every_n_steps
    self._stopping = self._from_chief = self._compare = None  # made by build()
    self._max_steps = None  # build()'s: the last save, compared too
    self.stopped_by = []   # the workers whose stop ended the loop, once all agreed on it

  def build(self, opt, grads, global_step, model, max_steps, fp16=None):
    """The all-reduce, then the update; an Update.

    fp16 (worker_updates.Fp16): every worker checks the mean, not its own gradient, so
    all skip the same updates (an inf or NaN anywhere is in the mean) and keep the
    same loss scale.
    """
    run = self._run
    n = run.num_workers
    self._max_steps = max_steps
    self._stopping = tf.compat.v1.placeholder_with_default(tf.zeros([n]), [n],
                                                           name='workers_stopping')
    mean, stopping = mean_of_workers(grads, self._stopping, n)
    # Every copy reaches max_steps at the same step: the hook stops them together.
    update = self.applied_update(
        lambda: updates.apply_average_count(opt, mean, global_step, model),
        fp16 and mixed_precision.all_finite(mean), global_step, max_steps, fp16, stopping)
    copies = tf.compat.v1.global_variables()  # the model, its averages, the step, fp16's scale
    self._from_chief = from_chief(copies, run.is_chief, n)
    self._compare = compare_copies(copies, n)
    return update

  def step_feed(self, stop):
    """This step's flags: this worker's set once it is asked to stop."""
    if not stop.requested:
      return None
    flags = np.zeros([self._run.num_workers], np.float32)
    flags[self._run.task_index] = 1
    return {self._stopping: flags}

  def wait_for_workers(self, match, run_fetch, timeout_secs, should_stop):
    """The chief, before the first step: every worker joined (or one refused, named)."""
    if self._run.is_chief and self._run.num_workers > 1:
      match.wait_for_workers(run_fetch, self._run.who, timeout_secs, should_stop)

  def start_together(self, run_fetch, timeout_secs):
    """Every worker, before its first step: its variables become the chief's (restored
    or initialised), so that every copy starts from the same point."""
    run = self._run
    try:
      run_fetch(self._from_chief, options=tf.compat.v1.RunOptions(
          timeout_in_ms=timeout_secs * 1000))
    except tf.errors.DeadlineExceededError:
      raise errors.PeerGone(
          '%s: the chief\'s variables did not reach every worker within '
          '--startup_timeout_secs=%d: %s. %s, or raise --startup_timeout_secs.' % (
              run.who, timeout_secs, self._missing_workers(), RERUN)) from None
    print('%s: %s' % (run.who, 'its variables sent to every worker' if run.is_chief else
                      'its variables are the chief\'s'), flush=True)

  def after_step(self, run_fetch, outcome, timeout_secs):
    """After each step: the stop all agreed on, and at each step the chief saves (every
    --save_every_n_steps, the last, a stop's) the copies compared. errors.TrainingError
    when they differ."""
    self.stopped_by = [i for i, flag in enumerate(outcome.stopping) if flag > 0]
    step = outcome.step_after
    saved = (step % self._save_every_n_steps == 0 or step >= self._max_steps or
             self.stopped_by)
    if not saved:
      return
    try:  # a collective as the step's, timed out as it
      checksum, extremes = run_fetch(self._compare, options=tf.compat.v1.RunOptions(
          timeout_in_ms=timeout_secs * 1000))
    except tf.errors.DeadlineExceededError:
      raise errors.PeerGone(self.slow_step_message(timeout_secs)) from None
    highest, lowest = extremes[0], -extremes[1]
    if highest != lowest:
      raise errors.TrainingError(
          '%s: the workers\' copies of the variables differ after global step %d (checksums '
          '%r to %r, this worker\'s %r): an update was not the same on every worker. Rerun '
          'the same commands: every worker starts again from the chief\'s checkpoint.'
          % (self._run.who, step, lowest, highest, checksum))

  def stops_before_step(self, stop):
    del stop  # a stopping worker's next step carries its flag to the others
    return bool(self.stopped_by)

  def step_stopped_at(self, match, run_fetch, run):
    del match, run_fetch, run
    return None  # every copy stopped after the same update: this worker's global step

  def save_own_copy(self, graph):
    """The chief: a function that saves its own copy of the variables and returns the
    step saved (None if it could not within OWN_COPY_SAVE_SECS), for a stop whose step
    never returns, cut off from the other workers (worker_sessions.watch_stopping_step).

    That step's update waits on its all-reduce, so the copy is the one after the
    update before. A session of its own, filtered to this task: opening it asks no
    other worker.
    """
    run = self._run
    if not run.is_chief:
      return None
    saves, tf_graph = chief.saves(graph), tf.compat.v1.get_default_graph()
    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(run.config)
    config.device_filters[:] = ['/job:worker/task:%d' % run.task_index]

    def save(sess):
      saves.end(sess)  # saves the step, unless it is the last one saved
      return saves.last_saved
    return lambda: worker_sessions.in_session_of_its_own(run.server.target, tf_graph, config,
                                                         save, OWN_COPY_SAVE_SECS)

  def fp16_line(self):
    return worker_updates.loss_scale_line('every worker alike, from the mean')

  def mode_line(self, batch_size, num_towers):
    n = self._run.num_workers
    return ('all-reduce: each update averages %d gradients of %d images (%d x %d towers), '
            'one from each worker, by a collective all-reduce between the workers (no ps '
            'task); every worker applies it to its own copy of the variables, so a worker '
            'that goes away stops the others at once, or at --step_timeout_secs'
            % (n, batch_size * num_towers, batch_size, num_towers))

  def ended_early_message(self, step, max_steps):
    if self.stopped_by:
      why = ('worker(s) %s were stopped by a signal, and every worker stopped after the '
             'same update, which the chief saved' % ', '.join(map(str, self.stopped_by)))
    else:
      why = 'the chief ended the session'
    return worker_updates.ended_early(self._run, step, max_steps, why)

  @contextlib.contextmanager
  def peers_failing(self):
    """Around the session: a collective failed by a worker's going away is PeerGone, in
    one line naming the workers that no longer answer."""
    try:
      yield
    except PEER_ERRORS as e:
      raise errors.PeerGone(self._peer_gone_message(e)) from None

  def _peer_gone_message(self, e):
    said = re.search(r'(Socket closed|Connection refused|aborted by: [^\n]*|'
                     r'Failed to connect[^\n]*|Operation timed out)', str(e))
    return ('%s: a step\'s all-reduce failed (%s: %s): %s. TensorFlow\'s collectives cannot go '
            'on in this process. %s.' % (
                self._run.who, type(e).__name__, said.group(1) if said else errors.one_line(e),
                self._gone_workers() or 'every worker\'s port still answers: one of them '
                'failed (its log says why)', RERUN))

  def _gone_workers(self):
    """'worker 1 (host:port) no longer answers', or '' when every other worker's port
    accepts a connection (a paused process's does too: its kernel answers)."""
    run = self._run
    gone = ['worker %d (%s)' % (i, host)
            for i, host in enumerate(run.cluster.job_tasks('worker'))
            if i != run.task_index and not worker_sessions.port_answers(host)]
    return gone and '%s no longer answer%s' % (', '.join(gone), 's' * (len(gone) == 1))

  def _missing_workers(self, look=True):
    """Those whose ports no longer answer (look=False: no port looked at), or that a
    worker has stopped or is cut off."""
    return (look and self._gone_workers()) or 'a worker of %s has stopped or is cut off' % (
        ','.join(self._run.cluster.job_tasks('worker')))

  def stuck_step_message(self, secs):
    """The watchdog's, armed before every step: said as it is, no port looked at."""
    return self._slow_step(secs - STEP_SLACK_SECS, look=False)

  def slow_step_message(self, step_timeout_secs):
    return self._slow_step(step_timeout_secs)

  def _slow_step(self, step_timeout_secs, look=True):
    return ('%s: the all-reduce of a step took more than --step_timeout_secs=%d: %s. %s, or '
            'raise --step_timeout_secs.' % (self._run.who, step_timeout_secs,
                                            self._missing_workers(look), RERUN))
