"""A ps task's life: serve the variables until the workers have finished, and the
check every task makes first, that the job is not already over.
"""

import tensorflow as tf

from distributed import ps_shutdown, task_cluster, worker_sessions
from training import checkpoints, errors, startup, storage

FINISHED_REPORT_SECS = 5     # a worker started after the end tells the ps tasks, if up


def run_ps(cluster, task_index, stop):
  """Serves this ps task's share of the variables until every worker has finished.

  Each worker says so at its very end (ps_shutdown.report_finished); once all
  have, or the chief has and the rest have not within ps_shutdown.GRACE_SECS,
  this returns, and the task exits 0 however it was started.

  Args:
    cluster: tf.compat.v1.train.ClusterSpec with jobs 'ps' and 'worker'.
    stop: a signals.StopSignals: Ctrl-C or SIGTERM ends the wait once the chief has
      said it saved, or after ps_shutdown.STOP_WAIT_SECS (a whole job stopped at once:
      the chief's variables live here); a Ctrl-C after it, at once.

  Raises:
    errors.Stopped: stopped by a signal before the workers had finished.
    errors.Ended: the chief gave up; this task ends with its exit code.
  """
  server = task_cluster.start_server(cluster, 'ps', task_index, 'ps task %d' % task_index)
  num_workers = cluster.num_tasks('worker')
  print('ps task %d serving at %s until the %d worker(s) have finished (Ctrl-C stops it)'
        % (task_index, server.target, num_workers), flush=True)
  # Not server.join(): that waits inside TensorFlow, where no signal is heard.
  try:
    seen = ps_shutdown.wait_for_workers(server, task_index, num_workers,
                                        should_stop=lambda: stop.requested,
                                        log=lambda line: print(line, flush=True))
  except KeyboardInterrupt:  # a Ctrl-C after the first signal: at once
    seen = ps_shutdown.WorkersSeen([], 'stopped')
  if seen.why == 'stopped':
    print('ps task %d stopped by %s' % (task_index, stop.name), flush=True)
    raise errors.Stopped(stop.exit_code)
  if seen.why == 'gave up':
    raise errors.Ended(seen.chief_exit_code)  # said already, in wait_for_workers' log
  print('ps task %d done: training is over' % task_index, flush=True)


def job_is_over(cluster, spec, settings):
  """A task started after the job reached --max_steps: says so and returns True (exit 0:
  an orchestrator's retry of a finished job ends there). False otherwise.

  The job is over when --train_dir, as this task sees it, holds a checkpoint at
  --max_steps. A worker started then tells the ps tasks it has finished (should they
  still wait for it), for at most FINISHED_REPORT_SECS, where one of them is up.
  """
  try:
    latest = (checkpoints.read_state_file(settings.train_dir) or [None])[0]
  except errors.TrainingError:
    return False  # unreadable here: the task runs, and the chief's checks say why
  step = latest and checkpoints.checkpoint_step(latest)
  if step is None or step < settings.max_steps:
    return False
  path = checkpoints.in_this_dir(settings.train_dir, latest, [])
  if not storage.exists(path + '.index'):  # named, but gone: the chief's checks say so
    return False
  print('%s %d: the job is over: %s' % (cluster.job_name, cluster.task_index,
                                        startup.nothing_to_do(path, step, settings.max_steps)),
        flush=True)
  # A ps task of the run that ended the job may still wait for this worker. Said: it
  # was a silent wait of up to FINISHED_REPORT_SECS, where no ps task is up to tell.
  if cluster.job_name == 'worker' and any(map(worker_sessions.port_answers,
                                              cluster.ps_hosts)):
    print('%s %d: telling the ps tasks at %s that it has finished, for at most %d s'
          % (cluster.job_name, cluster.task_index, ','.join(cluster.ps_hosts),
             FINISHED_REPORT_SECS), flush=True)
    try:
      server = tf.compat.v1.train.Server(spec, job_name='worker',
                                         task_index=cluster.task_index)
    except tf.errors.OpError:
      return True  # its port is taken: nothing to tell
    ps_shutdown.report_finished(server.target, len(cluster.ps_hosts), cluster.task_index,
                                timeout_secs=FINISHED_REPORT_SECS)
  return True
