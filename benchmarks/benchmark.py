"""Benchmarks the multi-tower trainer: examples/sec, FLOPs, memory, and a Keras peer.

    python benchmarks/benchmark.py                 # the table, towers 1, 2, 4
    python benchmarks/benchmark.py --repeats 3     # three times over, medians across
    python benchmarks/benchmark.py --extras        # cost of moving averages and summaries
    python benchmarks/benchmark.py --knobs         # threads, XLA and prefetch at 2 towers
    python benchmarks/benchmark.py --quick         # smoke test: 1 tower, 3 steps, batch 16

On a quiet 2-core machine (~1500 examples/sec) the table takes about 3 minutes per
repeat, --extras about 3 and --knobs about 2; other work on the cores halves the
numbers, so the start-up line prints the load average. The model costs 105.3
MFLOP per example per training step (flop_count).

It drives the trainer's own graph: multi_gpu_train.build_train_graph() over the
devices of tower_devices(n), in a session made by session_config(), fed by a
one-shot iterator on /cpu:0 exactly as train() does. Each step is one sess.run of
[train op, loss], and only that call is timed. Each configuration runs in a fresh
subprocess (`benchmark.py --worker '<json>'`, one JSON line back), so the virtual
CPU devices, thread pools and memory start clean and peak memory is that
process's own ru_maxrss. The parent never imports TensorFlow.

The table, per number of towers N (global batch N x --batch_size):
  real, synthetic   examples/sec with generated files in the real CIFAR-10 layout
                    (cifar10_input.distorted_dataset) and with in-memory batches
                    (synthetic_dataset): median over --steps timed steps after
                    --warmup, [slowest step - fastest step]
  real/syn          what the input pipeline costs (it shares the cores with the model)
  peer, ours/peer   the same model in Keras under MirroredStrategy on the same
                    devices and global batch, synthetic input (keras_peer.py)
  GFLOP/s, of mm    synthetic examples/sec x FLOPs per example (from the layer
                    shapes, see flop_count), and that as a share of the machine's
                    measured float32 matmul rate
  peak MB           ru_maxrss of the real / synthetic / peer subprocess
Above it: FLOPs per example, the matmul rate, and the input pipeline alone.

Timed steps exclude summaries: the trainer fetches them once per SUMMARY_STEPS
steps; --extras measures that, and the moving averages, separately.
Numbers go to --json (default benchmarks/results/<mode>.json).
"""
import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # multi_gpu_train, cifar10, cifar10_input: imported by the workers
BATCHES_DIR = 'cifar-10-batches-bin'  # cifar10_input's; this parent imports no TensorFlow

# ---- Benchmark knobs: edit, save, rerun -----------------------------------------
TOWERS = '1,2,4'                  # tower counts of the table, one row each
BATCH_SIZE = 128                  # images per tower, as the trainer's BATCH_SIZE
TIMED_STEPS = 50                  # steps timed per configuration; the median is reported
WARMUP_STEPS = 10                 # untimed steps first: graph optimisation, buffers filling
REPEATS = 1                       # times the whole interleaved sequence runs
RECORDS_PER_FILE = 10000          # generated records per .bin file, as the official files
MATMUL_SIZE = 2048                # n of the n x n float32 matmul: 2 n^3 FLOP = 17.2 GFLOP
MATMUL_RUNS = 10                  # timed matmuls; the median rate is reported
SUMMARY_SAMPLES = 10              # --extras: steps timed with the summary op fetched
KNOB_TOWERS = 2                   # --knobs: towers of every knob run
WORKER_TIMEOUT_SECS = 3600        # a worker still running after this is killed
RESULTS_DIR = os.path.join(ROOT, 'benchmarks', 'results')

# --quick: small enough for a test; flags given explicitly still win.
QUICK = dict(towers='1', steps=3, warmup=1, batch_size=16, records_per_file=64,
             matmul_size=256)

RESULT_PREFIX = 'BENCHMARK_RESULT '  # the worker's one line of JSON starts with this


class BenchmarkError(Exception):
  """A configuration failed; the message names it and shows the worker's output."""


# ---- FLOPs ----------------------------------------------------------------------
def flop_count(layers):
  """FLOPs per example of one training step, from the layers' shapes.

  Per layer with M multiply-adds per example (conv: out_h*out_w*out_c * k*k*in_c;
  dense: in*out):
    forward                  F = 2 M   (a multiply and an add each)
    gradient wrt the weights     2 M   (the same products, input x output gradient)
    gradient wrt the input       2 M   (output gradient x weights), except conv1,
                                       whose input is the image and needs none
  so a step costs 3 x forward - conv1's forward. For the tutorial's model:
    conv1    M = 24*24*64 * 5*5*3  =  2,764,800   F =  5.53 MFLOP
    conv2    M = 12*12*64 * 5*5*64 = 14,745,600   F = 29.49
    local3   M = 2304 * 384        =    884,736   F =  1.77
    local4   M = 384 * 192         =     73,728   F =  0.15
    softmax  M = 192 * 10          =      1,920   F =  0.004
    forward 36.94 + weight gradients 36.94 + input gradients 31.41
      = 105.3 MFLOP per example (105,295,104)
  Biases, relu, pooling, LRN and the loss are left out: about 0.7 MFLOP forward
  (mostly the two LRNs), 1-2% of the total.

  Args:
    layers: list of dicts with name, macs (multiply-adds per example) and
      input_gradient (bool), from the 'flops' worker.

  Returns:
    dict of FLOPs per example: forward, backward_weights, backward_inputs, total.
  """
  forward = sum(2 * layer['macs'] for layer in layers)
  backward_inputs = sum(2 * layer['macs'] for layer in layers if layer['input_gradient'])
  return dict(forward=forward, backward_weights=forward, backward_inputs=backward_inputs,
              total=2 * forward + backward_inputs)


# ---- Workers: each runs in its own process and returns one dict -----------------
def _import_tensorflow():
  """TensorFlow in graph mode, imported only in workers (the parent stays light)."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow as tf
  tf.get_logger().setLevel('ERROR')
  return tf


def _peak_mb():
  """This process's peak resident memory in MB (ru_maxrss: KB on Linux, bytes on macOS)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2 ** 20 if sys.platform == 'darwin' else 2 ** 10)


def _time_steps(run_step, warmup, steps):
  """Runs warmup untimed steps, then returns the seconds of each of `steps` steps."""
  for _ in range(warmup):
    run_step()
  durations = []
  for _ in range(steps):
    start = time.perf_counter()
    run_step()
    durations.append(time.perf_counter() - start)
  return durations


def worker_flops(config):
  """Multiply-adds per example of each Conv2D and MatMul of cifar10.inference."""
  del config
  tf = _import_tensorflow()
  import cifar10
  with tf.Graph().as_default() as graph:
    images = tf.compat.v1.placeholder(tf.float32, [1, cifar10.IMAGE_SIZE,
                                                   cifar10.IMAGE_SIZE, 3])
    cifar10.inference(images)
  layers = []
  for op in graph.get_operations():
    if op.type == 'Conv2D':
      _, height, width, out_channels = op.outputs[0].shape
      kernel_h, kernel_w, in_channels, _ = op.inputs[1].shape
      macs = height * width * out_channels * kernel_h * kernel_w * in_channels
    elif op.type == 'MatMul':
      inputs, outputs = op.inputs[1].shape
      macs = inputs * outputs
    else:
      continue
    layers.append(dict(name=op.name.split('/')[0], op=op.type, macs=int(macs),
                       input_gradient=op.inputs[0] is not images))
  return dict(layers=layers)


def worker_matmul(config):
  """The machine's float32 matmul rate: an n x n product in a graph session, all cores."""
  tf = _import_tensorflow()
  import multi_gpu_train
  tf.compat.v1.disable_eager_execution()
  n = config['size']
  with tf.Graph().as_default():
    # Variables, not constants, so grappler cannot fold the product away.
    normal = tf.compat.v1.random_normal_initializer()
    a = tf.compat.v1.get_variable('a', [n, n], initializer=normal)
    b = tf.compat.v1.get_variable('b', [n, n], initializer=normal)
    product = tf.matmul(a, b)
    with tf.compat.v1.Session(config=multi_gpu_train.session_config(1)) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      # Running the op without fetching its output: no 16 MB copy into numpy.
      durations = _time_steps(lambda: sess.run(product.op), 2, config['runs'])
  return dict(durations=durations, gflops=2 * n ** 3 / statistics.median(durations) / 1e9,
              peak_mb=_peak_mb())


def worker_pipeline(config):
  """The input pipeline alone: distorted_dataset batches, no model."""
  tf = _import_tensorflow()
  import cifar10_input
  import multi_gpu_train
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    with tf.device('/cpu:0'):
      dataset = cifar10_input.distorted_dataset(config['data_dir'], config['batch_size'])
      images, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    session_config = multi_gpu_train.session_config(
        1, intra_op_threads=config['intra'], inter_op_threads=config['inter'])
    with tf.compat.v1.Session(config=session_config) as sess:
      # The op alone: the batch stays in TensorFlow, as it does for the towers.
      durations = _time_steps(lambda: sess.run(images.op), config['warmup'],
                              config['steps'])
  return dict(durations=durations, examples_per_step=config['batch_size'],
              peak_mb=_peak_mb())


def _build_trainer_graph(tf, config):
  """train()'s input and graph, from the trainer's own functions.

  config keys: towers, batch_size, input ('synthetic' or 'real'), data_dir, intra,
  inter, xla (auto-clustering), extra_prefetch (batches buffered on top of the
  pipeline's own prefetch; 0: none), summaries (build the summary op), seed
  (real input: the trainer's --seed pipeline; None: its unseeded one).

  Returns:
    (build_train_graph's dict plus 'input_init', the op that starts the input, to
     run in the session; its session ConfigProto; devices; where-line).
  """
  import cifar10_input
  import multi_gpu_train
  batch_size = config['batch_size']
  devices, num_cpu_devices, where = multi_gpu_train.tower_devices(config['towers'])
  if config.get('seed') is not None:
    next_batch, input_init = multi_gpu_train.input_pipeline(
        config['data_dir'], config['towers'], batch_size, seed=config['seed'])
  else:
    with tf.device('/cpu:0'):
      if config['input'] == 'synthetic':
        dataset = cifar10_input.synthetic_dataset(batch_size)
      else:
        dataset = cifar10_input.distorted_dataset(config['data_dir'], batch_size)
      if config['extra_prefetch']:
        dataset = dataset.prefetch(config['extra_prefetch'])
      iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
      next_batch, input_init = iterator.get_next, iterator.initializer
  graph = multi_gpu_train.build_train_graph(next_batch, devices, batch_size,
                                            async_towers=False,
                                            summaries=config['summaries'])
  graph['input_init'] = input_init
  session_config = multi_gpu_train.session_config(
      num_cpu_devices, intra_op_threads=config['intra'], inter_op_threads=config['inter'])
  if config['xla']:
    session_config.graph_options.optimizer_options.global_jit_level = (
        tf.compat.v1.OptimizerOptions.ON_1)
  return graph, session_config, devices, where


def _check_losses(losses):
  if not all(math.isfinite(loss) for loss in losses):
    raise BenchmarkError('loss became %s: the model diverged; try a smaller --batch_size'
                         % losses[-1])


def worker_ours(config):
  """The trainer's step: [train op, loss] in one sess.run, timed.

  config: as _build_trainer_graph's, plus steps and warmup.
  """
  tf = _import_tensorflow()
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    graph, session_config, devices, where = _build_trainer_graph(tf, config)
    fetches = [graph['train_ops'][0], graph['loss']]
    init = tf.compat.v1.global_variables_initializer()
    result = dict(where=where, examples_per_step=config['batch_size'] * len(devices))
    with tf.compat.v1.Session(config=session_config) as sess:
      sess.run([init, graph['input_init']])
      losses = []
      result['durations'] = _time_steps(lambda: losses.append(sess.run(fetches)[1]),
                                        config['warmup'], config['steps'])
      if config['xla']:
        result['xla_ops_run'] = _count_xla_ops(tf, sess, fetches)
  _check_losses(losses)
  result.update(first_loss=float(losses[0]), last_loss=float(losses[-1]),
                peak_mb=_peak_mb())
  return result


def worker_extras(config):
  """The trainer's per-step extras, timed step by step in one session.

  One graph with summaries; each round times an update-only step and a train-op
  step (alternating which goes first), and every few rounds a summary step: the
  train op plus the summary op and the write of its result, as the trainer does
  once per SUMMARY_STEPS steps. Steps that do not fetch the summary op do not run
  it, so the train-op steps cost what they cost in a graph without summaries
  (run_extras checks that against a summaries=False process).

  config: as _build_trainer_graph's, plus steps, warmup and summary_samples.
  """
  tf = _import_tensorflow()
  import multi_gpu_train
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    graph, session_config, devices, where = _build_trainer_graph(
        tf, dict(config, summaries=True))
    loss, train_op = graph['loss'], graph['train_ops'][0]
    kinds = dict(update_only=[graph['apply_ops'][0], loss], train_op=[train_op, loss],
                 summary=[train_op, loss, graph['summary_op']])
    init = tf.compat.v1.global_variables_initializer()
    durations = {kind: [] for kind in kinds}
    losses = []
    every = max(1, config['steps'] // config['summary_samples'])
    with tf.compat.v1.Session(config=session_config) as sess, \
        tempfile.TemporaryDirectory() as log_dir:
      sess.run([init, graph['input_init']])
      writer = tf.compat.v1.summary.FileWriter(log_dir)

      def step(kind, timed=True):
        start = time.perf_counter()
        results = sess.run(kinds[kind])
        if kind == 'summary':
          writer.add_summary(results[2], len(losses))
        if timed:
          durations[kind].append(time.perf_counter() - start)
        losses.append(results[1])

      for kind in kinds:  # the first summary step also builds the histograms' kernels
        for _ in range(config['warmup']):
          step(kind, timed=False)
      for i in range(config['steps']):
        for kind in ('update_only', 'train_op') if i % 2 else ('train_op', 'update_only'):
          step(kind)
        if i % every == 0:
          step('summary')
      writer.close()
  _check_losses(losses)
  return dict(where=where, examples_per_step=config['batch_size'] * len(devices),
              durations=durations, summary_steps=multi_gpu_train.SUMMARY_STEPS,
              peak_mb=_peak_mb())


def _count_xla_ops(tf, sess, fetches):
  """Compiled XLA clusters that ran in one traced step: 0 means XLA did nothing."""
  options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  metadata = tf.compat.v1.RunMetadata()
  sess.run(fetches, options=options, run_metadata=metadata)
  return sum(1 for device in metadata.step_stats.dev_stats for node in device.node_stats
             if 'XlaRun' in node.timeline_label or 'XlaRun' in node.node_name)


def worker_peer(config):
  """The Keras peer under MirroredStrategy over `towers` virtual CPU devices."""
  tf = _import_tensorflow()
  import cifar10_input
  import keras
  import keras_peer
  tf.config.threading.set_intra_op_parallelism_threads(config['intra'])
  tf.config.threading.set_inter_op_parallelism_threads(config['inter'])
  towers, batch_size = config['towers'], config['batch_size']
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * towers)
  strategy = tf.distribute.MirroredStrategy(
      devices=['/cpu:%d' % i for i in range(towers)])
  global_batch = batch_size * towers
  with strategy.scope():
    model = keras_peer.build_model()
    optimizer = keras.optimizers.SGD(learning_rate=keras_peer.LEARNING_RATE)
    optimizer.build(model.trainable_variables)
  # Each replica draws its own batch_size batch, as each tower does.
  dataset = strategy.distribute_datasets_from_function(
      lambda context: cifar10_input.synthetic_dataset(
          context.get_per_replica_batch_size(global_batch)))
  iterator = iter(dataset)
  train_step = keras_peer.make_train_step(strategy, model, optimizer, global_batch)
  losses = []
  # float() waits for the step to finish, as sess.run does.
  durations = _time_steps(lambda: losses.append(float(train_step(iterator))),
                          config['warmup'], config['steps'])
  if not all(math.isfinite(loss) for loss in losses):
    raise BenchmarkError('peer loss became %s: the model diverged' % losses[-1])
  return dict(durations=durations, examples_per_step=global_batch,
              replicas=strategy.num_replicas_in_sync, first_loss=losses[0],
              last_loss=losses[-1], peak_mb=_peak_mb())


WORKERS = dict(flops=worker_flops, matmul=worker_matmul, pipeline=worker_pipeline,
               ours=worker_ours, extras=worker_extras, peer=worker_peer)


# ---- The parent: runs workers, gathers, prints ----------------------------------
class Runner:
  """Runs worker subprocesses one at a time, numbering them for the progress lines."""

  def __init__(self, total):
    self.total, self.done = total, 0

  def run(self, label, config, env=None):
    """Runs one configuration in a fresh process; returns its result dict."""
    self.done += 1
    command = [sys.executable, os.path.abspath(__file__), '--worker', json.dumps(config)]
    worker_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', **(env or {}))
    start = time.time()
    try:
      proc = subprocess.run(command, capture_output=True, text=True, env=worker_env,
                            timeout=WORKER_TIMEOUT_SECS)
    except subprocess.TimeoutExpired as e:
      raise BenchmarkError('%s ran longer than %d s and was stopped; lower --steps or '
                           '--batch_size' % (label, WORKER_TIMEOUT_SECS)) from e
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode or not lines:
      output = (proc.stdout + proc.stderr).strip().splitlines()
      raise BenchmarkError('%s failed (exit status %d). Its last output lines:\n%s\n'
                           'To rerun it alone: %s --worker \'%s\''
                           % (label, proc.returncode, '\n'.join(output[-25:]),
                              os.path.relpath(__file__), json.dumps(config)))
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result.update(label=label, config=config, wall_sec=time.time() - start)
    rate = ''
    if 'examples_per_step' in result:
      durations = result['durations']
      if isinstance(durations, dict):  # extras: the train op's steps
        durations = durations['train_op']
      rate = ': %.1f examples/sec' % (result['examples_per_step'] /
                                      statistics.median(durations))
    elif 'gflops' in result:
      rate = ': %.1f GFLOP/s' % result['gflops']
    print('[%2d/%d] %s%s (%.0f s)' % (self.done, self.total, label, rate,
                                      result['wall_sec']), file=sys.stderr, flush=True)
    return result


def rate_stats(results):
  """examples/sec over one configuration's runs (one per repeat).

  Returns:
    dict: examples_per_sec (median over repeats of each run's median step),
    min and max (slowest and fastest single step of any run), peak_mb (largest).
  """
  medians = [r['examples_per_step'] / statistics.median(r['durations']) for r in results]
  return dict(examples_per_sec=statistics.median(medians),
              min=min(r['examples_per_step'] / max(r['durations']) for r in results),
              max=max(r['examples_per_step'] / min(r['durations']) for r in results),
              per_repeat=medians, peak_mb=max(r['peak_mb'] for r in results),
              steps=sum(len(r['durations']) for r in results))


def _rate(stats, width=7):
  """'  812 [ 640- 851]': median examples/sec [slowest step - fastest step]."""
  if not stats:
    return '-'.center(width + 13)
  return '%*.0f [%4.0f-%4.0f]' % (width, stats['examples_per_sec'], stats['min'],
                                  stats['max'])


def _ratio(numerator, denominator):
  if not numerator or not denominator:
    return None
  return numerator['examples_per_sec'] / denominator['examples_per_sec']


def _fmt(value, pattern):
  return '-' if value is None else pattern % value


def ours_config(args, towers, input_name, data_dir=None, **overrides):
  """A worker config for the trainer's graph; overrides set the knobs."""
  config = dict(kind='ours', towers=towers, batch_size=args.batch_size, input=input_name,
                data_dir=data_dir, steps=args.steps, warmup=args.warmup,
                intra=args.intra_op_threads, inter=args.inter_op_threads, xla=False,
                extra_prefetch=0, summaries=False)
  config.update(overrides)
  return config


def run_table(args, data_dir):
  """The main table: real, synthetic and peer per tower count, plus the machine's rates."""
  towers_list = args.towers
  per_repeat = 2 + len(towers_list) * (2 if args.skip_peer else 3)
  runner = Runner(1 + args.repeats * per_repeat)
  layers = runner.run('FLOPs from the layer shapes', dict(kind='flops'))['layers']
  flops = flop_count(layers)
  runs = {}

  def run(key, label, config):
    runs.setdefault(key, []).append(runner.run(label, config))

  common = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                intra=args.intra_op_threads, inter=args.inter_op_threads)
  for repeat in range(args.repeats):
    tag = ' (repeat %d/%d)' % (repeat + 1, args.repeats) if args.repeats > 1 else ''
    run('matmul', 'matmul %dx%d%s' % (args.matmul_size, args.matmul_size, tag),
        dict(kind='matmul', size=args.matmul_size, runs=MATMUL_RUNS))
    run('pipeline', 'input pipeline alone%s' % tag,
        dict(kind='pipeline', data_dir=data_dir, **common))
    for towers in towers_list:  # interleaved: ours, peer, ours-real at each N
      run(('synthetic', towers), 'ours N=%d synthetic%s' % (towers, tag),
          ours_config(args, towers, 'synthetic'))
      if not args.skip_peer:
        run(('peer', towers), 'peer N=%d synthetic%s' % (towers, tag),
            dict(kind='peer', towers=towers, **common))
      run(('real', towers), 'ours N=%d real%s' % (towers, tag),
          ours_config(args, towers, 'real', data_dir))

  matmul_gflops = statistics.median(r['gflops'] for r in runs['matmul'])
  pipeline = rate_stats(runs['pipeline'])
  rows = {}
  for towers in towers_list:
    real = rate_stats(runs[('real', towers)])
    synthetic = rate_stats(runs[('synthetic', towers)])
    peer = rate_stats(runs[('peer', towers)]) if not args.skip_peer else None
    achieved = synthetic['examples_per_sec'] * flops['total'] / 1e9
    rows[str(towers)] = dict(
        global_batch=towers * args.batch_size, real=real, synthetic=synthetic, peer=peer,
        real_over_synthetic=_ratio(real, synthetic), ours_over_peer=_ratio(synthetic, peer),
        achieved_gflops=achieved, fraction_of_matmul=achieved / matmul_gflops,
        real_achieved_gflops=real['examples_per_sec'] * flops['total'] / 1e9,
        pipeline_over_synthetic=_ratio(pipeline, synthetic))

  print()
  print('FLOPs per example: %.1f M = forward %.2f M + weight gradients %.2f M + input '
        'gradients %.2f M (%s)' % (
            flops['total'] / 1e6, flops['forward'] / 1e6, flops['backward_weights'] / 1e6,
            flops['backward_inputs'] / 1e6,
            ', '.join('%s %.2f' % (l['name'], 2 * l['macs'] / 1e6) for l in layers)))
  print('float32 matmul %dx%d: %.1f GFLOP/s (median of %d, all cores); input pipeline '
        'alone: %s images/sec' % (args.matmul_size, args.matmul_size, matmul_gflops,
                                  MATMUL_RUNS, _rate(pipeline, 1).strip()))
  print('examples/sec: median of %d timed steps after %d warm-up [slowest-fastest step]%s; '
        'batch %d per tower; threads intra %d inter %d' % (
            args.steps, args.warmup, ', median of %d repeats' % args.repeats
            if args.repeats > 1 else '', args.batch_size, args.intra_op_threads,
            args.inter_op_threads))
  print()
  print('towers  global   %-20s  %-20s  real/syn  %-20s  ours/peer  GFLOP/s  of mm  '
        'peak MB real/syn/peer' % ('real ex/s', 'synthetic ex/s', 'peer (Keras) ex/s'))
  for towers in towers_list:
    row = rows[str(towers)]
    print('%6d  %6d  %s  %s  %8s  %s  %9s  %7.1f  %4.0f%%  %s' % (
        towers, row['global_batch'], _rate(row['real']), _rate(row['synthetic']),
        _fmt(row['real_over_synthetic'], '%.2f'), _rate(row['peer']),
        _fmt(row['ours_over_peer'], '%.2f'), row['achieved_gflops'],
        100 * row['fraction_of_matmul'],
        '/'.join('%.0f' % row[k]['peak_mb'] if row[k] else '-'
                 for k in ('real', 'synthetic', 'peer'))))
  return dict(flops_per_example=dict(flops, layers=layers),
              matmul=dict(size=args.matmul_size, gflops=matmul_gflops,
                          per_repeat=[r['gflops'] for r in runs['matmul']]),
              pipeline=pipeline, towers=rows, runs=_flatten(runs))


def run_extras(args):
  """What the trainer does per step beyond the update, at each tower count.

  Per N, synthetic input: an 'extras' process timing, step by step in one session
  of a graph with summaries, the update alone (no moving averages), the train op
  (update + moving averages) and the train op with the summary op fetched and
  written; and an 'ours' process with a summaries=False graph, whose train op
  should match the first process's. Summaries cost, per step, (summary step -
  train op step) / SUMMARY_STEPS, as the trainer fetches them that often.
  """
  samples = min(SUMMARY_SAMPLES, args.steps)
  runner = Runner(args.repeats * len(args.towers) * 2)
  runs = {}
  for repeat in range(args.repeats):
    tag = ' (repeat %d/%d)' % (repeat + 1, args.repeats) if args.repeats > 1 else ''
    for towers in args.towers:
      runs.setdefault(('extras', towers), []).append(runner.run(
          'ours N=%d update only / + moving averages / + summaries%s' % (towers, tag),
          dict(ours_config(args, towers, 'synthetic'), kind='extras',
               summary_samples=samples)))
      runs.setdefault(('no_summaries', towers), []).append(runner.run(
          'ours N=%d summaries=False graph%s' % (towers, tag),
          ours_config(args, towers, 'synthetic')))

  # The trainer's constant, read by the workers: the parent does not import TensorFlow.
  summary_steps = runs[('extras', args.towers[0])][0]['summary_steps']
  rows = {}
  print()
  print('Per-step extras of the trainer: synthetic input, batch %d per tower, examples/sec '
        '[slowest-fastest step]; summaries once per %d steps' % (args.batch_size,
                                                                 summary_steps))
  print('towers  %-20s  %-20s  %-20s  summary step s  EMA cost  summary cost  both   '
        '%-20s' % ('update only', '+ moving averages', '+ summaries (amort.)',
                   'summaries=False graph'))
  for towers in args.towers:
    extras = runs[('extras', towers)]
    stats = {kind: rate_stats([dict(r, durations=r['durations'][kind]) for r in extras])
             for kind in ('update_only', 'train_op', 'summary')}
    plain_sec = extras[0]['examples_per_step'] / stats['train_op']['examples_per_sec']
    summary_sec = extras[0]['examples_per_step'] / stats['summary']['examples_per_sec']
    amortized_sec = plain_sec + (summary_sec - plain_sec) / summary_steps
    amortized = dict(examples_per_sec=extras[0]['examples_per_step'] / amortized_sec,
                     min=float('nan'), max=float('nan'))
    no_summaries = rate_stats(runs[('no_summaries', towers)])
    row = dict(update_only=stats['update_only'], moving_averages=stats['train_op'],
               summary_step=dict(stats['summary'], step_sec=summary_sec),
               trainer_amortized=amortized, summaries_false_graph=no_summaries,
               ema_slowdown=_ratio(stats['update_only'], stats['train_op']),
               summary_slowdown=amortized_sec / plain_sec,
               total_slowdown=_ratio(stats['update_only'], amortized))
    rows[str(towers)] = row
    print('%6d  %s  %s  %7.0f%13s  %14.3f  %7.3fx  %11.3fx  %5.3fx  %s' % (
        towers, _rate(stats['update_only']), _rate(stats['train_op']),
        amortized['examples_per_sec'], '', summary_sec, row['ema_slowdown'],
        row['summary_slowdown'], row['total_slowdown'], _rate(no_summaries)))
  print('(cost: examples/sec without the extra / with it. Steps of each kind alternate in '
        'one session; the last column is a separate process, for comparison with '
        '"+ moving averages")')
  return dict(summary_steps=summary_steps, summary_samples=samples, towers=rows,
              runs=_flatten(runs))


def run_knobs(args, data_dir):
  """Session and input knobs at KNOB_TOWERS towers, each against the first row.

  threads      intra_op / inter_op pool sizes of session_config (0: one per core)
  XLA          auto-clustering: global_jit_level ON_1, plus TF_XLA_FLAGS=
               --tf_xla_cpu_global_jit, without which CPU ops are never clustered;
               xla_ops_run counts compiled clusters that ran in one traced step
  prefetch     real input with dataset.prefetch(towers) on top of the pipeline's
               own AUTOTUNE prefetch: a whole step's batches ready ahead
  --seed       real input through the trainer's seeded pipeline (a Python
               generator picking records and draws, one global batch a step),
               against the unseeded one
  """
  knobs = [('threads 0/0 (one per core)', dict(intra=0, inter=0), None),
           ('threads 1/2', dict(intra=1, inter=2), None),
           ('threads 2/2', dict(intra=2, inter=2), None),
           ('XLA auto-clustering ON_1', dict(intra=0, inter=0, xla=True),
            dict(TF_XLA_FLAGS=(os.environ.get('TF_XLA_FLAGS', '') +
                               ' --tf_xla_cpu_global_jit').strip())),
           ('real input', dict(intra=0, inter=0, input='real'), None),
           ('real input + prefetch(%d)' % KNOB_TOWERS,
            dict(intra=0, inter=0, input='real', extra_prefetch=KNOB_TOWERS), None),
           ('real input, --seed=1', dict(intra=0, inter=0, input='real', seed=1), None)]
  runner = Runner(args.repeats * len(knobs))
  runs = {}
  for repeat in range(args.repeats):
    tag = ' (repeat %d/%d)' % (repeat + 1, args.repeats) if args.repeats > 1 else ''
    for name, overrides, env in knobs:
      config = ours_config(args, KNOB_TOWERS, 'synthetic', data_dir, **overrides)
      runs.setdefault(name, []).append(
          runner.run('ours N=%d %s%s' % (KNOB_TOWERS, name, tag), config, env))

  baseline = rate_stats(runs[knobs[0][0]])
  rows = {}
  print()
  print('Knobs at %d towers, batch %d per tower, synthetic input unless said; '
        'threads are intra/inter' % (KNOB_TOWERS, args.batch_size))
  print('%-28s  %-20s  vs first  peak MB  note' % ('knob', 'ex/s'))
  for name, _, _ in knobs:
    stats = rate_stats(runs[name])
    note = ''
    if 'xla_ops_run' in runs[name][0]:
      stats['xla_ops_run'] = runs[name][0]['xla_ops_run']
      note = '%d XLA clusters ran' % stats['xla_ops_run']
    rows[name] = dict(stats, vs_first=_ratio(stats, baseline))
    print('%-28s  %s  %7.3f  %7.0f  %s' % (name, _rate(stats), rows[name]['vs_first'],
                                           stats['peak_mb'], note))
  seeded = _ratio(rows['real input, --seed=1'], rows['real input'])
  print('seeded / unseeded real input: %.3f (target >= 0.95)' % seeded)
  return dict(towers=KNOB_TOWERS, knobs=rows, seeded_over_unseeded=seeded,
              runs=_flatten(runs))


def _flatten(runs):
  """Every worker's raw result (config, step times, memory) as a list, for the JSON."""
  return [result for key in runs for result in runs[key]]


def parse_args(argv):
  # argparse, not absl: importing multi_gpu_train defines --batch_size and the
  # thread flags in absl's global FLAGS already.
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], allow_abbrev=False)
  parser.add_argument('--towers', default=TOWERS, help='tower counts, comma separated')
  parser.add_argument('--steps', type=int, default=TIMED_STEPS, help='timed steps per run')
  parser.add_argument('--warmup', type=int, default=WARMUP_STEPS,
                      help='untimed steps before them')
  parser.add_argument('--batch_size', type=int, default=BATCH_SIZE, help='images per tower')
  parser.add_argument('--intra_op_threads', type=int, default=0, help='0: one per core')
  parser.add_argument('--inter_op_threads', type=int, default=0, help='0: one per core')
  parser.add_argument('--repeats', type=int, default=REPEATS,
                      help='runs of the interleaved sequence; medians across')
  parser.add_argument('--records_per_file', type=int, default=RECORDS_PER_FILE,
                      help='generated records per .bin file for the real-input runs')
  parser.add_argument('--data_dir', default=None,
                      help='use this directory\'s cifar-10-batches-bin/ instead of '
                      'generated files')
  parser.add_argument('--matmul_size', type=int, default=MATMUL_SIZE, help='n of n x n')
  parser.add_argument('--skip_peer', action='store_true', help='no Keras peer runs')
  parser.add_argument('--extras', action='store_true',
                      help='instead of the table: cost of moving averages and summaries')
  parser.add_argument('--knobs', action='store_true',
                      help='instead of the table: threads, XLA and prefetch at %d towers'
                      % KNOB_TOWERS)
  parser.add_argument('--quick', action='store_true', help='tiny smoke run: %s' % QUICK)
  parser.add_argument('--json', default=None,
                      help='where the numbers go; default benchmarks/results/<mode>.json')
  parser.add_argument('--worker', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    parser.set_defaults(**QUICK)  # explicit flags still win on the second parse
    args = parser.parse_args(argv)
  if args.worker:
    return args

  try:
    args.towers = [int(t) for t in args.towers.split(',')]
  except ValueError:
    parser.error('--towers must be comma-separated integers, got %r' % args.towers)
  for name in ('steps', 'batch_size', 'repeats', 'records_per_file', 'matmul_size'):
    if getattr(args, name) < 1:
      parser.error('--%s must be at least 1, got %d' % (name, getattr(args, name)))
  for name in ('warmup', 'intra_op_threads', 'inter_op_threads'):
    if getattr(args, name) < 0:
      parser.error('--%s must be 0 or more, got %d' % (name, getattr(args, name)))
  if min(args.towers) < 1:
    parser.error('--towers must all be at least 1, got %s' % args.towers)
  if args.data_dir and not os.path.isdir(os.path.join(args.data_dir, BATCHES_DIR)):
    parser.error('--data_dir %s has no %s/ directory; pass the directory that holds it'
                 % (args.data_dir, BATCHES_DIR))
  return args


def write_sample(data_dir, records_per_file):
  """The product's sample writer (cifar10_input.py --write_sample); returns the md5."""
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'cifar10_input.py'),
                         '--write_sample=' + data_dir,
                         '--records_per_file=%d' % records_per_file],
                        capture_output=True, text=True, check=True)
  return re.search(r'archive md5 (\w+)', done.stdout).group(1)


def main(argv):
  args = parse_args(argv)
  if args.worker:
    config = json.loads(args.worker)
    result = WORKERS[config['kind']](config)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return

  modes = [m for m in ('extras', 'knobs') if getattr(args, m)] or ['table']
  json_path = args.json or os.path.join(RESULTS_DIR, '%s.json' % (
      'benchmark' if modes == ['table'] else '_'.join(modes)))
  load = os.getloadavg()[0]
  print('CIFAR-10 trainer benchmark: %s; %d CPU cores, load average %.2f at start%s' % (
      ', '.join(modes), os.cpu_count(), load,
      ' (busy: other work skews these numbers)' if load > 0.5 else ''), flush=True)
  output = dict(args={k: v for k, v in vars(args).items() if k != 'worker'},
                cpu_count=os.cpu_count(), load_average_at_start=load)
  with tempfile.TemporaryDirectory(prefix='cifar10_benchmark_') as tmp_dir:
    data_dir = args.data_dir
    if not data_dir and ('table' in modes or 'knobs' in modes):
      data_dir = tmp_dir
      write_sample(data_dir, args.records_per_file)
      print('real input: generated %d records per file in %s (removed at the end)'
            % (args.records_per_file, data_dir), flush=True)
    try:
      if 'table' in modes:
        output['table'] = run_table(args, data_dir)
      if 'extras' in modes:
        output['extras'] = run_extras(args)
      if 'knobs' in modes:
        output['knobs'] = run_knobs(args, data_dir)
    except BenchmarkError as e:
      sys.exit('error: %s' % e)
  output['load_average_at_end'] = os.getloadavg()[0]
  os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
  with open(json_path, 'w') as f:
    json.dump(output, f, indent=1)
  print('\nwrote %s' % json_path)


if __name__ == '__main__':
  main(sys.argv[1:])
