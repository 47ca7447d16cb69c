"""How a worker's run ends beyond its step loop: what it says, what it tells the ps
tasks, and the one line of a worker stopped by a signal whose ps tasks left first.
"""
import contextlib

from distributed import chief, ps_shutdown, worker_sessions
from training import checkpoints, errors, steps

STOPPED_REPORT_SECS = 5      # a stopped worker tells the ps tasks so for at most this long


def end(run, mode, graph, stop, progress, max_steps):
  """Once the session is closed (the chief's last checkpoint written): says how this
  worker ended and tells the ps tasks, which may then leave.

  Raises:
    errors.Stopped: stopped by a signal. errors.PeerGone: ended below max_steps
    without one (mode.ended_early_message says why): not finished, it says nothing.
  """
  saved = chief.saved_step(run, graph)  # the chief: its last checkpoint's step; async
  step = progress.step if saved is None else saved  # workers may have moved it on since
  local_step = progress.local_step
  if stop.requested:  # saved: the ps tasks may leave once the chief has said so
    report_to_ps(run, stopped=True)
    steps.stopped(stop, step)
  if step < max_steps:
    raise errors.PeerGone(mode.ended_early_message(step, max_steps))
  report_to_ps(run, stopped=False)
  print('%s done: %d local steps, global step %d' % (run.who, local_step, step), flush=True)


def report_to_ps(run, stopped):
  """Tells the ps tasks this worker has finished, or has stopped (the chief: saved);
  nothing without ps tasks (all-reduce)."""
  if not run.ps_hosts:
    return
  timeout_secs = STOPPED_REPORT_SECS if stopped else ps_shutdown.REPORT_TIMEOUT_SECS
  if not ps_shutdown.report_finished(run.server.target, len(run.ps_hosts), run.task_index,
                                     run.config, timeout_secs=timeout_secs, stopped=stopped):
    print('%s: the ps tasks did not answer within %d s to hear that it has %s; they have '
          'ended already%s' % (run.who, timeout_secs, 'stopped' if stopped else 'finished',
                               '' if stopped else ', or will once the chief has'),
          flush=True)


@contextlib.contextmanager
def chief_failure_ends_the_job(run):
  """The chief that gives up on an error tells the ps tasks, which then end with its
  exit code (ps_shutdown): a ps task left serving a chief that is gone kept a hand-
  started job, or a Kubernetes one, running without end. Bounded as a stopped
  worker's report: the ps tasks may be what failed."""
  try:
    yield
  except (errors.TrainingError, errors.DataError) as e:
    if run.is_chief and run.ps_hosts:
      ps_shutdown.report_finished(run.server.target, len(run.ps_hosts), run.task_index,
                                  run.config, timeout_secs=STOPPED_REPORT_SECS,
                                  gave_up=errors.exit_code(e))
    raise


@contextlib.contextmanager
def stopped_without_ps(run, graph, stop, progress):
  """A stopped worker whose ps tasks left first stops as a stopped worker: one line,
  the signal's exit code. Only the chief has anything to lose: it says what is on
  disk. (The ps tasks serve the chief's save; this is for a ps task that was killed.)"""
  try:
    yield
  except worker_sessions.PS_GONE_ERRORS as e:
    if not stop.requested:
      raise
    saved = chief.saved_step(run, graph)
    if not run.is_chief or saved == progress.step:
      steps.stopped(stop, progress.step)
    print('Stopped by %s at step %d without saving it: the ps tasks left first (%s); %s '
          'Rerun the same command to resume.' % (stop.name, progress.step,
                                                  errors.one_line(e),
                                                  checkpoints.untouched_note(saved)),
          flush=True)
    raise errors.Stopped(stop.exit_code) from None
