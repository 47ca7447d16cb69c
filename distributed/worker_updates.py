"""How a worker's averaged gradient becomes an update of the variables on the ps tasks,
and what each mode means for the worker's loop and its messages.

dist_train.py's train() makes one of these once, then asks it, never the flags:

    mode = AsyncUpdates(run)         # each worker applies its own gradient, claiming its step
    mode = SyncUpdates(run, n)       # SyncReplicasOptimizer: the chief applies the mean of n
    mode = all_reduce.AllReduceUpdates(run, ...)  # no ps: the workers' all-reduce (its file)

    mode.build(opt, grads, global_step, model, max_steps, fp16)  # the ops: an Update
    mode.shown_step(step, outcome)   # the global step the loss line names
    mode.applied(outcome)            # fp16: says the skips; False: this step's was skipped
    mode.release_workers(sess)       # at the end: the sync chief hands out the last tokens
    mode.release_stopping_step()     # stopping: sync's token for a step left waiting
    mode.handed_own_token(step, outcome)  # ... and whether a step returned on it
    mode.mode_line(...), mode.stuck_step_message(secs), mode.slow_step_message(secs),
    mode.ended_early_message(step, max_steps), mode.fp16_line(),
    mode.gradients_per_update, mode.update_name  # what start-up and the faults say
    mode.step_feed(stop), mode.start_together(...), mode.after_step(...),
    mode.stops_before_step(stop), mode.step_stopped_at(...)  # ModeDefaults: all-reduce's

With --use_fp16 a gradient that overflowed is not applied: async, by the worker
that computed it; sync, by the chief's queue runner, which checks the aggregate.
Nothing here reads flags.
"""
import collections
import contextlib
import typing

import tensorflow as tf

from distributed import worker_sessions
from training import mixed_precision, steps, updates


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
      worker_sessions.quiet_deprecations(), tf.compat.v1.colocate_with(global_step):
    # count_up_to's notice ('use Dataset.range') does not apply: this counter is a
    # variable on the ps that every worker shares, which no Dataset can be.
    claim = tf.compat.v1.count_up_to(global_step, max_steps)
  with tf.control_dependencies([claim]):
    return opt.apply_gradients(grads)  # counted by the claim


class SyncReplicas(tf.compat.v1.train.SyncReplicasOptimizer):
  """SyncReplicasOptimizer, its local step kept on this worker, its end quiet, and
  without backup workers a token queue for each worker.

  The tokens: TensorFlow's optimizer hands out the tokens of an update through one
  queue that every worker takes from, so that with backup workers a fast worker takes
  a slow one's place. Without backups that lets an update hold two gradients of one
  worker and none of another: a worker killed after it had pushed its gradient,
  before it took its token, left that token in the queue, and the chief took it and
  trained on alone, two of its own gradients to an update. With replicas_to_aggregate
  equal to the workers, each worker takes its tokens from a queue of its own
  (sync_token_q_worker_<i>, on the ps), and each update puts one token in each: a
  worker sends one gradient per update, so an update holds one from each, and a
  worker that has gone away, whatever it was doing, holds up the next update until
  the others' steps time out (--step_timeout_secs). Each worker also writes the local
  step its gradient was computed at in `gradients_at` (int64 [workers], on the ps),
  which names the workers an update still waits for (SyncUpdates._missing_workers).

  Placement: SyncReplicasOptimizer puts its token queue and gradient accumulators
  beside global_step (on the ps) with tf.device() scopes of its own, and leaves
  its per-worker local step unplaced, where replica_device_setter would put it on
  the ps: one variable shared by every worker. apply_gradients() builds under this
  worker's device alone, where the optimizer's own scopes still put the queue on
  the ps.

  The end: the chief's queue runner waits in take_grad for gradients; closing
  the session cancels that wait, which is the normal end, not an error. It
  never closes the token queue, as TensorFlow's queue runner does when its
  session closes: the queue lives on the ps, shared by name, beyond this chief.
  Closed, it stays closed until the ps restarts: the workers waiting on it
  would take the close for the end of training (OutOfRangeError), and a chief
  restarted after a stop, the ps still up, could hand out no token again
  (CancelledError: FIFOQueue 'sync_token_q' is closed).

  The moving averages: stepped inside the update, before the tokens go out and
  before the global step counts it (ThenAverage). Given to the base as
  variable_averages, they would be stepped after it has handed out the tokens: a
  chief whose last step returned on its token could save while they were one
  update behind.

  fp16 (loss_scale given): the queue runner applies the aggregated gradient
  through SkipOverflow, which also steps the moving averages, only when it is
  finite.
  """

  def __init__(self, opt, replicas_to_aggregate, total_num_replicas, task_index,
               model, loss_scale=None):
    super().__init__(opt, replicas_to_aggregate=replicas_to_aggregate,
                     total_num_replicas=total_num_replicas)
    self._task_index = task_index
    self._worker_device = '/job:worker/task:%d' % task_index
    self.queue_per_worker = replicas_to_aggregate == total_num_replicas
    self.gradients_at = None  # made with the update, where there is a queue per worker
    self.skip_overflow = None
    # What the base's apply_gradients applies the aggregate with, on the queue runner.
    if loss_scale:
      self.skip_overflow = self._opt = SkipOverflow(opt, model, loss_scale,
                                                    self._accumulator_list)
    else:
      self._opt = ThenAverage(opt, model)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    # device(None) drops the enclosing device functions; the ops given no device
    # of their own (the local step) stay on this worker.
    with tf.compat.v1.device(None), tf.compat.v1.device(self._worker_device), \
        worker_sessions.quiet_deprecations():  # of the QueueRunner it makes
      if not self.queue_per_worker:
        return super().apply_gradients(grads_and_vars, global_step, name)
      return self._apply_with_queue_per_worker(list(grads_and_vars), global_step)

  def _apply_with_queue_per_worker(self, grads_and_vars, global_step):
    """The base's apply_gradients, its tokens in a queue per worker: this worker's step
    pushes its gradient into each variable's accumulator, notes the local step it was
    computed at, and waits for a token in its own queue; the chief's queue runner takes
    the mean of replicas_to_aggregate gradients of each, applies it, and puts the new
    global step in every worker's queue. Returns this worker's step op."""
    self._global_step = global_step
    self._local_step = tf.compat.v1.Variable(
        0, trainable=False, dtype=global_step.dtype.base_dtype, name='sync_rep_local_step',
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])  # on this worker
    self.ready_for_local_init_op = tf.compat.v1.report_uninitialized_variables(
        tf.compat.v1.global_variables())
    self.ready_for_local_init_op.mark_used()  # by the base's hook, once a session opens
    pushes, aggregated = self._accumulate(grads_and_vars)
    with tf.compat.v1.device(global_step.device):
      update = self._opt.apply_gradients(aggregated, global_step)
      self._token_queues = [
          tf.queue.FIFOQueue(-1, global_step.dtype.base_dtype, shapes=(),
                             name='sync_token_q_worker_%d' % i,
                             shared_name='sync_token_q_worker_%d' % i)
          for i in range(self._total_num_replicas)]
      self._sync_token_queue = self._token_queues[self._task_index]
      # A new session's first gradient is computed at the global step; tokens left
      # in this worker's queue by an earlier run of it would let it send a second.
      left = self._sync_token_queue.dequeue_up_to(self._sync_token_queue.size())
      # -1: no gradient yet. In no collection: the chief's start sets it, as the
      # accumulators' steps, and a checkpoint neither holds nor needs it.
      self.gradients_at = tf.compat.v1.Variable(
          tf.fill([self._total_num_replicas], tf.constant(-1, global_step.dtype.base_dtype)),
          trainable=False, collections=[], name='sync_gradients_at')
      with tf.control_dependencies(pushes):
        noted = tf.compat.v1.scatter_update(self.gradients_at, [self._task_index],
                                            [self._local_step.read_value()])
      with tf.control_dependencies([noted]):
        train_op = self._local_step.assign(self._sync_token_queue.dequeue())
      with tf.control_dependencies([update]):
        hand_out = self.tokens_for_every_worker()
    self._chief_queue_runner = tf.compat.v1.train.QueueRunner(self._sync_token_queue,
                                                              [hand_out])
    self.local_step_init_op = tf.group(self._local_step.assign(global_step), left)
    chief_init = [self.local_step_init_op, self.gradients_at.initializer]
    for accumulator, device in self._accumulator_list:
      with tf.compat.v1.device(device):
        chief_init.append(accumulator.set_global_step(global_step))
    self.chief_init_op = tf.group(*chief_init)
    self._gradients_applied = True
    return train_op

  def _accumulate(self, grads_and_vars):
    """Beside each variable, the accumulator of its workers' gradients (the base's, by
    the same shared name): (this worker's pushes, [(the mean of replicas_to_aggregate
    gradients, variable)] that the chief's queue runner takes)."""
    pushes, aggregated = [], []
    for grad, var in grads_and_vars:
      with tf.compat.v1.device(var.device):
        accumulator = tf.compat.v1.ConditionalAccumulator(
            grad.dtype, shape=var.get_shape(), shared_name=var.name + '/grad_accum')
        pushes.append(accumulator.apply_grad(grad, local_step=self._local_step))
        aggregated.append((accumulator.take_grad(self._replicas_to_aggregate), var))
        self._accumulator_list.append((accumulator, var.device))
    return pushes, aggregated

  def tokens_for_every_worker(self):
    """An op handing each worker a token of the global step: after each update, and at
    the end (one each, so that none waits on)."""
    if not self.queue_per_worker:
      return self.get_init_tokens_op(self._total_num_replicas)
    with tf.compat.v1.device(self._global_step.device):
      step = self._global_step.read_value()
      return tf.group(*[queue.enqueue(step) for queue in self._token_queues],
                      name='sync_tokens_for_every_worker')

  def token_for_this_worker(self):
    """An op handing this worker a token of the global step (a stopping worker's own)."""
    if not self.queue_per_worker:
      return self.get_init_tokens_op(1)
    with tf.compat.v1.device(self._global_step.device):
      return self._sync_token_queue.enqueue(self._global_step.read_value())

  def get_init_tokens_op(self, num_tokens=-1):
    """The chief's start (the base's session hook). The base hands out
    replicas_to_aggregate tokens, so that each worker's first step returns at once,
    and its second gradient, computed at the same step, could go into the same update
    as its first. With a queue per worker, none: each worker's first step waits, as
    every other, for the update its gradient goes into."""
    if self.queue_per_worker:
      return tf.no_op(name='no_init_tokens')
    return super().get_init_tokens_op(num_tokens)

  def get_chief_queue_runner(self):
    runner = super().get_chief_queue_runner()
    leave_open = tf.no_op(name='sync_token_q_left_open')  # instead of closing it
    return tf.compat.v1.train.QueueRunner(
        runner.queue, runner.enqueue_ops, close_op=leave_open, cancel_op=leave_open,
        queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))


class ThenAverage:
  """Sync: applies SyncReplicasOptimizer's aggregated gradient, then the moving
  averages, then counts it in the global step (updates.apply_average_count), as one
  op: the update the tokens wait for."""

  def __init__(self, opt, model):
    self._opt, self._model = opt, model

  def apply_gradients(self, grads_and_vars, global_step):
    return updates.apply_average_count(self._opt, grads_and_vars, global_step,
                                       self._model)


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

  def __init__(self, opt, model, loss_scale, accumulators):
    self._opt, self._model, self._loss_scale = opt, model, loss_scale
    self._accumulators = accumulators  # [(accumulator, device)], filled by the base
    self.skips = None  # the notes' queue, made with the update

  def apply_gradients(self, grads_and_vars, global_step):
    grads = list(grads_and_vars)
    self.skips = tf.queue.FIFOQueue(-1, [tf.int64, tf.float32, tf.float32],
                                    shapes=[[], [], []], name='loss_scale_skips')
    update = mixed_precision.apply_or_skip(
        lambda: updates.apply_average_count(self._opt, grads, global_step, self._model),
        mixed_precision.all_finite(grads), self._loss_scale)
    with tf.control_dependencies([update.train_op]):
      note = tf.cond(update.applied, tf.no_op, lambda: self.skips.enqueue(
          [global_step.read_value() + 1, update.scale, update.new_scale]))
      rewinds = []
      for accumulator, device in self._accumulators:
        with tf.compat.v1.device(device):
          rewinds.append(accumulator.set_global_step(global_step))
    return tf.group(update.train_op, note, *rewinds)


Fp16 = collections.namedtuple('Fp16', [
    'loss_scale',  # mixed_precision.LossScale, on the ps, shared by the workers
    'scale',       # float32 scalar: the scale this step read once (read_once)
    'all_finite',  # bool scalar: this worker's unscaled gradient holds no inf or NaN
])


class ModeDefaults:
  """The loop's questions that only all-reduce answers otherwise; the ps modes' answers."""
  step_slack_secs = worker_sessions.STEP_SLACK_SECS  # a step's watchdog, past its timeout
  stuck_on = 'the ps tasks have left'  # what a stopping step that never returns waits on

  def save_own_copy(self, graph):
    del graph
    return None  # the variables are the ps tasks': this worker has no copy to save

  def step_feed(self, stop):
    del stop
    return None  # a ps mode's step takes no feed

  def start_together(self, run_fetch, timeout_secs):
    del run_fetch, timeout_secs  # the variables are the ps tasks': one copy

  def after_step(self, run_fetch, outcome, timeout_secs):
    del run_fetch, outcome, timeout_secs

  def stops_before_step(self, stop):
    return stop.requested  # the stopping worker's loop ends; the others go on

  def step_stopped_at(self, match, run_fetch, run):
    """The step the chief saves, stopped by a signal (run_match.stop_together), or None."""
    return match.stop_together(run_fetch, run)

  def peers_failing(self):
    return contextlib.nullcontext()  # a ps task's going away: the sessions reopen


class Outcome(typing.NamedTuple):
  """Fetched with each step; the mode that built it reads it (shown_step, applied)."""
  step_after: tf.Tensor  # int64: async, the global step this update claimed (fp16 skip:
                         # the global step); sync, the token: the global step of the
                         # update this worker waited for
  skip_check: list       # fp16: async, this step's [applied, scale, new scale]; sync
                         # chief, the skips noted since its last step, [[steps], [scales],
                         # [new scales]]; else []
  stopping: list = []    # all-reduce: float32 [workers], > 0 for each that is stopping


class Update(typing.NamedTuple):
  """What build() makes: the op of one worker step, what it says, the session's hooks."""
  train_op: tf.Operation
  outcome: Outcome
  hooks: list            # StopAtStepHook; sync, the optimizer's (its queue runner, tokens)


class AppliedByEachWorker(ModeDefaults):
  """A mode whose every worker step applies an update itself (async: its own gradient to
  the ps tasks' variables; all-reduce: the workers' mean to its own copy): one global
  step per worker step, an fp16 overflow skipped by the worker that sees it."""

  def applied_update(self, apply_fn, all_finite, global_step, max_steps, fp16,
                     stopping=None):
    """The Update of apply_fn() (the update, its moving averages, its count); with fp16
    (an Fp16), only where all_finite, the shared scale halved or grown from the scale
    the step read. stopping: all-reduce's flags, fetched with the step."""
    skip_check = []
    if fp16:
      update = mixed_precision.apply_or_skip(apply_fn, all_finite, fp16.loss_scale,
                                             fp16.scale)
      train_op, skip_check = update.train_op, list(update[1:])
    else:
      train_op = apply_fn()
    with tf.control_dependencies([train_op]):
      step_after = tf.identity(global_step.read_value())  # this worker's update included
    return Update(train_op, Outcome(step_after, skip_check, [] if stopping is None else stopping),
                  [tf.compat.v1.train.StopAtStepHook(last_step=max_steps)])

  def shown_step(self, step, outcome):
    del step
    return outcome.step_after

  def applied(self, outcome):
    """fp16: False, having said so, when this step's update overflowed."""
    if outcome.skip_check and not outcome.skip_check[0]:
      steps.check_skip(outcome.step_after + 1, *outcome.skip_check[1:])
      return False
    return True

  def handed_own_token(self, step, outcome):
    del step, outcome
    return False  # a step that applies its own update waits for no token

  def release_workers(self, sess):
    del sess  # every worker stops by itself at max_steps

  def release_stopping_step(self):
    return None  # nothing to hand a stopping step


class AsyncUpdates(AppliedByEachWorker):
  """Each worker applies its own averaged gradient, then the moving averages: one
  global step per worker step, claimed first, so exactly max_steps land."""
  gradients_per_update = 1
  update_name = 'worker step'  # what the schedule's line calls one update

  def __init__(self, run):
    self._run = run  # dist_train.py's WorkerRun: who, ps_hosts, chief_host, ...

  def wait_for_workers(self, match, run_fetch, timeout_secs, should_stop):
    """Nothing: each worker's update is its own."""

  def build(self, opt, grads, global_step, model, max_steps, fp16=None):
    """The update, then the moving averages; an Update.

    fp16 (an Fp16): the worker checks its own unscaled gradient. Finite, it claims
    its global step and applies; not, it claims nothing (the global step does not
    move) and halves the shared scale from the scale it read; the loop says so. Each
    worker skips its own overflows.
    """
    apply_fn = lambda: updates.then_average(
        claim_then_apply(opt, grads, global_step, max_steps),
        updates.moving_averages(global_step, model))
    return self.applied_update(apply_fn, fp16 and fp16.all_finite, global_step, max_steps,
                               fp16)

  def fp16_line(self):
    return loss_scale_line('the worker that had it')

  def mode_line(self, batch_size, num_towers):
    return ('async: each of %d workers applies its own updates of %d images (%d x %d '
            'towers)' % (self._run.num_workers, batch_size * num_towers, batch_size,
                         num_towers))

  def ended_early_message(self, step, max_steps):
    return ended_early(self._run, step, max_steps,
                        'the global step went back: the chief (worker 0 at %s) restored '
                        'its last checkpoint' % self._run.chief_host)

  def stuck_step_message(self, secs):
    return _stuck_step(self._run, secs, '')

  def slow_step_message(self, step_timeout_secs):
    return ('%s: a step took more than --step_timeout_secs=%d waiting for the ps tasks %s. '
            'Check that they are running, or raise --step_timeout_secs.'
            % (self._run.who, step_timeout_secs, ','.join(self._run.ps_hosts)))


class SyncUpdates(ModeDefaults):
  """SyncReplicasOptimizer: gradients_per_update gradients averaged per update, the
  moving averages stepped right after each update, on the chief's queue runner."""
  update_name = 'update'  # of gradients_per_update worker steps

  def __init__(self, run, replicas_to_aggregate=None):
    self._run = run
    # Each update sees this many worker batches: the learning-rate schedule counts them all.
    self.gradients_per_update = replicas_to_aggregate or run.num_workers
    self._release_workers = self._release_step = None  # the tokens' ops, made by build()
    self._gradients_at = None  # (global step, each worker's gradient's step), made by build()

  def build(self, opt, grads, global_step, model, max_steps, fp16=None):
    """Pushes this worker's gradient, then waits for a token; an Update.

    fp16 (an Fp16): each worker pushes its unscaled gradient; the chief's queue
    runner checks the aggregated one and applies it or skips it (SyncReplicas). No
    worker knows whether the update its gradient went into was skipped; the chief
    takes the queue runner's notes of skips after each of its steps and says them.
    """
    run = self._run
    with worker_sessions.quiet_deprecations():
      sync = SyncReplicas(opt, self.gradients_per_update, run.num_workers, run.task_index,
                          model, fp16 and fp16.loss_scale)
      train_op = sync.apply_gradients(grads, global_step=global_step)
      hooks = [tf.compat.v1.train.StopAtStepHook(last_step=max_steps),
               sync.make_session_run_hook(run.is_chief)]
      # At the end the chief hands out one token per worker: a worker waiting for an
      # update that will never come gets it, sees the last step and stops.
      if run.is_chief:
        self._release_workers = sync.tokens_for_every_worker()
      self._release_step = sync.token_for_this_worker()
      if sync.queue_per_worker:  # what a step that timed out reads, to name who is missing
        self._gradients_at = (global_step.read_value(), sync.gradients_at.read_value())
    skip_check = []
    if fp16 and run.is_chief:
      skips = sync.skip_overflow.skips
      with tf.control_dependencies([train_op]):  # the update of this step's token is in
        skip_check = skips.dequeue_up_to(skips.size())  # every note left since the last step
    return Update(train_op, Outcome(tf.identity(train_op), skip_check), hooks)

  def wait_for_workers(self, match, run_fetch, timeout_secs, should_stop):
    """The chief, before its first step: every worker joined (run_match.RunMatch),
    unless backup workers were asked for (fewer gradients per update than workers).
    Each update averages the first gradients computed from its variables, whichever
    workers send them: alone, the chief would average its own, several to an update."""
    run = self._run
    if run.is_chief and run.num_workers > 1 and self.gradients_per_update == run.num_workers:
      match.wait_for_workers(run_fetch, run.who, timeout_secs, should_stop)

  def shown_step(self, step, outcome):
    # This worker's gradient goes into the update after the one its token came from;
    # the token it gets back is that of an update already applied.
    del outcome
    return step + 1

  def applied(self, outcome):
    """fp16 chief: says the updates its queue runner skipped meanwhile; always True."""
    for note in zip(*outcome.skip_check):  # (step, scale, new scale)
      steps.check_skip(*note)
    return True

  def handed_own_token(self, step, outcome):
    """Asked once stopping: whether this step returned on the token a stopping worker
    hands itself (worker_sessions.watch_stopping_step), one of the current step, older
    than the update its gradient was for, step + 1, which never came: not a step to
    show. (The chief's tokens at the start are of the current step too.)"""
    return outcome.step_after < step + 1

  def release_workers(self, sess):
    """The chief, at max_steps: one token per worker, so that none waits on. Only at the
    end: after a stop the workers wait for their tokens until a chief restarted with
    the same command has them run on (up to --step_timeout_secs)."""
    if self._release_workers is not None:
      worker_sessions.without_hooks(sess, lambda raw: raw.run(self._release_workers))

  def release_stopping_step(self):
    """A function handing this worker's own step a token (worker_sessions.watch_stopping_step)."""
    return worker_sessions.op_runner(self._run.server.target, self._run.config,
                                     self._release_step)

  def fp16_line(self):
    return loss_scale_line('the chief')  # its queue runner checks each averaged update

  def mode_line(self, batch_size, num_towers):
    run, n = self._run, self.gradients_per_update
    backups = max(run.num_workers - n, 0)
    if backups:
      how = ('the first %d computed from its variables, so a worker that falls behind has '
             'its place taken by a faster one' % n)
    else:
      how = ('one from each, so a worker that goes away stops the others at '
             '--step_timeout_secs, naming it')
    return ('sync: each update averages %d gradients of %d images (%d x %d towers) from '
            '%d workers, %d of them backup: %s' % (n, batch_size * num_towers, batch_size,
                                                   num_towers, run.num_workers, backups, how))

  def ended_early_message(self, step, max_steps):
    return ended_early(self._run, step, max_steps,
                        'the token queue on the ps tasks was closed, so no averaged update '
                        'can come (restart the ps tasks too: a restarted ps opens a new one)')

  def stuck_step_message(self, secs):
    return _stuck_step(self._run, secs, ' or the chief')

  def slow_step_message(self, step_timeout_secs):
    n = self.gradients_per_update
    return ('%s: no averaged update within --step_timeout_secs=%d%s. Each update waits for '
            '%d gradients computed from the current variables, and for the chief (worker '
            '0 at %s) to apply them: check that the chief and at least %d workers are '
            'running, or raise --step_timeout_secs.' % (
                self._run.who, step_timeout_secs, self._missing_workers(), n,
                self._run.chief_host, n))

  def _missing_workers(self):
    """', waiting for worker 1 (host:port) to send its gradient for update N', read
    from the ps; '' with backup workers, or when the ps does not answer within 5 s."""
    if self._gradients_at is None:
      return ''
    run = self._run
    found = worker_sessions.op_runner(run.server.target, run.config, self._gradients_at)()
    if found is None:
      return ''
    step, gradients_at = found
    missing = [i for i, at in enumerate(gradients_at) if at < step]
    if not missing:
      return ''
    return ', waiting for %s to send %s gradient for update %d' % (
        ', '.join('worker %d (%s)' % (i, run.cluster.task_address('worker', i)) for i in missing),
        'its' if len(missing) == 1 else 'their', step + 1)


def loss_scale_line(halved_by):
  return ('float16 towers, float32 variables; dynamic loss scale from %g on the ps, shared '
          'by the workers (a resumed run keeps its own), doubled after %d clean updates, '
          'halved on an overflow by %s' % (mixed_precision.INITIAL_LOSS_SCALE,
                                           mixed_precision.LOSS_SCALE_PERIOD, halved_by))


def ended_early(run, step, max_steps, why):
  """Why a worker's loop ended below max_steps though no signal stopped it."""
  return ('%s: training ended at global step %d, below --max_steps=%d, and no signal '
          'stopped it: %s. Restart this task with the same command; it rejoins.'
          % (run.who, step, max_steps, why))


def _stuck_step(run, secs, or_the_chief):
  return ('%s: a step has not returned in %d s and TensorFlow did not time it out: the ps '
          'tasks %s%s stopped answering. Restart them, or raise --step_timeout_secs.'
          % (run.who, secs, ','.join(run.ps_hosts), or_the_chief))
