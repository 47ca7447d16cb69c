"""How a worker's averaged gradient becomes an update of the variables on the ps tasks.

dist_train.py's build() makes the towers and their average, then one of these:

    async_update(...)  # each worker applies its own gradient, claiming its global step
    sync_update(...)   # SyncReplicasOptimizer: the chief applies the average of several

Each returns (train op, the global step after it, hooks, the sync chief's op that
releases the workers at the end, fp16's skip check, sync: the op that releases this
worker's own step). With --use_fp16 a gradient
that overflowed is not applied: async, by the worker that computed it; sync, by
the chief's queue runner, which checks the aggregate. Nothing here reads flags.
"""
import tensorflow as tf

from distributed import worker_sessions
from training import mixed_precision, updates


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
  """SyncReplicasOptimizer, its local step kept on this worker, its end quiet.

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
        worker_sessions.quiet_deprecations():  # of the QueueRunner it makes
      return super().apply_gradients(grads_and_vars, global_step, name)

  def get_chief_queue_runner(self):
    runner = super().get_chief_queue_runner()
    leave_open = tf.no_op(name='sync_token_q_left_open')  # instead of closing it
    return tf.compat.v1.train.QueueRunner(
        runner.queue, runner.enqueue_ops, close_op=leave_open, cancel_op=leave_open,
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
        lambda: updates.then_average(
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


def async_update(run, worker, opt, grads, global_step, ema, max_steps, loss_scale=None,
                 scale=None, all_finite=None):
  """Each worker applies its own averaged gradient, then the moving averages.

  fp16 (loss_scale, the scale this step read, all_finite): the worker checks its
  own unscaled gradient. Finite, it claims its global step and applies; not, it
  claims nothing (the global step does not move) and halves the shared scale
  from the scale it read; the loop says so. Each worker skips its own overflows.

  Returns:
    (train op, the global step it claimed (fp16 skip: the global step), hooks,
     None, fp16: this step's (applied, scale, new_scale), else None, None).
  """
  del run, worker
  apply_fn = lambda: updates.then_average(
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
          None, skip_check, None)


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
     fp16 chief: the skips noted since its last step, else None; the op handing
     this worker's own step a token, for a stop: worker_sessions.watch_stopping_step).
  """
  del scale, all_finite  # the chief checks the aggregate instead
  with worker_sessions.quiet_deprecations():
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
    release_step = sync.get_init_tokens_op(1)
  skip_check = None
  if loss_scale and run.task_index == 0:
    skips = sync.skip_overflow.skips
    with tf.control_dependencies([train_op]):  # the update of this step's token is in
      skip_check = skips.dequeue_up_to(skips.size())  # every note left since the last step
  return train_op, tf.identity(train_op), hooks, release_workers, skip_check, release_step
