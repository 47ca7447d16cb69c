"""dist_train.py's clusters: quick flags, the --local_cluster launcher, and what
orchestrators and machines tell a task (TF_CONFIG, a fake nvidia-smi)."""
import json
import os
import signal
import stat

from helpers.lines import DONE_LINE, WORKER_LOSS_LINE, by_task, matches
from helpers.processes import signal_caught, wait_until


# ---- dist_train.py's tests: their flags, its --local_cluster launcher --------------------

# Tiny and quick: 8 images a step, a loss line per step.
QUICK_FLAGS = ['--batch_size=8', '--log_frequency=1', '--startup_timeout_secs=60',
               '--step_timeout_secs=60']
# For runs of many async steps whose model does not matter: CIFAR-10 at its learning
# rate of 0.1 on one synthetic batch of 8, two async workers applying the same
# gradient, diverged (loss nan) in 2 of 33 runs of 200 steps, from step 62 on; the
# book's MNIST network at 0.001 settles at once (1 ms a step).
STEADY_FLAGS = ['--dataset=mnist', '--synthetic']


def local_cluster_task(start, num_ps, num_workers, train_dir, *flags, env=None):
  """Starts dist_train.py --local_cluster=P,W with QUICK_FLAGS; returns its Task."""
  return start(['dist_train.py', '--local_cluster=%d,%d' % (num_ps, num_workers),
                '--train_dir=%s' % train_dir] + QUICK_FLAGS + list(flags), env)


def job_commands(num_ps, num_workers, flags):
  """{'ps0': argv, ..., 'worker0': argv, ...} of a hand-started job on free ports of
  127.0.0.1 (a Kubernetes job's pods, each told the whole cluster), ps tasks first."""
  from distributed import local_cluster  # imports TensorFlow: only when a test asks
  ports = local_cluster.free_ports(num_ps + num_workers)
  hosts = {'ps': ['127.0.0.1:%d' % p for p in ports[:num_ps]],
           'worker': ['127.0.0.1:%d' % p for p in ports[num_ps:]]}
  return {'%s%d' % (job, i): local_cluster.task_command(job, i, hosts['ps'], hosts['worker'],
                                                        list(flags))
          for job in ('ps', 'worker') for i in range(len(hosts[job]))}


def run_job(start, num_ps, num_workers, train_dir, *flags):
  """dist_train.py's tasks started by hand with QUICK_FLAGS, each run to its end, which
  must be exit 0; returns {task: [its lines]}. For a test that needs a cluster, not the
  launcher (tests/test_local_cluster.py tests that): its tasks are forked, not fresh."""
  job = {name: start(argv) for name, argv in job_commands(
      num_ps, num_workers, ['--train_dir=%s' % train_dir] + QUICK_FLAGS + list(flags)).items()}
  for task in job.values():
    assert task.finish() == 0, task.log()
  return {name: task.lines for name, task in job.items()}


def run_local_cluster(start, num_ps, num_workers, train_dir, *flags):
  """Runs dist_train.py --local_cluster to the end; returns {task: [its lines]}."""
  launcher = local_cluster_task(start, num_ps, num_workers, train_dir, *flags)
  assert launcher.finish() == 0, launcher.log()
  return by_task(launcher.lines)


# ---- Clusters, as the orchestrators describe them ----------------------------------------

def tf_config(cluster, task_type, index):
  """TF_CONFIG's text, as Kubeflow's TFJob sets it for one task."""
  return json.dumps({'cluster': cluster, 'task': {'type': task_type, 'index': index}})


def fake_nvidia_smi(bin_dir, num_gpus):
  """Writes an `nvidia-smi` into bin_dir that lists num_gpus GPUs, as --list-gpus does."""
  os.makedirs(str(bin_dir), exist_ok=True)
  path = os.path.join(str(bin_dir), 'nvidia-smi')
  with open(path, 'w') as f:
    f.write('#!/bin/sh\n' + ''.join('echo "GPU %d: Tesla T4 (UUID: GPU-%d)"\n' % (i, i)
                                    for i in range(num_gpus)))
  os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
  return path


# ---- A hand-started job stopped and restarted, and what its ps task holds ---------------

def step_at_least(step):
  """A wait_for condition: a loss line at global step `step` or later."""
  def condition(line):
    found = WORKER_LOSS_LINE.match(line)
    return found and int(found.group(1)) >= step and int(found.group(1))
  return condition


PREEMPT_STEPS = 60


def preempt_cluster(start, train_dir, *flags):
  """(start(job_name, task_index) -> Task, the ps host) of one cluster, 1 ps + 2 workers.

  Their waits are far above the test's: a worker waits for a stopped chief to come
  back (sync: for its token) up to --step_timeout_secs.
  """
  from distributed import local_cluster  # imports TensorFlow: only when a test asks
  ps_port, *worker_ports = local_cluster.free_ports(3)
  ps_hosts, worker_hosts = ['127.0.0.1:%d' % ps_port], ['127.0.0.1:%d' % p for p in worker_ports]
  task_flags = QUICK_FLAGS + STEADY_FLAGS + [
      '--train_dir=%s' % train_dir, '--summary_steps=0', '--max_steps=%d' % PREEMPT_STEPS,
      '--save_every_n_steps=10', '--startup_timeout_secs=600', '--step_timeout_secs=600',
      *flags]
  return (lambda job_name, task_index: start(local_cluster.task_command(
      job_name, task_index, ps_hosts, worker_hosts, task_flags))), ps_hosts[0]


def chief_stopped_at_its_first_step(start, signum):
  """Starts the chief, signals it, then starts the ps: the chief stops before any step.

  Held without a sleep: the signal goes once the chief's own handlers are in place,
  and it cannot train before the ps task answers, which it starts only then. It
  opens its session (its variables initialised, checkpoint 0 saved), takes no step,
  and exits. Returns (chief, ps).
  """
  chief = start('worker', 0)
  wait_until(lambda: signal_caught(chief.pid, signal.SIGTERM),
                     'the chief\'s stop handlers', task=chief)
  chief.send(signum)
  return chief, start('ps', 0)


def assert_done_at_max_steps(task):
  [done] = matches(DONE_LINE, task.lines)
  assert int(done.group(3)) == PREEMPT_STEPS, task.log()
  assert 'Traceback' not in task.text, task.log()


def run_on_ps(ps_host, build, timeout_secs=60):
  """Runs what build() returns, built on ps task 0 in a graph of its own, in a session
  of the ps task alone (one that also saw the workers would wait for the chief); the
  job's queues and variables there are found by their shared names."""
  import tensorflow as tf  # only when a test asks
  with tf.Graph().as_default() as graph:
    with tf.device('/job:ps/task:0'):
      fetches = build()
  config = tf.compat.v1.ConfigProto(device_filters=['/job:ps/task:0'])
  with tf.compat.v1.Session('grpc://' + ps_host, graph=graph, config=config) as sess:
    return sess.run(fetches, options=tf.compat.v1.RunOptions(timeout_in_ms=timeout_secs * 1000))


def sync_ps_state(ps_host, num_workers):
  """(global step, each worker's gradients_at) read from the ps task: the local step each
  worker's latest gradient was computed at (worker_updates.SyncReplicas)."""
  import tensorflow as tf

  def build():
    global_step = tf.compat.v1.Variable(0, dtype=tf.int64, name='global_step')
    gradients_at = tf.compat.v1.Variable(tf.zeros([num_workers], tf.int64),
                                         name='sync_gradients_at')
    return [global_step.read_value(), gradients_at.read_value()]
  return run_on_ps(ps_host, build, timeout_secs=10)
