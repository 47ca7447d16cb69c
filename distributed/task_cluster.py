"""Which cluster this task is in, and which task it is: from the flags, TF_CONFIG,
Slurm or a JobSet (--cluster), checked before anything is served.
"""
import os
import sys

from absl import flags
import tensorflow as tf

from distributed import (cluster_env, cluster_jobset, cluster_slurm, cluster_tf_config,
                         local_cluster)
from training import errors

SLURM_FLAGS = ['num_ps', 'slurm_port_base']  # mean something with --cluster=slurm only


def define_flags():
  """The flags that say which cluster this task is in and which task it is."""
  flags.DEFINE_enum('job_name', None, ['ps', 'worker'], 'This task\'s job.')
  flags.DEFINE_integer('task_index', 0, 'This task\'s index in its job; worker 0 is the chief.')
  flags.DEFINE_string('ps_hosts', '', 'Comma-separated host:port of the ps tasks.')
  flags.DEFINE_string('worker_hosts', '', 'Comma-separated host:port of the workers.')
  flags.DEFINE_boolean('allow_nonloopback_hosts', False, 'Accept hosts other than loopback '
                       '(127.0.0.1, localhost). The servers have no authentication: use only '
                       'on a network where everyone who can reach the ports is trusted.')
  flags.DEFINE_string('local_cluster', '', 'P,W: start P ps tasks and W workers on 127.0.0.1 '
                      'with free ports, print their logs, and stop them all at the end.')
  flags.DEFINE_enum('cluster', '', ['', 'tf_config', 'slurm', 'jobset'], 'Where the cluster '
                    'and this task come from: tf_config (Kubeflow TFJob), slurm (srun), jobset '
                    '(Kubernetes JobSet), or \'\': the flags above when --job_name is given, '
                    'else TF_CONFIG when set.')
  flags.DEFINE_integer('num_ps', 1, '--cluster=slurm: the first this many tasks of the srun '
                       'step are ps tasks, the rest workers.')
  flags.DEFINE_integer('slurm_port_base', cluster_slurm.SLURM_PORT_BASE, '--cluster=slurm: '
                       'each task listens on this port + its index among its node\'s tasks.')


def check_flags(flag_values):
  """errors.TrainingError, naming the flag, for a --cluster=slurm flag given without it or
  a port out of range."""
  for name in SLURM_FLAGS:
    if flag_values[name].present and flag_values.cluster != 'slurm':
      raise errors.TrainingError('--%s is for --cluster=slurm; flags and TF_CONFIG name the '
                                 'ps tasks themselves' % name)
  if not 0 < flag_values.slurm_port_base < 65536:
    raise errors.TrainingError('--slurm_port_base must be a port 1..65535, got %d'
                               % flag_values.slurm_port_base)


def cluster_from_flags(flag_values, slurm_cluster=None):
  """This task's cluster_env.Cluster: from the flags, TF_CONFIG, Slurm or a JobSet
  (--cluster).

  --cluster='' takes the flags when --job_name is given, else TF_CONFIG when it is
  set. Hosts that a cluster manager named are taken without --allow_nonloopback_hosts
  (it chose them); flags given alongside must agree with it. A cluster that cannot
  run, one whose ps tasks do not fit the mode (--all_reduce: none), or a
  --replicas_to_aggregate above its workers: errors.TrainingError, before it is said.

  Args:
    slurm_cluster: --cluster=slurm: slurm_cluster_first()'s Cluster or ClusterError.
  """
  source = flag_values.cluster or ('tf_config' if flag_values.job_name is None and
                             os.environ.get('TF_CONFIG', '').strip() else '')
  if not source:
    return refuse_misfits(flag_values, cluster_of_host_flags(flag_values))
  try:
    if source == 'slurm':
      cluster = slurm_cluster or cluster_slurm.from_slurm(flag_values.num_ps,
                                                          flag_values.slurm_port_base)
      if isinstance(cluster, errors.ClusterError):
        raise cluster
    elif source == 'jobset':
      cluster = cluster_jobset.from_jobset()
    else:
      cluster = cluster_tf_config.from_tf_config()
      if cluster is None:
        raise errors.ClusterError(
            'TF_CONFIG is not set, and --cluster=tf_config reads the cluster from it; set '
            'it (Kubeflow\'s TFJob does) or give --job_name, --ps_hosts and --worker_hosts')
    cluster_env.check_agrees(cluster, **{
        name: flag_values[name].value for name in ('job_name', 'task_index', 'ps_hosts',
                                             'worker_hosts') if flag_values[name].present})
  except errors.ClusterError as e:
    raise errors.TrainingError(str(e)) from None
  refuse_misfits(flag_values, cluster)
  print(cluster.description)
  if cluster.job_name != 'evaluator':  # it serves nothing
    print(cluster_env.exposure_warning(cluster))
  sys.stdout.flush()
  return cluster


def refuse_misfits(flag_values, cluster):
  """cluster, unless its ps tasks do not fit the mode (an evaluator trains in none), or
  --replicas_to_aggregate asks for more gradients than it has workers."""
  for misfit in (cluster.job_name != 'evaluator' and
                 cluster_env.mode_misfit(len(cluster.ps_hosts), flag_values.all_reduce),
                 cluster_env.too_many_replicas(flag_values.replicas_to_aggregate,
                                               len(cluster.worker_hosts))):
    if misfit:
      raise errors.TrainingError(misfit)
  return cluster


def cluster_of_host_flags(flag_values):
  """The cluster --ps_hosts and --worker_hosts name, once this task is checked in it."""
  if flag_values.job_name is None:
    raise errors.TrainingError('give --job_name=ps or --job_name=worker with --task_index, '
                               '--ps_hosts and --worker_hosts, or --local_cluster=P,W for '
                               'one machine')
  try:
    cluster = cluster_env.from_flags(
        flag_values.job_name, flag_values.task_index, flag_values.ps_hosts,
        flag_values.worker_hosts, flag_values.allow_nonloopback_hosts)
  except errors.ClusterError as e:
    raise errors.TrainingError(str(e)) from None
  if local_cluster.DIE_WITH_LAUNCHER_ENV not in os.environ:  # else the launcher said it
    print(cluster_env.exposure_warning(cluster), flush=True)
  return cluster


def start_server(spec, job_name, task_index, who, config=None):
  """This task's tf.compat.v1.train.Server, or errors.TrainingError naming its port."""
  try:
    return tf.compat.v1.train.Server(spec, job_name=job_name, task_index=task_index,
                                     config=config)
  except tf.errors.OpError as e:
    raise errors.TrainingError('%s cannot listen on %s: %s. Is the port in use?'
                               % (who, spec.task_address(job_name, task_index),
                                  str(e).splitlines()[0])) from e


def slurm_cluster_first(argv, flag_values):
  """--cluster=slurm: the cluster, found before TensorFlow first looks for GPUs.

  SlurmClusterResolver sets this task's CUDA_VISIBLE_DEVICES, which CUDA reads
  once, when TensorFlow first touches a GPU: machine.list_gpus() and absl's
  app.run both do. So the flags are parsed here for this alone, then forgotten;
  app.run parses them again and refuses what is wrong.

  Returns:
    a cluster_env.Cluster, the ClusterError to report once the flags are checked,
    or None (not --cluster=slurm, or flags app.run will refuse).
  """
  try:
    flag_values(argv, known_only=True)
  except flags.Error:
    return None
  try:
    if flag_values.cluster != 'slurm':
      return None
    return cluster_slurm.from_slurm(flag_values.num_ps, flag_values.slurm_port_base)
  except errors.ClusterError as e:
    return e
  finally:
    flag_values.unparse_flags()
