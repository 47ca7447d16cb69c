r"""Trains the CIFAR-10 model on several machines with TensorFlow's parameter servers,
or without them by all-reduce.

    # One machine: 1 ps task and 2 workers as subprocesses on 127.0.0.1.
    python dist_train.py --local_cluster=1,2 --max_steps=10000
    python dist_train.py --local_cluster=0,2 --all_reduce   # 2 workers, no ps task

    # Several machines: one command per task, the same host lists everywhere.
    python dist_train.py --job_name=ps --task_index=0 \
        --ps_hosts=10.0.0.1:2222 --worker_hosts=10.0.0.2:2222,10.0.0.3:2222 \
        --allow_nonloopback_hosts
    python dist_train.py --job_name=worker --task_index=0 ...   # the chief
    python dist_train.py --job_name=worker --task_index=1 ...

    # Kubernetes (Kubeflow TFJob) and Slurm: the cluster from the environment.
    python dist_train.py ...                                  # TF_CONFIG set by TFJob
    srun python dist_train.py --cluster=slurm --num_ps=1 ...  # see deploy/
    python dist_train.py --cluster=jobset ...                 # JobSet: see deploy/

ps tasks hold the variables; each worker builds multi_gpu_train.py's towers
(build_towers) and averages their gradients, so one gradient per worker step
leaves the machine: applied at once (async, the default; exactly --max_steps
updates land) or averaged over --replicas_to_aggregate workers first
(--sync_replicas; fewer than the workers leaves backup workers). With --all_reduce
and no ps task, each worker keeps its own copy of the variables and the workers take
the mean of their gradients by TensorFlow's collective all-reduce. Worker 0, the
chief (TF_CONFIG's "chief" or "master"), initialises or restores the variables
and writes checkpoints and summaries; TF_CONFIG's "evaluator" scores them. Every
task exits by itself at the end. Exit codes: 0 done, 1 a fault a restart cannot
cure, 130/143 stopped by a signal, 138 a peer went away (restart this task).
Details: docs/distributed.md.

SECURITY: TensorFlow servers have no authentication and no encryption, and each
task listens on every network interface of its machine on its port, whatever
host --ps_hosts and --worker_hosts name. Anyone who can reach such a port can
run any graph there, reading and writing files as the user running it: firewall
those ports (with --all_reduce every worker dials every other's). Hosts other than
loopback are refused unless --allow_nonloopback_hosts is passed. --local_cluster runs
its tasks in a private network namespace with only a loopback interface, where Linux
permits it.

Per worker step, expect multi_gpu_train.py's time per step plus the time to send
the 1,068,298 parameters and their gradients (4 MB each way) to the ps tasks.
"""
import sys

from training import prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  # First: Python 3.11+, signals held, TensorFlow imported with its lines filtered for life.
  prelude.start(sys.argv, hold_signals=True, filter_for_life=True)

import collections
import contextlib
import functools
import time
import typing

from absl import app
from absl import flags
import tensorflow as tf

import data_sets
from distributed import (all_reduce, chief, evaluator, local_cluster, ps_placement,
                         ps_task, run_match, task_cluster, worker_end, worker_sessions,
                         worker_updates)
from multi_gpu_train import average_gradients, build_towers  # the towers, as they teach them
from training import (checkpoints, errors, evaluation, input_data, machine, mixed_precision,
                      placement, run_record, signals, startup, steps, summaries, updates)
from training import settings as trainer_settings

# ---- Training knobs: multi_gpu_train.py's, one copy (edit them there) ---------------
# A worker trains with them as multi_gpu_train.py does; here a step is a global step
# (one update, from all workers) and NUM_GPUS counts one worker's towers.
from multi_gpu_train import (DATASET_DEFAULTS, KEEP_CHECKPOINTS, LOG_FREQUENCY, NUM_GPUS,
                             SAVE_EVERY_N_STEPS, SUMMARY_STEPS)

# ---- Cluster knobs ------------------------------------------------------------------
STARTUP_TIMEOUT_SECS = 120   # a worker waits this long for its ps tasks, then for the chief
STEP_TIMEOUT_SECS = 300      # one step may take this long (sync: waiting for the update too)
CLOSE_TIMEOUT_SECS = 30      # closing the session at the end may take this long
EVAL_INTERVAL_SECS = 60      # TF_CONFIG's evaluator looks for a new checkpoint this often


FLAGS = flags.FLAGS

# The trainer's flags (training/settings.py) that mean nothing here, and why.
REFUSED_FLAGS = {
    'fresh': 'the chief restores whatever --train_dir holds; to start from step 0, '
             'point --train_dir at an empty directory',
    'async_towers': 'the towers of a worker are averaged before its gradient leaves it; '
                    'workers are asynchronous by default (without --sync_replicas)',
    'seed': 'the workers\' updates reach the ps tasks in whatever order the network and '
            'the machines give, so a distributed run cannot repeat exactly; use '
            'multi_gpu_train.py --seed for runs to compare',
}


def define_flags():
  """The trainer's flags, per worker, with the constants above as defaults, and the
  cluster's. Called when this file runs as a program: importing it defines none."""
  trainer_settings.define_trainer_flags(DATASET_DEFAULTS, NUM_GPUS, LOG_FREQUENCY,
                                        SUMMARY_STEPS, SAVE_EVERY_N_STEPS)
  task_cluster.define_flags()  # which cluster, which task: the flags task_cluster reads
  evaluator.define_flags(EVAL_INTERVAL_SECS)
  for module in (trainer_settings, task_cluster, evaluator):
    for flag in FLAGS.get_key_flags_for_module(module):  # in our --helpshort too
      if flag.name not in REFUSED_FLAGS:
        flags.declare_key_flag(flag.name)
  flags.DEFINE_boolean('sync_replicas', False, 'Average the workers\' gradients before '
                       'each update (SyncReplicasOptimizer) instead of applying each.')
  flags.DEFINE_boolean('all_reduce', False, 'Sync without ps tasks: each worker keeps its own '
                       'copy of the variables, and the workers average their gradients by '
                       'TensorFlow\'s collective all-reduce. For a cluster of workers only.')
  flags.DEFINE_integer('replicas_to_aggregate', None, 'Sync: gradients averaged per update; '
                       'default: the number of workers. Fewer leaves backup workers.')
  flags.DEFINE_integer('startup_timeout_secs', STARTUP_TIMEOUT_SECS, 'Seconds a worker '
                       'waits for the ps tasks to answer and for the chief to initialise.')
  flags.DEFINE_integer('step_timeout_secs', STEP_TIMEOUT_SECS, 'Seconds one step may take '
                       '(sync: including the wait for the averaged update).')


class WorkerSettings(typing.NamedTuple):
  """What a worker needs beyond its Settings (training/settings.py): the mode and the waits."""
  sync_replicas: bool = False
  all_reduce: bool = False            # no ps tasks: the workers' collective all-reduce
  replicas_to_aggregate: int = None   # sync: gradients per update; None: one per worker
  startup_timeout_secs: int = STARTUP_TIMEOUT_SECS
  step_timeout_secs: int = STEP_TIMEOUT_SECS


def train(cluster, task_index, settings, worker=WorkerSettings(), stop=None,
          flag_values=None, flags_given=()):
  """Runs worker `task_index` until global step settings.max_steps; worker 0 is the chief.

  Args:
    cluster: tf.compat.v1.train.ClusterSpec with jobs 'ps' and 'worker'.
    settings: a training.settings.Settings (its fresh, seed and async_towers unused).
    worker: a WorkerSettings.
    stop: a signals.StopSignals, or None (tests): once requested, the loop ends after
      its step, the chief saves, and errors.Stopped is raised.
    flag_values: dict, the command line's flags, for the chief's run record;
      flags_given: the names of those set on the command line.
  """
  stop = stop or steps.NEVER
  data = data_sets.DATASETS[settings.dataset]
  with contextlib.ExitStack() as exit_stack:  # the chief's lock on train_dir
    run = start(exit_stack, cluster, task_index, settings, worker, data.input, stop)
    exit_stack.enter_context(worker_end.chief_failure_ends_the_job(run))  # the ps's too
    if worker.all_reduce:
      mode = all_reduce.AllReduceUpdates(run, settings.save_every_n_steps)
    elif worker.sync_replicas:
      mode = worker_updates.SyncUpdates(run, worker.replicas_to_aggregate)
    else:
      mode = worker_updates.AsyncUpdates(run)
    record = (chief.record(run, settings, data, flag_values, sys.modules[__name__],
                           sys.modules['multi_gpu_train'], flags_given)
              if run.is_chief else None)
    epoch = input_data.examples_per_epoch(settings, data)
    # The schedule counts updates; an epoch is the same examples however updates group them.
    examples_per_update = settings.batch_size * len(run.devices) * mode.gradients_per_update
    progress = worker_sessions.Progress(run.start_step)
    with tf.Graph().as_default():
      graph = build(run, mode, settings, worker, data, epoch, examples_per_update, record)
      startup.check_memory([graph.train_op, graph.loss] + (  # before writing
          [graph.scaffold.summary_op] if graph.scaffold.summary_op is not None else []),
          settings)
      if record:
        run_record.write_and_compare(settings.train_dir, record)
      print_start(run, mode, settings, data.model, epoch, examples_per_update)
      worker_sessions.watch_stopping_step(stop, progress, run.who, run.is_chief,
                                          mode.release_stopping_step(),
                                          mode.save_own_copy(graph), mode.stuck_on)
      with worker_end.stopped_without_ps(run, graph, stop, progress), mode.peers_failing():
        graph.run_match.compare_before_session(run, worker.startup_timeout_secs)
        with worker_sessions.open_session(run, graph, settings, worker.startup_timeout_secs,
                                          stop) as sess:
          loop_checking_data(sess, run, mode, graph, settings, worker, stop, progress)
          run.arm_watchdog(CLOSE_TIMEOUT_SECS + worker_sessions.WATCHDOG_SLACK_SECS,
                           '%s: closing the session hung after the last step (%d)'
                           % (run.who, progress.step))
        # Closed: the chief's SaveCheckpoints hook has saved the last step.
    run.arm_watchdog(None, '')
    worker_end.end(run, mode, graph, stop, progress, settings.max_steps)  # tells the ps


WorkerRun = collections.namedtuple('WorkerRun', [
    'who',           # 'worker 1'
    'cluster',       # tf.compat.v1.train.ClusterSpec
    'task_index',    # int
    'is_chief',      # worker 0: it initialises or restores, saves and summarises
    'num_workers',   # int
    'ps_hosts',      # ['host:port', ...]
    'chief_host',    # 'host:port' of worker 0
    'server',        # this task's tf.compat.v1.train.Server
    'config',        # its tf.compat.v1.ConfigProto
    'devices',       # the towers' devices, and where they are, said at start-up
    'where',
    'checkpoint',    # chief: the checkpoint it restores, or None
    'start_step',    # chief: its global step
    'arm_watchdog',  # arm(secs, message): see worker_sessions.start_watchdog()
])


def start(exit_stack, cluster, task_index, settings, worker, data_input, stop):
  """Checks, the chief's lock and resume point, the data, the server; the ps tasks up.

  The chief's lock on train_dir is held until exit_stack closes. A signal during the
  data's download stops it at once (signals.Interrupted).
  """
  who, is_chief = 'worker %d' % task_index, task_index == 0
  checkpoint, start_step = None, 0
  if is_chief:  # before anything is written: a second chief stops here
    resumed = startup.start(exit_stack, settings, data_input, stop_when_done=False,
                            stop=stop)
    checkpoint, start_step = resumed.checkpoint, resumed.start_step
  else:
    startup.check_precision(settings)  # the chief's startup.start() checks it too
    startup.prepare_data(settings, data_input, stop)
  devices, num_cpu_devices, where = placement.tower_devices(settings.num_gpus)
  config, peers = worker_config(cluster, task_index, settings, num_cpu_devices,
                                worker.all_reduce)
  server = task_cluster.start_server(cluster, 'worker', task_index, who, config)
  arm_watchdog = worker_sessions.start_watchdog()
  # Stopped or not: a chief stopped at start-up still opens its session and saves.
  worker_sessions.wait_for_peers(peers, worker.startup_timeout_secs, who,
                                 what='worker' if worker.all_reduce else 'ps task')
  ps_hosts = cluster.job_tasks('ps') if 'ps' in cluster.jobs else []
  return WorkerRun(who, cluster, task_index, is_chief, cluster.num_tasks('worker'),
                   ps_hosts, cluster.task_address('worker', 0), server,
                   config, devices, where, checkpoint, start_step, arm_watchdog)


def worker_config(cluster, task_index, settings, num_cpu_devices, all_reduce_flag):
  """(this worker's ConfigProto, the hosts it waits for before its session: the ps
  tasks, or with --all_reduce the other workers)."""
  config = placement.session_config(num_cpu_devices, settings.session)
  if settings.use_bf16:
    mixed_precision.bfloat16_in_a_cluster(config)
  if all_reduce_flag:  # every worker reaches every other: the ring passes through each
    config.experimental.collective_group_leader = '/job:worker/replica:0/task:0'
    config.device_filters.append('/job:worker')
    return config, [host for i, host in enumerate(cluster.job_tasks('worker'))
                    if i != task_index]
  # Only the ps tasks and this worker: no worker waits for another to start.
  config.device_filters.extend(['/job:ps', '/job:worker/task:%d' % task_index])
  return config, cluster.job_tasks('ps')


TrainGraph = collections.namedtuple('TrainGraph', [
    'global_step',      # int64 variable, on the ps
    'loss',             # float32 scalar: this worker's loss, the mean of its towers'
    'train_op',         # this worker's step: its gradient applied (async) or pushed (sync)
    'outcome',          # fetched with train_op, for the mode: a worker_updates.Outcome
    'hooks',            # this worker's session's: the update's, the chief's saves, summaries
    'scaffold',         # the saver (the chief's checkpoints) and the summary op
    'run_match',        # a run_match.RunMatch: what this worker trains, and the chief
])


def build(run, mode, settings, worker, data, epoch, examples_per_update, record):
  """Input, towers, the average and the update, placed by replica_device_setter.

  fp16: the loss scale lives on the ps with the variables (and in the checkpoint). Each
  worker step reads it once: the towers scale their losses by that snapshot and the
  worker unscales its averaged gradient by it, so what leaves the worker is float32
  whatever the others did to the scale meanwhile. The mode checks it and skips.
  """
  model = data.model
  with tf.compat.v1.device(ps_placement.replica_devices(run.cluster, run.task_index)):
    with tf.device('/cpu:0'):
      next_batch = input_data.worker_batches(data.input, settings.data_dir,
                                             settings.batch_size, settings.synthetic)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    # On the ps tasks; without them, on the chief.
    with all_reduce.chief_device_scope() if not run.ps_hosts else contextlib.nullcontext():
      match = run_match.RunMatch(run.num_workers, run.task_index, global_step)
    lr, decay_steps = updates.learning_rate(global_step, examples_per_update, epoch.count,
                                            model)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    loss_scale = mixed_precision.make_loss_scale() if settings.use_fp16 else None
    with tf.compat.v1.device(placement.place('/cpu:0', '')):  # this worker's CPU
      snapshot = loss_scale and mixed_precision.read_once(loss_scale)
    # variables_device '': replica_device_setter puts the variables on the ps tasks.
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                     partitioner=ps_placement.partitioner(len(run.ps_hosts))):
      towers = build_towers(next_batch, run.devices, opt, model, variables_device='',
                            loss_scale=snapshot, dtype=mixed_precision.compute_dtype(
                                settings.use_fp16, settings.use_bf16))
    with tf.compat.v1.device(placement.place('/cpu:0', '')):
      grads = average_gradients(towers.grads)
      fp16 = None
      if snapshot:  # fp16: the gradient leaves the worker unscaled
        grads, all_finite = mixed_precision.unscale_and_check(grads, snapshot)
        fp16 = worker_updates.Fp16(loss_scale, snapshot.scale, all_finite)
      loss = tf.reduce_mean(tf.stack(towers.losses), name='total_loss')
    update = mode.build(opt, grads, global_step, model, settings.max_steps, fp16)
    summary_op = (summaries.build_summaries(range(len(run.devices)), towers.losses, grads,
                                            lr, model, snapshot and snapshot.scale)
                  if settings.summary_steps else None)
    match.publish(run_match.describe(settings, worker, data, decay_steps,
                                     tf.compat.v1.get_default_graph().as_graph_def()))
    # Not sharded: the chief writes every file, so only it needs --train_dir.
    # The chief says what it trains each time its session opens (run_match.py).
    scaffold = tf.compat.v1.train.Scaffold(
        saver=checkpoints.make_saver(), summary_op=summary_op,
        local_init_op=tf.group(tf.compat.v1.train.Scaffold.default_local_init_op(),
                               match.publish_op) if run.is_chief else None)
    hooks = update.hooks + (chief.hooks(run, settings, model, scaffold, global_step, record,
                                        KEEP_CHECKPOINTS) if run.is_chief else [])
  return TrainGraph(global_step, loss, update.train_op, update.outcome, hooks, scaffold,
                    match)


def print_start(run, mode, settings, model, epoch, examples_per_update):
  """The start-up lines: who, where, the parameters, the mode, the schedule, the step."""
  batch_size, num_towers = settings.batch_size, len(run.devices)
  startup.print_versions('%s of %d (worker 0 is the chief); %s' % (
      run.who, run.num_workers, run.where), settings.session)
  if run.ps_hosts:
    print('ps tasks %s hold %d trainable parameters%s' % (
        ','.join(run.ps_hosts), startup.num_parameters(),
        ps_placement.bytes_by_ps_task(len(run.ps_hosts))))
  else:
    print('each of the %d workers holds its own copy of the %d trainable parameters' % (
        run.num_workers, startup.num_parameters()))
  print(mode.mode_line(batch_size, num_towers))
  decay_steps = updates.decay_steps(examples_per_update, epoch.count, model)
  startup.print_schedule(decay_steps, epoch, examples_per_update, mode.update_name, model,
                         settings)
  if settings.use_fp16:
    print(mode.fp16_line())
  if settings.use_bf16:
    print(mixed_precision.start_line(False, num_towers))
  if run.is_chief:
    print('Resuming from %s at step %d' % (run.checkpoint, run.start_step) if run.checkpoint
          else 'Starting from step 0 in %s' % settings.train_dir)
  sys.stdout.flush()


def loop_checking_data(sess, run, mode, graph, settings, worker, stop, progress):
  """loop(); a data file changed under it (cut, relabelled) stops this worker in one
  line naming the file, as multi_gpu_train.py, the chief after saving its step."""
  data_input = data_sets.DATASETS[settings.dataset].input
  check_files = not settings.synthetic and (
      lambda: data_input.check_train_files(settings.data_dir))
  with steps.stop_on_changed_data(check_files,
                                  lambda: chief.save_after_error(sess, run, graph)):
    loop(sess, run, mode, graph, settings, worker, stop, progress)


def loop(sess, run, mode, graph, settings, worker, stop, progress):
  """The step loop: run, check, log. Keeps `progress` (a Progress) up to date."""
  max_steps, log_frequency = settings.max_steps, settings.log_frequency
  model_name = data_sets.DATASETS[settings.dataset].model.__name__
  run_fetch = lambda fetch, **options: worker_sessions.without_hooks(
      sess, lambda raw: raw.run(fetch, **options))
  graph.run_match.before_first_step(run_fetch, run, mode, worker.startup_timeout_secs,
                                    lambda: stop.requested)
  mode.start_together(run_fetch, worker.startup_timeout_secs)
  step = run_fetch(graph.global_step)
  print('%s: training from global step %d' % (run.who, step), flush=True)
  if step >= max_steps:
    print('%s: global step %d is not below --max_steps=%d: nothing to do. Raise '
          '--max_steps to train further.' % (run.who, step, max_steps))
  local_step, last_shown = 0, step
  unlogged = None  # the latest step's line when the frequency skipped it: the run's last
  while step < max_steps and not sess.should_stop() and not mode.stops_before_step(stop):
    progress.step, progress.local_step = step, local_step  # both: a step left behind
    start_time = time.time()
    progress.stepping.set()
    results = run_step(sess, run, mode, graph, worker.step_timeout_secs,
                       mode.step_feed(stop))
    progress.stepping.clear()
    if results is None:
      break  # async: the other workers have claimed the last updates (see run_step)
    duration = time.time() - start_time
    loss_value, outcome = results
    if stop.requested and mode.handed_own_token(step, outcome):  # sync: in no update
      break
    local_step += 1
    mode.after_step(run_fetch, outcome, worker.step_timeout_secs)
    shown = mode.shown_step(step, outcome)
    steps.check_loss(loss_value, shown, model_name, lambda: chief.untouched(run, graph),
                     ' on ' + run.who)
    if not mode.applied(outcome):  # fp16, async: this worker's own step overflowed
      step = outcome.step_after
      continue
    unlogged = (shown, loss_value, settings.batch_size * len(run.devices) / duration,
                duration / len(run.devices),
                ' [worker %d, local step %d]' % (run.task_index, local_step))
    if steps.crossed(last_shown, shown, log_frequency) or local_step == 1:
      steps.print_loss_line(*unlogged)
      unlogged = None
    step, last_shown = outcome.step_after, shown
  if unlogged:  # every worker shows its last step, at --max_steps or stopped by a signal
    steps.print_loss_line(*unlogged)
  # The hooks may have stopped the loop on an update another worker waited for.
  step = run_fetch(graph.global_step)
  if stop.requested:  # a job stopped whole stops together: the step the chief saves
    said = mode.step_stopped_at(graph.run_match, run_fetch, run)
    step = step if said is None else said
  progress.step, progress.local_step = step, local_step
  print('%s: closing the session at global step %d' % (run.who, step), flush=True)
  if step >= max_steps:
    mode.release_workers(sess)


def run_step(sess, run, mode, graph, step_timeout_secs, feed_dict=None):
  """One worker step under the watchdog and the step timeout: (loss, outcome), or None
  on OutOfRangeError: async, the other workers have claimed the last updates; sync,
  the token queue on the ps was closed (train() says so)."""
  secs = step_timeout_secs + mode.step_slack_secs
  run.arm_watchdog(secs, mode.stuck_step_message(secs))
  options = tf.compat.v1.RunOptions(timeout_in_ms=step_timeout_secs * 1000)
  try:
    _, loss_value, outcome = sess.run([graph.train_op, graph.loss, graph.outcome],
                                      feed_dict=feed_dict, options=options)
  except tf.errors.OutOfRangeError:
    return None
  except tf.errors.DeadlineExceededError as e:
    raise errors.PeerGone(mode.slow_step_message(step_timeout_secs)) from e
  return loss_value, outcome


def main(argv, slurm_cluster=None):
  """Runs this task: a ps task, a worker, TF_CONFIG's evaluator, or --local_cluster.

  slurm_cluster: what task_cluster.slurm_cluster_first() found before TensorFlow looked for GPUs.
  """
  with errors.one_line_errors():  # every error a user can cause: one line, its exit code
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
    check_flags(FLAGS)
    if FLAGS.local_cluster:
      # local_cluster's exit code: app.run exits with it
      return local_cluster.main(FLAGS, data_sets.DATASETS[FLAGS.dataset].input)
    cluster = task_cluster.cluster_from_flags(FLAGS, slurm_cluster)
    # Then at once, so that no Ctrl-C or SIGTERM is lost: a worker finishes its step,
    # the chief saves, a ps task stops waiting for the workers.
    stop = (signals.StopSignals(FLAGS.train_dir if cluster.job_name == 'worker' else None)
            if cluster.job_name != 'evaluator' else None)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # MonitoredSession's INFO
    settings = trainer_settings.settings_from_flags(FLAGS)
    if cluster.job_name == 'evaluator':
      return evaluator.run_evaluator(settings, data_sets.DATASETS, FLAGS.eval_dir,
                                     FLAGS.eval_interval_secs)
    jobs = {'worker': cluster.worker_hosts}
    if cluster.ps_hosts:  # without ps tasks (all-reduce), no 'ps' job
      jobs['ps'] = cluster.ps_hosts
    spec = tf.compat.v1.train.ClusterSpec(jobs)
    if ps_task.job_is_over(cluster, spec, settings):
      return
    if cluster.job_name == 'ps':
      return ps_task.run_ps(spec, cluster.task_index, stop)
    worker = WorkerSettings(**{name: FLAGS[name].value for name in WorkerSettings._fields})
    key_flags = FLAGS.get_key_flags_for_module(sys.argv[0])
    train(spec, cluster.task_index, settings, worker, stop=stop,
          flag_values={flag.name: flag.value for flag in key_flags},
          flags_given=[flag.name for flag in key_flags if flag.present])


def check_flags(flag_values):
  """errors.TrainingError, naming the flag, for a flag this program refuses or a bad value."""
  for name, why in REFUSED_FLAGS.items():
    if flag_values[name].present:
      raise errors.TrainingError('--%s is a multi_gpu_train.py flag that dist_train.py '
                                 'does not take: %s.' % (name, why))
  trainer_settings.apply_dataset_defaults(flag_values, DATASET_DEFAULTS)
  # --num_ps may be 0 (all-reduce): cluster_slurm checks it.
  trainer_settings.check_trainer_flags(flag_values, also_positive=(
      'startup_timeout_secs', 'step_timeout_secs', 'eval_interval_secs'))
  task_cluster.check_flags(flag_values)
  for name in ('startup_timeout_secs', 'step_timeout_secs', 'eval_interval_secs'):
    if flag_values[name].value > evaluation.MAX_EVAL_INTERVAL_SECS:
      raise errors.TrainingError('--%s must be at most %d (a week), got %d' % (
          name, evaluation.MAX_EVAL_INTERVAL_SECS, flag_values[name].value))
  replicas = flag_values.replicas_to_aggregate
  if flag_values.all_reduce and (flag_values.sync_replicas or replicas is not None):
    raise errors.TrainingError('--all_reduce is sync already, one gradient from each worker '
                               'per update: drop --%s' % ('sync_replicas' if
                                                          flag_values.sync_replicas else
                                                          'replicas_to_aggregate'))
  if replicas is not None and not flag_values.sync_replicas:
    raise errors.TrainingError('--replicas_to_aggregate=%d needs --sync_replicas: async '
                               'workers apply their gradients one by one' % replicas)
  if replicas is not None and replicas < 1:
    raise errors.TrainingError('--replicas_to_aggregate must be at least 1, got %d' % replicas)


if __name__ == '__main__':
  define_flags()
  # Sets CUDA_VISIBLE_DEVICES, so before anything looks for GPUs.
  slurm_cluster = task_cluster.slurm_cluster_first(sys.argv, FLAGS)
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(functools.partial(main, slurm_cluster=slurm_cluster))
