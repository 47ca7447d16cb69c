"""deploy/: the manifests and the Slurm script name only flags the programs take, the
JobSet manifest gives each pod the variables cluster_jobset.from_jobset reads, and the
built-in kinds are valid by Kubernetes' own schemas.

The manifests are read with PyYAML (tests/helpers/manifests.py). kubernetes-validate
carries Kubernetes' published JSON schemas, offline, for the built-in kinds: the
PersistentVolumeClaim, the NetworkPolicy, each JobSet replicatedJob's Job and each TFJob
replica's pod template. TFJob and JobSet themselves are CRDs, whose schemas it does not
carry: their fields are checked by the tests below, not by a schema.
"""
import os
import re

import kubernetes_validate
import pytest

from distributed import cluster_env, cluster_jobset, cluster_tf_config
import helpers
from helpers import manifests
from helpers.manifests import JOBSET, TFJOB, pod_environment

ROOT = helpers.ROOT
SBATCH = os.path.join(ROOT, 'deploy', 'slurm', 'train.sbatch')
DOCKERFILE = os.path.join(ROOT, 'deploy', 'kubernetes', 'Dockerfile')
FLAG = re.compile(r'^--(?:no)?([a-z_0-9]+)(?:=|$)')
# Kubernetes 1.28 (the manifests' oldest) is left out: its published schema requires
# onPodConditions in a podFailurePolicy rule on exit codes, which its API server does not.
SCHEMA_VERSIONS = ['1.29.0', kubernetes_validate.latest_version()]


def replica_specs(path=TFJOB):
  """tfjob.yaml's replicas (or another TFJob's): {'PS': {'command': [...],
  'restartPolicy': 'ExitCode', 'container': 'tensorflow'}, ...}"""
  specs = {}
  for rtype, spec in manifests.manifest(path)['TFJob']['spec']['tfReplicaSpecs'].items():
    container, = spec['template']['spec']['containers']
    specs[rtype] = {'command': container['command'], 'restartPolicy': spec['restartPolicy'],
                    'container': container['name']}
  return specs


def jobset_manifest(path=JOBSET):
  """jobset.yaml's documents (or another JobSet's): {kind: the document}."""
  return manifests.manifest(path)


def built_in_objects():
  """(where, object) for every object of a built-in kind in the manifests, those that
  the CRDs hold wrapped in the kind that holds them (a Job, a PodTemplate)."""
  found = []
  for path in (TFJOB, JOBSET, manifests.TFJOB_ALL_REDUCE, manifests.JOBSET_ALL_REDUCE):
    for kind, document in manifests.manifest(path).items():
      where = '%s %s' % (os.path.basename(path), kind)
      if kind == 'TFJob':
        found += [('%s %s' % (where, rtype), {
            'apiVersion': 'v1', 'kind': 'PodTemplate', 'metadata': {'name': rtype.lower()},
            'template': spec['template']})
                  for rtype, spec in document['spec']['tfReplicaSpecs'].items()]
      elif kind == 'JobSet':
        found += [('%s %s' % (where, rjob['name']), {
            'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': {'name': rjob['name']},
            'spec': rjob['template']['spec']})
                  for rjob in document['spec']['replicatedJobs']]
      else:
        found.append((where, document))
  return found


def sbatch_command(text):
  """The srun line's argv, continuation lines joined, from `python` on."""
  joined = re.sub(r'\\\n', ' ', text)
  line = next(l for l in joined.splitlines() if l.strip().startswith('srun '))
  words = line.split()
  return words[words.index('python'):]


def flags_of(argv):
  return [FLAG.match(word).group(1) for word in argv if word.startswith('--')]


def unknown_flags(argv, known_flags):
  """The flags argv names that its program (argv[1]) does not take, in order."""
  return [flag for flag in flags_of(argv) if flag not in known_flags[argv[1]]]


@pytest.fixture
def known_flags(helpshort):
  """{'dist_train.py': the flags it lists, 'cifar10_eval.py': the flags it lists}.

  Each program's own --helpshort (tests/test_first_run.py checks that it lists every
  flag the program accepts and no other), not the flags this process happens to hold;
  read for each test from helpshort's runs, which start each program once a process.
  """
  return {program: helpers.listed_flags(helpshort(program).out)
          for program in ('dist_train.py', 'cifar10_eval.py')}


def test_tfjob_manifest_four_replicas_exit_code_container_tensorflow():
  assert manifests.manifest(TFJOB)['TFJob']['apiVersion'] == 'kubeflow.org/v1'
  specs = replica_specs()
  assert sorted(specs) == ['Chief', 'Evaluator', 'PS', 'Worker']
  for name, spec in specs.items():
    assert spec['restartPolicy'] == 'ExitCode', name
    assert spec['container'] == 'tensorflow', name  # the operator's TF_CONFIG goes there
  # TF_CONFIG gives each its part, the evaluator's included.
  assert [specs[n]['command'][:3] for n in ('PS', 'Chief', 'Worker', 'Evaluator')] == [
      ['python', 'dist_train.py', '--cluster=tf_config']] * 4
  for name in ('Chief', 'Worker', 'Evaluator'):  # the chief writes, the evaluator reads
    assert '--train_dir=/shared/train' in specs[name]['command']
  # The evaluator ends at the chief's last step.
  assert ([c for c in specs['Chief']['command'] if c.startswith('--max_steps=')] ==
          [c for c in specs['Evaluator']['command'] if c.startswith('--max_steps=')])


@pytest.mark.xdist_group('helpshort')
def test_tfjob_manifest_names_only_flags_the_programs_take(known_flags):
  for path in (TFJOB, manifests.TFJOB_ALL_REDUCE):
    for name, spec in replica_specs(path).items():
      assert flags_of(spec['command']), name
      assert unknown_flags(spec['command'], known_flags) == [], name


def test_tfjob_all_reduce_manifest_is_tfjob_without_ps_its_trainers_with_all_reduce():
  ps, all_reduce = replica_specs(), replica_specs(manifests.TFJOB_ALL_REDUCE)
  assert sorted(all_reduce) == ['Chief', 'Evaluator', 'Worker']
  for name, spec in all_reduce.items():
    command = [word for word in spec['command'] if word != '--all_reduce']
    assert dict(spec, command=command) == ps[name], name
    assert ('--all_reduce' in spec['command']) == (name != 'Evaluator'), name
  # Every trainer's TF_CONFIG is a cluster of workers only, which --all_reduce fits.
  tfjob = manifests.manifest(manifests.TFJOB_ALL_REDUCE)['TFJob']
  for rtype in ('Chief', 'Worker'):
    cluster = cluster_tf_config.from_tf_config(
        {'TF_CONFIG': manifests.tf_config(tfjob, rtype, 0)})
    assert cluster.ps_hosts == [] and len(cluster.worker_hosts) == 3
    assert cluster_env.mode_misfit(len(cluster.ps_hosts), all_reduce=True) is None


@pytest.mark.xdist_group('helpshort')
def test_sbatch_script_one_srun_step_names_only_dist_train_flags(known_flags):
  with open(SBATCH) as f:
    text = f.read()
  assert len(re.findall(r'^\s*srun ', text, re.M)) == 1
  argv = sbatch_command(text)
  assert argv[:4] == ['python', 'dist_train.py', '--cluster=slurm', '--num_ps=1']
  assert unknown_flags(argv, known_flags) == []


@pytest.mark.xdist_group('helpshort')
def test_flag_reader_catches_an_unknown_flag(known_flags):
  # The checks above would pass on anything if the reader found no flags.
  argv = sbatch_command('srun --label \\\n  python dist_train.py --num_gpu=4 --train_dir=/x\n')
  assert flags_of(argv) == ['num_gpu', 'train_dir']
  assert 'num_gpu' not in known_flags['dist_train.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']


@pytest.mark.xdist_group('helpshort')
def test_flag_check_refuses_a_flag_only_the_other_program_takes(known_flags):
  # The evaluator's --checkpoint_dir given to dist_train.py, the trainer's --num_gpus
  # given to cifar10_eval.py: each is a real flag, of the wrong program.
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert unknown_flags(['python', 'dist_train.py', '--cluster=tf_config',
                        '--checkpoint_dir=/shared/train'], known_flags) == ['checkpoint_dir']
  assert unknown_flags(['python', 'cifar10_eval.py', '--run_once', '--num_gpus=2'],
                       known_flags) == ['num_gpus']


# ---- JobSet ---------------------------------------------------------------------

def test_jobset_manifest_ps_and_worker_one_indexed_job_each_cluster_jobset():
  manifest = jobset_manifest()
  assert sorted(manifest) == ['JobSet', 'NetworkPolicy', 'PersistentVolumeClaim']
  jobset = manifest['JobSet']
  assert jobset['apiVersion'] == 'jobset.x-k8s.io/v1alpha2'
  assert jobset['spec']['network'] == {'enableDNSHostnames': True}  # subdomain: the name
  rjobs = {rjob['name']: rjob for rjob in jobset['spec']['replicatedJobs']}
  assert list(rjobs) == ['ps', 'worker']
  for name, rjob in rjobs.items():
    job = rjob['template']['spec']
    assert rjob['replicas'] == 1, name
    assert job['completionMode'] == 'Indexed', name
    assert job['parallelism'] == job['completions'] >= 1, name  # every task at once
    assert job['template']['spec']['restartPolicy'] == 'Never', name  # podFailurePolicy's
    assert job['podFailurePolicy']['rules'] == [
        {'action': 'Ignore', 'onPodConditions': [{'type': 'DisruptionTarget',
                                                  'status': 'True'}]},
        {'action': 'FailJob', 'onExitCodes': {'operator': 'In', 'values': [1]}}], name
    container, = job['template']['spec']['containers']
    assert container['command'][:3] == ['python', 'dist_train.py', '--cluster=jobset'], name
  worker = rjobs['worker']['template']['spec']['template']['spec']
  assert '--train_dir=/shared/train' in worker['containers'][0]['command']
  assert worker['containers'][0]['volumeMounts'] == [{'name': 'shared', 'mountPath': '/shared'}]
  assert worker['volumes'][0]['persistentVolumeClaim']['claimName'] == (
      manifest['PersistentVolumeClaim']['metadata']['name'])
  assert rjobs['worker']['dependsOn'] == [{'name': 'ps', 'status': 'Ready'}]


def test_jobset_manifest_every_pods_environment_gives_from_jobset_its_own_task():
  # What each pod would see, fed to the discovery: the manifest and the code agree.
  jobset = jobset_manifest()['JobSet']
  name = jobset['metadata']['name']
  tasks, clusters = [], []
  for rjob in jobset['spec']['replicatedJobs']:
    job = rjob['template']['spec']
    port = job['template']['spec']['containers'][0]['ports'][0]['containerPort']
    for index in range(job['completions']):
      cluster = cluster_jobset.from_jobset(pod_environment(jobset, rjob, 0, index))
      clusters.append(cluster)
      tasks.append((cluster.job_name, cluster.task_index))
      # JobSet's DNS name for it: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>
      own_hosts = cluster.ps_hosts if cluster.job_name == 'ps' else cluster.worker_hosts
      assert own_hosts[cluster.task_index] == '%s-%s-0-%d.%s:%d' % (
          name, rjob['name'], index, name, port)
  num_ps = sum(job == 'ps' for job, _ in tasks)
  assert tasks == [('ps', i) for i in range(num_ps)] + [
      ('worker', i) for i in range(len(tasks) - num_ps)]
  assert num_ps >= 1 and len(tasks) > num_ps
  assert len({(tuple(c.ps_hosts), tuple(c.worker_hosts)) for c in clusters}) == 1
  chief = clusters[num_ps]
  assert chief.description.endswith('this task: worker 0, the chief (pod %s-worker-0-0)' % name)


def test_jobset_manifest_done_with_workers_fails_on_exit_1_grace_for_the_chief():
  spec = jobset_manifest()['JobSet']['spec']
  assert spec['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['worker']}
  assert spec['failurePolicy']['maxRestarts'] >= 1  # other Job failures: RestartJobSet
  assert [(rule['action'], rule['onJobFailureReasons'])
          for rule in spec['failurePolicy']['rules']] == [('FailJobSet', ['PodFailurePolicy'])]
  rjobs = {rjob['name']: rjob for rjob in spec['replicatedJobs']}
  pod = rjobs['worker']['template']['spec']['template']['spec']
  assert pod['terminationGracePeriodSeconds'] > 30  # past Kubernetes' default: the save
  for rjob in rjobs.values():
    resources = rjob['template']['spec']['template']['spec']['containers'][0]['resources']
    assert resources['limits']['memory'] == resources['requests']['memory'], rjob['name']


def test_jobset_manifest_network_policy_admits_only_the_jobsets_pods_on_the_task_port():
  manifest = jobset_manifest()
  policy, jobset = manifest['NetworkPolicy']['spec'], manifest['JobSet']
  own_pods = {'matchLabels': {'jobset.sigs.k8s.io/jobset-name': jobset['metadata']['name']}}
  ports = {container['ports'][0]['containerPort']
           for rjob in jobset['spec']['replicatedJobs']
           for container in rjob['template']['spec']['template']['spec']['containers']}
  assert policy['podSelector'] == own_pods
  assert policy['policyTypes'] == ['Ingress']
  assert policy['ingress'] == [{'from': [{'podSelector': own_pods}],
                                'ports': [{'protocol': 'TCP', 'port': port} for port in ports]}]


@pytest.mark.xdist_group('helpshort')
def test_jobset_manifest_names_only_flags_the_programs_take(known_flags):
  for path in (JOBSET, manifests.JOBSET_ALL_REDUCE):
    for rjob in jobset_manifest(path)['JobSet']['spec']['replicatedJobs']:
      container, = rjob['template']['spec']['template']['spec']['containers']
      assert unknown_flags(container['command'], known_flags) == [], rjob['name']


def test_jobset_all_reduce_manifest_is_jobset_without_ps_every_pod_a_fitting_worker():
  ps, all_reduce = [jobset_manifest(path)['JobSet'] for path in (JOBSET,
                                                                  manifests.JOBSET_ALL_REDUCE)]
  [worker] = all_reduce['spec']['replicatedJobs']
  [ps_worker] = [r for r in ps['spec']['replicatedJobs'] if r['name'] == 'worker']
  container, = worker['template']['spec']['template']['spec']['containers']
  assert '--all_reduce' in container['command'] and 'dependsOn' not in worker
  job = worker['template']['spec']
  assert job == ps_worker['template']['spec'] | {'template': job['template']}  # but the pods
  for index in range(job['completions']):
    cluster = cluster_jobset.from_jobset(pod_environment(all_reduce, worker, 0, index))
    assert (cluster.ps_hosts, cluster.job_name, cluster.task_index) == ([], 'worker', index)
    assert len(cluster.worker_hosts) == job['completions']
    assert cluster_env.mode_misfit(len(cluster.ps_hosts), all_reduce=True) is None


def test_manifests_built_in_kinds_valid_by_kubernetes_schemas():
  objects = built_in_objects()
  assert sorted({obj['kind'] for _, obj in objects}) == [
      'Job', 'NetworkPolicy', 'PersistentVolumeClaim', 'PodTemplate']
  # 2 claims, 2 policies, 4 + 3 TFJob replicas and 2 + 1 replicatedJobs (jobset.yaml's,
  # tfjob.yaml's, and their all-reduce files')
  assert len(objects) == 14
  for version in SCHEMA_VERSIONS:
    for where, obj in objects:
      try:
        kubernetes_validate.validate(obj, version, strict=True)
      except kubernetes_validate.ValidationError as e:
        raise AssertionError('%s, Kubernetes %s: %s at %s' % (
            where, version, e.message, '.'.join(map(str, e.path)))) from None


def test_schema_check_refuses_a_misspelt_field_and_a_wrong_type():
  # The check above would pass on anything if the schemas were empty.
  where, job = next(o for o in built_in_objects() if o[1]['kind'] == 'Job')
  pod = job['spec']['template']['spec']
  pod['terminationGracePeriodSecond'] = 120
  with pytest.raises(kubernetes_validate.ValidationError, match='terminationGracePeriodSecond'):
    kubernetes_validate.validate(job, SCHEMA_VERSIONS[-1], strict=True)
  del pod['terminationGracePeriodSecond']
  job['spec']['completions'] = 'three'
  with pytest.raises(kubernetes_validate.ValidationError, match="'three' is not of type"):
    kubernetes_validate.validate(job, SCHEMA_VERSIONS[-1], strict=True)


def test_dockerfile_python_311_slim_installs_requirements_then_copies_repo():
  with open(DOCKERFILE) as f:
    lines = [l for l in f.read().splitlines() if l and not l.startswith('#')]
  assert lines[:2] == ['ARG BASE=python:3.11-slim', 'FROM ${BASE}']  # the default, for users
  steps = [l.split()[0] + ' ' + l.split()[1] for l in lines]
  assert steps.index('COPY requirements.txt') < steps.index('RUN pip') < steps.index('COPY .')
