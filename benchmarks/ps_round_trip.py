"""What one dist_train.py step costs beyond multi_gpu_train.py's, split into its parts.

    python benchmarks/ps_round_trip.py             # one ps task and this worker on 127.0.0.1
    python benchmarks/ps_round_trip.py --rounds 3  # a quick look

Starts one ps task (a tf.distribute.Server in a subprocess) and, in this process,
a worker of the same cluster that places the CIFAR-10 model's variables on the ps
with replica_device_setter, as dist_train.py does. Then times, median of --rounds
(ROUNDS), each kind in turn within every round:

The transfers (first table):
  read      every trainable variable fetched to the worker (the reads a step makes)
  send      a worker-made gradient of every variable applied on the ps with SGD
  both      the two in one sess.run, as a step does

The step (second table), one tower of STEP_BATCH images on a fixed batch, each row
built from the programs' own functions (build_towers, average_gradients, the
updates of worker_updates, the chief's hooks of worker_sessions) and adding one
part to the row above it:
  local          multi_gpu_train.py's step: apply, global step, moving averages
  local plain    the towers and a plain SGD apply, no global step, no averages
  ps plain       the same with the variables on the ps
  + claim        the async global-step claim before the apply (count_up_to)
  + averages     the moving averages after it, on the ps: AsyncUpdates' step
  + hooks        in a MonitoredSession with the chief's hooks, as dist_train.py's loop
                 runs it: a step that neither logs a summary nor saves
  summary step   the same on a step that writes the TensorBoard summaries
  save step      the same on a step that saves a checkpoint
  sync           SyncReplicasOptimizer's step, one worker (the chief), its hooks
ps plain - local plain splits into moving the variables (both, via ps - local) and
the distributed runtime's share (the rest). Beside each step, the CPU time it took
in this process (the worker) and in the ps task: the ps task shares this machine's
cores with the worker, and what it and gRPC spend is taken from the towers.

    python benchmarks/ps_round_trip.py --ps_cpus=1   # the ps task on CPU 1, the worker
                                                     # and the local steps on the others

--ps_cpus gives the ps task cores of its own, as a ps task on a machine of its own
has: the worker then pays the transfers' latency and its own share of their CPU,
not the ps task's. This process re-executes itself once on the other CPUs, so that
TensorFlow sizes its thread pools for them.
"""
import collections
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402  after the path

import cifar10  # noqa: E402
import multi_gpu_train  # noqa: E402
from distributed import local_cluster, worker_sessions, worker_updates  # noqa: E402
from training import checkpoints, summaries, updates  # noqa: E402
from timing import ArgumentParser  # noqa: E402  benchmarks/, this script's directory

ROUNDS = 30                       # timed sess.runs per kind, after WARMUP
STEP_BATCH = 128                  # images per step: one tower at the trainer's default
WARMUP = 5
EPOCH = 50000                     # examples per epoch, for the learning-rate schedule
NEVER = 10 ** 9                   # a --max_steps, summary or save interval never reached
WORKER = '/job:worker/task:0'
# Closing a session: how long the sync chief's queue runner, waiting in take_grad, may
# take to stop (MonitoredSession's default, 120 s, would be spent in full every run).
CLOSE_SECS = 2
# argv: the ps address, the worker's, then the CPUs to pin the ps task to, if any
PS_CODE = ('import os, sys; sys.argv[3:] and os.sched_setaffinity(0, map(int, sys.argv[3:])); '
           'import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec('
           '{"ps": [sys.argv[1]], "worker": [sys.argv[2]]}), "ps", 0).join()')
KEPT_OFF_ENV = 'PS_ROUND_TRIP_KEPT_OFF'  # set in the process --ps_cpus re-executed
TRANSFERS = ('read', 'send', 'both')
STEPS = ('local', 'local plain', 'ps plain', '+ claim', '+ averages', '+ hooks',
         'summary step', 'save step', 'sync')
# What worker_updates.SyncUpdates reads of dist_train.py's WorkerRun: itself, the only worker.
SyncRun = collections.namedtuple('SyncRun', 'num_workers task_index is_chief')


def build_transfers(device_setter):
  """The model's variables, a read of each to the worker, an SGD send of a gradient
  each, and both: the transfer kinds to time."""
  with tf.compat.v1.device(device_setter):  # variables on the ps, the rest on the worker
    cifar10.inference(tf.zeros((1, 24, 24, 3)))
    variables = tf.compat.v1.trainable_variables()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(1e-3)
  with tf.compat.v1.device(WORKER if device_setter else None):
    reads = tf.group(*[tf.identity(v) * 1.0 for v in variables])
    grads = [tf.ones(v.shape) * 1e-9 for v in variables]
  send = optimizer.apply_gradients(zip(grads, variables))
  return variables, dict(read=reads, send=send, both=tf.group(reads, send))


def fixed_batch():
  rng = np.random.default_rng(0)
  return (tf.constant(rng.standard_normal((STEP_BATCH, 24, 24, 3), np.float32)),
          tf.constant(rng.integers(0, 10, STEP_BATCH, np.int32)))


def build_step(kind, device_setter, train_dir):
  """One step of `kind` (STEPS) in the current graph: (fetches, hooks, summary op).

  Hooks (writing to train_dir) and a summary op only for the kinds dist_train.py's
  loop runs in a MonitoredSession; None for the others.
  """
  if kind == 'local':
    graph = multi_gpu_train.build(fixed_batch, ['/cpu:0'], STEP_BATCH, EPOCH, summaries=False)
    return [graph.train_op, graph.loss], None, None
  with tf.compat.v1.device(device_setter):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    lr, _ = updates.learning_rate(global_step, STEP_BATCH, EPOCH, cifar10)
    opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    towers = multi_gpu_train.build_towers(fixed_batch, ['/cpu:0'], opt,
                                          variables_device='' if device_setter else '/cpu:0')
    with tf.compat.v1.device('/cpu:0'):
      grads = multi_gpu_train.average_gradients(towers.grads)
      loss = tf.reduce_mean(tf.stack(towers.losses))
    if kind in ('local plain', 'ps plain'):
      return [opt.apply_gradients(grads), loss], None, None
    if kind == '+ claim':
      return ([worker_updates.claim_then_apply(opt, grads, global_step, NEVER), loss], None,
              None)
    ema = updates.moving_averages(global_step, cifar10)
    mode = (worker_updates.SyncUpdates(SyncRun(1, 0, True)) if kind == 'sync' else
            worker_updates.AsyncUpdates(None))
    update = mode.build(opt, grads, global_step, ema, NEVER)
    fetches = [update.train_op, loss, update.outcome.step_after]
    if kind == '+ averages':
      return fetches, None, None
    summary_op = summaries.build_summaries([0], towers.losses, grads, lr, cifar10)
    return (fetches, update.hooks + chief_hooks(kind, global_step, summary_op, train_dir),
            summary_op)


def chief_hooks(kind, global_step, summary_op, train_dir):
  """distributed/chief.py's hooks() two, saving or summarising every step for those kinds."""
  return [worker_sessions.SaveCheckpoints(
              train_dir, 1 if kind == 'save step' else NEVER, 2, checkpoints.make_saver(),
              global_step, checkpoints.all_variables_finite(), 'cifar10', None),
          worker_sessions.WriteSummaries(
              train_dir, 1 if kind == 'summary step' else NEVER, summary_op, global_step,
              dict(start_step=0), STEP_BATCH)]


def open_step(kind, cluster, target, train_dir):
  """(session, fetches, run options) for the step `kind`, in a graph of its own; its
  checkpoints and summaries, if any, in train_dir."""
  remote = 'local' not in kind
  with tf.Graph().as_default():
    device_setter = remote and tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device=WORKER)
    fetches, hooks, summary_op = build_step(kind, device_setter, train_dir)
    if hooks is None:
      sess = tf.compat.v1.Session(target if remote else '')
      sess.run(tf.compat.v1.global_variables_initializer())
      return sess, fetches, None
    scaffold = tf.compat.v1.train.Scaffold(saver=checkpoints.make_saver(),
                                           summary_op=summary_op)
    sess = tf.compat.v1.train.MonitoredSession(
        session_creator=tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold,
                                                               master=target),
        hooks=hooks, stop_grace_period_secs=CLOSE_SECS)
  # dist_train.run_step runs every step under the step timeout
  return sess, fetches, tf.compat.v1.RunOptions(timeout_in_ms=3600 * 1000)


Timing = collections.namedtuple('Timing', 'ms cpu_ms ps_cpu_ms')


def time_kinds(runs, rounds, ps_pid):
  """{kind: Timing}: runs {kind: (session, fetches, run options)}, each kind once per
  round, in turn, after WARMUP rounds. ms: the median sess.run; cpu_ms, ps_cpu_ms: the
  mean CPU time of a run in this process and in the ps task (process ps_pid)."""
  times = {kind: [] for kind in runs}
  cpu = {kind: [0.0, 0.0] for kind in runs}
  for i in range(WARMUP + rounds):
    for kind, (sess, fetches, options) in runs.items():
      ps_start, cpu_start = process_cpu_secs(ps_pid), time.process_time()
      start = time.perf_counter()
      sess.run(fetches, options=options)
      if i >= WARMUP:
        times[kind].append(time.perf_counter() - start)
        cpu[kind][0] += time.process_time() - cpu_start
        cpu[kind][1] += process_cpu_secs(ps_pid) - ps_start
  return {kind: Timing(1000 * statistics.median(t), *(1000 * c / rounds for c in cpu[kind]))
          for kind, t in times.items()}


def process_cpu_secs(pid):
  """CPU seconds process pid has used, all its threads: Linux's CPU-time clock of a
  process (what clock_getcpuclockid returns; Python does not wrap that call)."""
  return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED, of the whole process


def time_transfers(cluster, target, rounds, ps_pid):
  """({kind: ms via the ps}, {kind: ms local}, number of variables, their megabytes)."""
  timed = []
  for device_setter, master in ((tf.compat.v1.train.replica_device_setter(cluster=cluster),
                                 target), (None, '')):
    with tf.Graph().as_default():
      variables, ops = build_transfers(device_setter)
      with tf.compat.v1.Session(master) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        timed.append({kind: timing.ms for kind, timing in time_kinds(
            {kind: (sess, op, None) for kind, op in ops.items()}, rounds, ps_pid).items()})
  megabytes = sum(v.shape.num_elements() * 4 for v in variables) / 1e6
  return timed[0], timed[1], len(variables), megabytes


def time_steps(cluster, target, rounds, ps_pid):
  """{kind: Timing} for STEPS, interleaved."""
  with tempfile.TemporaryDirectory(prefix='ps_round_trip_') as root, \
      contextlib.redirect_stdout(io.StringIO()):  # the save step's 'Saved checkpoint' lines
    runs = {kind: open_step(kind, cluster, target, os.path.join(root, 'kind%d' % i))
            for i, kind in enumerate(STEPS)}
    try:
      return time_kinds(runs, rounds, ps_pid)
    finally:
      for sess, _, _ in runs.values():
        sess.close()


def print_transfers(remote, local, num_variables, megabytes, rounds):
  print('%d variables, %.1f MB; ms per sess.run, median of %d' % (num_variables, megabytes,
                                                                  rounds))
  print('%-6s %10s %10s' % ('', 'via ps', 'local'))
  for kind in TRANSFERS:
    print('%-6s %10.2f %10.2f' % (kind, remote[kind], local[kind]))


def print_split(step, transfer):
  """The step table: each row, what it adds to the one it builds on, its CPU time."""
  ms = {kind: timing.ms for kind, timing in step.items()}
  runtime = ms['ps plain'] - ms['local plain'] - transfer
  print()
  print('One step of %d images on 1 tower: ms per sess.run, what it adds, and its CPU ms in '
        'this process (the worker) and in the ps task, means' % STEP_BATCH)
  rows = [  # (label, kind, the kind it adds to); kind None: a part of the row above
      ('local: multi_gpu_train.py\'s step', 'local', None),
      ('local plain: no global step, no averages', 'local plain', 'local'),
      ('ps plain: variables on the ps', 'ps plain', 'local plain'),
      ('  moving the variables (both, via ps - local)', None, transfer),
      ('  the distributed runtime (the rest)', None, runtime),
      ('+ claim: count_up_to before the apply', '+ claim', 'ps plain'),
      ('+ averages: AsyncUpdates\' step', '+ averages', '+ claim'),
      ('+ hooks: MonitoredSession, chief\'s hooks', '+ hooks', '+ averages'),
      ('summary step: the same, writing summaries', 'summary step', '+ hooks'),
      ('save step: the same, saving a checkpoint', 'save step', '+ hooks'),
      ('sync: SyncReplicasOptimizer, its hooks', 'sync', '+ hooks')]
  print('%-46s %8s %8s %8s %8s' % ('', 'ms', 'adds', 'CPU', 'ps CPU'))
  for label, kind, base in rows:
    if kind is None:
      print('%-46s %17.2f' % (label, base))
      continue
    adds = '' if base is None else '%+8.2f' % (ms[kind] - ms[base])
    print('%-46s %8.2f %8s %8.1f %8.1f' % (label, ms[kind], adds, step[kind].cpu_ms,
                                          step[kind].ps_cpu_ms))
  print('an async step (+ hooks) runs at %.2fx multi_gpu_train.py\'s rate; a sync step at '
        '%.2fx' % (ms['local'] / ms['+ hooks'], ms['local'] / ms['sync']))
  cpu = lambda kind: step[kind].cpu_ms + step[kind].ps_cpu_ms
  print('CPU ms per step, worker and ps task together: async %.1f, sync %.1f, local %.1f (this '
        'process on CPUs %s)' % (cpu('+ hooks'), cpu('sync'), cpu('local'),
                                 cpu_names(os.sched_getaffinity(0))))


def keep_off(ps_cpus, parser):
  """--ps_cpus: re-executes this process once on its CPUs other than ps_cpus, so that
  TensorFlow, imported above, sizes its thread pools for those."""
  if os.environ.get(KEPT_OFF_ENV):
    return  # the process re-executed
  allowed = os.sched_getaffinity(0)
  if not ps_cpus < allowed:
    parser.error('--ps_cpus=%s: give some of the CPUs this process may run on (%s), not all '
                 'of them' % (cpu_names(ps_cpus), cpu_names(allowed)))
  os.sched_setaffinity(0, allowed - ps_cpus)
  os.environ[KEPT_OFF_ENV] = '1'
  os.execv(sys.executable, [sys.executable] + sys.argv)


def cpu_names(cpus):
  return ','.join(map(str, sorted(cpus)))


def main(argv):
  parser = ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
  parser.add_argument('--rounds', type=int, default=ROUNDS, help='timed runs per kind')
  parser.add_argument('--ps_cpus', default='',
                      help='CPUs for the ps task alone, e.g. 1; this process runs on the others')
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error('--rounds must be at least 1, got %d' % args.rounds)
  try:
    args.ps_cpus = {int(cpu) for cpu in args.ps_cpus.split(',')} if args.ps_cpus else set()
  except ValueError:
    parser.error('--ps_cpus must be CPU numbers, comma separated, got %r' % args.ps_cpus)
  if args.ps_cpus:
    keep_off(args.ps_cpus, parser)
    print('the ps task on CPUs %s, this worker on CPUs %s' % (
        cpu_names(args.ps_cpus), cpu_names(os.sched_getaffinity(0))))
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)  # MonitoredSession's INFO
  ps_port, worker_port = local_cluster.free_ports(2)
  ps, worker = '127.0.0.1:%d' % ps_port, '127.0.0.1:%d' % worker_port
  ps_task = subprocess.Popen([sys.executable, '-c', PS_CODE, ps, worker] +
                             [str(cpu) for cpu in sorted(args.ps_cpus)])
  try:
    cluster = tf.train.ClusterSpec({'ps': [ps], 'worker': [worker]})
    server = tf.distribute.Server(cluster, 'worker', 0)
    remote, local, num_variables, megabytes = time_transfers(cluster, server.target,
                                                             args.rounds, ps_task.pid)
    step = time_steps(cluster, server.target, args.rounds, ps_task.pid)
  finally:
    ps_task.kill()
  print_transfers(remote, local, num_variables, megabytes, args.rounds)
  print_split(step, remote['both'] - local['both'])


if __name__ == '__main__':
  main(sys.argv[1:])
