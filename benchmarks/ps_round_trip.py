"""What one async dist_train.py step spends talking to the ps, without the model's compute.

    python benchmarks/ps_round_trip.py             # one ps task and this worker on 127.0.0.1
    python benchmarks/ps_round_trip.py --rounds 3  # a quick look

Starts one ps task (a tf.distribute.Server in a subprocess) and, in this process,
a worker of the same cluster that places the CIFAR-10 model's variables on the ps
with replica_device_setter, as dist_train.py does. Then times, median of --rounds (ROUNDS):
  read      every trainable variable fetched to the worker (the reads a step makes)
  send      a worker-made gradient of every variable applied on the ps with SGD
  both      the two in one sess.run, as a step does
  step      a plain SGD step of the model on a fixed batch of STEP_BATCH images:
            compute on the worker, variables on the ps (no global step, no
            moving averages, no hooks: what dist_train.py's worker adds to it)
  local     the same with the variables on this worker, no ps
both - local is what moving the variables costs each step, step - local what the
plainest distributed step costs; benchmark.py's dist rows give dist_train.py's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402  after the path

import cifar10  # noqa: E402
from distributed import local_cluster  # noqa: E402

ROUNDS = 30                       # timed sess.runs per kind, after WARMUP
STEP_BATCH = 128                  # images of the step kind: one tower at the trainer's default
WARMUP = 5
PS_CODE = ('import sys, tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec('
           '{"ps": [sys.argv[1]], "worker": [sys.argv[2]]}), "ps", 0).join()')


def build(device_setter):
  """The model's variables, a read of each to the worker, an SGD send of a gradient each,
  and a plain SGD step of the model: the kinds to time."""
  rng = np.random.default_rng(0)
  with tf.compat.v1.device(device_setter):  # variables on the ps, the rest on the worker
    images = tf.constant(rng.standard_normal((STEP_BATCH, 24, 24, 3), np.float32))
    labels = tf.constant(rng.integers(0, 10, STEP_BATCH, np.int32))
    total_loss = cifar10.loss(cifar10.inference(images), labels)
    variables = tf.compat.v1.trainable_variables()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(1e-3)
    step = optimizer.minimize(total_loss)
  with tf.compat.v1.device('/job:worker/task:0' if device_setter else None):
    reads = [tf.identity(v) * 1.0 for v in variables]
    grads = [tf.ones(v.shape) * 1e-9 for v in variables]
  send = optimizer.apply_gradients(zip(grads, variables))
  reads = tf.group(*reads)
  return variables, dict(read=reads, send=send, both=tf.group(reads, send), step=step)


def time_kinds(sess, ops, rounds):
  times = {kind: [] for kind in ops}
  for i in range(WARMUP + rounds):
    for kind, op in ops.items():
      start = time.perf_counter()
      sess.run(op)
      if i >= WARMUP:
        times[kind].append(time.perf_counter() - start)
  return {kind: 1000 * statistics.median(t) for kind, t in times.items()}


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=ROUNDS, help='timed runs per kind')
  rounds = parser.parse_args(argv).rounds
  if rounds < 1:
    parser.error('--rounds must be at least 1, got %d' % rounds)
  tf.compat.v1.disable_eager_execution()
  ps_port, worker_port = local_cluster.free_ports(2)
  ps, worker = '127.0.0.1:%d' % ps_port, '127.0.0.1:%d' % worker_port
  ps_task = subprocess.Popen([sys.executable, '-c', PS_CODE, ps, worker])
  try:
    cluster = tf.train.ClusterSpec({'ps': [ps], 'worker': [worker]})
    server = tf.distribute.Server(cluster, 'worker', 0)
    with tf.Graph().as_default():
      variables, ops = build(tf.compat.v1.train.replica_device_setter(cluster=cluster))
      with tf.compat.v1.Session(server.target) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        remote = time_kinds(sess, ops, rounds)
    with tf.Graph().as_default():
      _, ops = build(None)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        local = time_kinds(sess, ops, rounds)
  finally:
    ps_task.kill()
  megabytes = sum(v.shape.num_elements() * 4 for v in variables) / 1e6
  print('%d variables, %.1f MB; ms per sess.run, median of %d' % (len(variables), megabytes,
                                                                  rounds))
  print('%-6s %10s %10s' % ('', 'via ps', 'local'))
  for kind in ('read', 'send', 'both', 'step'):
    print('%-6s %10.2f %10.2f' % (kind, remote[kind], local[kind]))
  print('the ps costs %.1f ms per step (both, via ps - local); a plain SGD step of %d images '
        '%.1f ms more (step, via ps - local)' % (remote['both'] - local['both'], STEP_BATCH,
                                                remote['step'] - local['step']))


if __name__ == '__main__':
  main(sys.argv[1:])
