"""dist_train.py's clusters: quick flags, the --local_cluster launcher, and what
orchestrators and machines tell a task (TF_CONFIG, a fake nvidia-smi)."""
import json
import os
import stat

from helpers.lines import by_task


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
