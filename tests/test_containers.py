"""deploy/kubernetes's image, built from its Dockerfile and run as the manifests' pods.

deploy/kubernetes/local_docker.sh starts a dockerd of its own once for this module,
and stops it at the end unless it ran before. The image builds on python:3.11-slim
where that dockerd has it, else on make_base_image.sh's stand-in from Debian's
packages; .ci/run makes the base and builds the image before the suite, so that the
`docker build` here is cached. Each pod is a container made from the manifest: its
command (the entrypoint, as Kubernetes' `command` is) with flags appended for a short
run on a sample in /shared/cifar10_data, its environment (the operator's TF_CONFIG; the
JobSet's variables), its memory limit and CPU request, /shared a directory of the test.

The pods get a network of the test's own: a Docker bridge marked internal, with no
address on the host, so they reach each other and nothing else. Every pod listens on
the manifests' port 2222 at its own address, and every pod's name resolves to that
address as the cluster's DNS would resolve it (--add-host: /etc/hosts lines). The TFJob
is stopped as kubelet stops pods: SIGTERM to every container at once, SIGKILL after
each pod's grace period (docker stop -t), then the same containers started again. The
JobSet's pods train to the end, each exiting by itself.

Not here: an apiserver, kubelet, the training operator, the JobSet controller (none
can be installed on this machine). Nothing restarts a pod but the test; the JobSet's
dependsOn, podFailurePolicy and successPolicy are not exercised.
"""
import hashlib
import ipaddress
import os
import re
import shutil
import subprocess
import time

import pytest

import helpers
from helpers import RESUMING_LINE, SAVED_LINE, STOPPED_LINE, manifests, matches

if not (shutil.which('dockerd') and shutil.which('docker')) or os.geteuid() != 0:
  pytest.skip('no container runtime: dockerd and docker, as root '
              '(deploy/kubernetes/local_docker.sh start installs them)', allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.xdist_group('containers')]

SCRIPT = os.path.join(helpers.ROOT, 'deploy', 'kubernetes', 'local_docker.sh')
DOCKERFILE = os.path.join(helpers.ROOT, 'deploy', 'kubernetes', 'Dockerfile')
STATE_DIR = os.environ.get('LOCAL_DOCKER_DIR', '/tmp/local-docker')
BASES = ['python:3.11-slim', 'cifar10-base:bookworm-python3.11']  # the real one first
# Names of this test process's own, so that suites run at once (other clones) keep apart;
# .ci/run's build is tagged cifar10-dist:test.
IMAGE = 'cifar10-dist:test-%s' % hashlib.md5(helpers.ROOT.encode()).hexdigest()[:8]
RUN = str(os.getpid())
LABEL = 'cifar10-test-pod=' + RUN   # on every container this process makes
NETWORK = 'cifar10-test-pods-' + RUN
DEFAULT_GRACE_SECS = 30             # Kubernetes' terminationGracePeriodSeconds
# CIFAR-10 on the sample, 8 images a step: 20 to 40 async steps a second here, so that
# 60 steps once ended before the stop they were to be stopped by.
MAX_STEPS = {'tfjob': 300, 'jobset': 60}
ALL_REDUCE_STEPS = 100  # tfjob-all-reduce.yaml's pods: killed past step 10, then resumed
RUN_FLAGS = ['--batch_size=8', '--log_frequency=1', '--save_every_n_steps=10',
             '--summary_steps=0', '--eval_interval_secs=1']


def docker(env, *args, timeout=120):
  """Runs the docker CLI to the end; returns its helpers.Run."""
  return helpers.run(['docker'] + list(args), env=env, timeout=timeout)


@pytest.fixture(scope='module')
def image():
  """The docker CLI's environment (DOCKER_HOST), with IMAGE built and NETWORK made;
  its containers are the test's own (env)."""
  was_running = helpers.pid_file_alive(os.path.join(STATE_DIR, 'dockerd.pid'))
  started = helpers.run(['bash', SCRIPT, 'start'], timeout=600)
  assert started.code == 0, started.log()
  host = re.search(r'^export DOCKER_HOST=(\S+)$', started.out, re.M).group(1)
  env = helpers.user_env(DOCKER_HOST=host)
  base = next((b for b in BASES if docker(env, 'image', 'inspect', b).code == 0), None)
  if base is None:
    _stop(was_running)
    pytest.skip('no base image: run deploy/kubernetes/make_base_image.sh (.ci/run does)')
  built = docker(env, 'build', '--network=host', '--build-arg', 'BASE=' + base, '-f',
                 DOCKERFILE, '-t', IMAGE, helpers.ROOT, timeout=1800)
  assert built.code == 0, built.log()
  _make_network(env)
  yield env
  docker(env, 'network', 'rm', NETWORK)
  _stop(was_running)


def _make_network(env):
  """NETWORK: internal, and no address on the host, so the pods reach each other and
  nothing else; on a /24 of 172.31/16 no other network of this dockerd has (addresses
  the pods are given need a subnet named here)."""
  for n in range(256):
    made = docker(env, 'network', 'create', '--internal', '--subnet',
                  '172.31.%d.0/24' % ((os.getpid() + n) % 256),
                  '-o', 'com.docker.network.bridge.inhibit_ipv4=true', NETWORK)
    if made.code == 0:
      return
    assert 'overlaps' in made.err, made.log()
  raise AssertionError('no /24 of 172.31.0.0/16 left for %s' % NETWORK)


def _stop(was_running):
  """Stops the dockerd that image() started, not one that ran before."""
  if not was_running:
    stopped = helpers.run(['bash', SCRIPT, 'stop'])
    assert stopped.code == 0, stopped.log()


@pytest.fixture
def env(image):
  """The docker CLI's environment; the test's containers are removed at its end."""
  yield image
  _remove_containers(image)


def _remove_containers(env):
  """Removes this test process's containers."""
  found = docker(env, 'ps', '-aq', '--filter', 'label=' + LABEL)
  if found.out.split():
    removed = docker(env, 'rm', '-f', *found.out.split())
    assert removed.code == 0, removed.log()


class Pod:
  """One pod as a container: made by `create`, started and stopped with its job. Its
  host name is the pod's; its container's name adds this test process's id."""

  def __init__(self, host, spec, env):
    self.name = '%s-%s' % (host.split('.')[0], RUN)
    self.host, self.env = host, env
    self.grace = spec.get('terminationGracePeriodSeconds', DEFAULT_GRACE_SECS)
    self.container, = spec['containers']
    self.ip = None

  def create(self, docker_env, pods, shared, flags):
    limits = self.container.get('resources', {}).get('limits', {})
    requests = self.container.get('resources', {}).get('requests', {})
    command = self.container['command']
    args = ['create', '--name', self.name, '--label', LABEL, '--network', NETWORK,
            '--ip', self.ip, '--hostname', self.host.split('.')[0],
            '-v', '%s:/shared' % shared, '--entrypoint', command[0]]
    args += ['--add-host=%s:%s' % (pod.host, pod.ip) for pod in pods]
    args += ['--env=%s=%s' % item for item in sorted(self.env.items())]
    if 'memory' in limits:  # kubelet's: the limit, and no swap past it
      memory = int(manifests.quantity(limits['memory']))
      args += ['--memory=%d' % memory, '--memory-swap=%d' % memory]
    if 'cpu' in requests:  # kubelet's cpu.shares for a request
      args += ['--cpu-shares=%d' % int(manifests.quantity(requests['cpu']) * 1024)]
    created = docker(docker_env, *args, IMAGE, *command[1:], *flags)
    assert created.code == 0, created.log()

  def logs(self, docker_env):
    """(stdout lines, stderr lines) of every run of the container so far."""
    done = docker(docker_env, 'logs', self.name)
    return done.out.splitlines(), done.err.splitlines()

  def memory_limit(self, docker_env):
    """The container's memory limit in bytes, 0 for none."""
    return int(docker(docker_env, 'inspect', '-f', '{{.HostConfig.Memory}}', self.name).out)

  def exit_code(self, docker_env):
    done = docker(docker_env, 'inspect', '-f', '{{.State.Running}} {{.State.ExitCode}}',
                  self.name)
    running, code = done.out.split()
    return None if running == 'true' else int(code)


def tfjob_pods(path=manifests.TFJOB):
  """A TFJob's pods, ps first, then chief, workers, evaluator: [Pod], the chief's index."""
  tfjob = manifests.manifest(path)['TFJob']
  pods = []
  for rtype, hosts in manifests.tfjob_hosts(tfjob).items():
    spec = tfjob['spec']['tfReplicaSpecs'][rtype]['template']['spec']
    for index, host in enumerate(hosts):
      pods.append(Pod(host, spec, {'TF_CONFIG': manifests.tf_config(tfjob, rtype, index)}))
  return pods, [pod.host for pod in pods].index(
      '%s-chief-0.default.svc' % tfjob['metadata']['name'])


def jobset_pods():
  """The JobSet's pods, ps first, then the workers: [Pod], the chief's (worker 0's) index."""
  jobset = manifests.manifest(manifests.JOBSET)['JobSet']
  pods = []
  for rjob in jobset['spec']['replicatedJobs']:
    job = rjob['template']['spec']
    spec = job['template']['spec']
    for index in range(job['completions']):
      host = manifests.jobset_host(jobset, rjob, 0, index)
      pods.append(Pod(host, spec, manifests.pod_environment(jobset, rjob, 0, index)))
  return pods, [pod.host for pod in pods].index('cifar10-dist-worker-0-0.cifar10-dist')


def start_job(env, pods, tmp_path, sample, max_steps):
  """Makes and starts the pods' containers on a sample in tmp_path/shared; returns it."""
  shared = tmp_path / 'shared'
  shutil.copytree(sample.dir, str(shared / 'cifar10_data'))
  subnet = docker(env, 'network', 'inspect', '-f', '{{(index .IPAM.Config 0).Subnet}}',
                  NETWORK).out.strip()
  for i, pod in enumerate(pods):
    pod.ip = str(ipaddress.ip_network(subnet)[10 + i])
  for pod in pods:
    pod.create(env, pods, shared,
               ['--data_md5=%s' % sample.md5, '--max_steps=%d' % max_steps] + RUN_FLAGS)
  started = docker(env, 'start', *[pod.name for pod in pods])
  assert started.code == 0, started.log()
  return shared


def stop_like_kubelet(env, pods):
  """SIGTERM to every container at once, SIGKILL after each one's grace; returns the
  seconds it took."""
  start = time.time()
  graces = sorted({pod.grace for pod in pods})
  stops = [subprocess.Popen(['docker', 'stop', '-t', str(grace)] +
                            [pod.name for pod in pods if pod.grace == grace],
                            env=env, stdout=subprocess.DEVNULL)
           for grace in graces]
  for stop in stops:
    assert stop.wait(timeout=max(graces) + 60) == 0
  return time.time() - start


def wait_for_exits(env, pods, timeout=helpers.RUN_TIMEOUT_SECS):
  """Every pod's exit code, once all have exited: `docker wait`, which returns as they do."""
  done = docker(env, 'wait', *[pod.name for pod in pods], timeout=timeout)
  assert done.code == 0, done.log()
  return [int(code) for code in done.out.split()]


def job_log(env, pods):
  """A message naming a file with every pod's whole log."""
  text = '\n'.join('==== %s\n%s' % (pod.name, '\n'.join(sum(pod.logs(env), [])))
                   for pod in pods)
  return helpers.write_log(['docker-pods'], 'see each', text)


def wait_for_checkpoint(env, pods, chief, step):
  """Waits for the chief's `Saved checkpoint ... model.ckpt-N`, N >= step; fails at once
  should a pod exit."""
  deadline = time.time() + helpers.WAIT_SECS
  while max(helpers.steps(SAVED_LINE, sum(chief.logs(env), [])) or [0]) < step:
    exited = [pod.name for pod in pods if pod.exit_code(env) is not None]
    assert not exited and time.time() < deadline, (
        'no checkpoint at step %d or later; exited: %s' % (step, exited), job_log(env, pods))
    time.sleep(0.5)


def restart_and_resume(env, pods, chief, first_run, step):
  """Starts the pods' containers again (as the operator or kubelet restarts them): every
  one exits 0, and the chief's new lines (past first_run, its lines per log before)
  resume from step."""
  restarted = docker(env, 'start', *[pod.name for pod in pods])
  assert restarted.code == 0, restarted.log()
  assert wait_for_exits(env, pods) == [0] * len(pods), job_log(env, pods)
  rerun = sum((lines[n:] for lines, n in zip(chief.logs(env), first_run)), [])
  assert matches(RESUMING_LINE, rerun)[0].groups() == (str(step), str(step)), job_log(
      env, pods)


def test_tfjob_pods_stopped_like_kubelet_chief_saves_all_exit_143_same_containers_resume(
    env, tmp_path, sample):
  job = 'tfjob'
  pods, chief_index = tfjob_pods()
  chief = pods[chief_index]
  shared = start_job(env, pods, tmp_path, sample, MAX_STEPS[job])
  wait_for_checkpoint(env, pods, chief, 10)
  took = stop_like_kubelet(env, pods)
  codes = wait_for_exits(env, pods)
  # The evaluator too: it was 137, SIGTERM dropped by its PID 1 until the grace's SIGKILL.
  assert codes == [143] * len(pods), (codes, job_log(env, pods))
  assert took < min(pod.grace for pod in pods), (took, job_log(env, pods))
  first_run = [len(lines) for lines in chief.logs(env)]
  [stopped] = matches(STOPPED_LINE, sum(chief.logs(env), []))
  step = int(stopped.group(2))
  assert stopped.group(1) == 'SIGTERM' and 10 <= step < MAX_STEPS[job], stopped.group(0)
  assert helpers.global_step(shared / 'train' / ('model.ckpt-%d' % step)) == step
  restart_and_resume(env, pods, chief, first_run, step)
  last = shared / 'train' / ('model.ckpt-%d' % MAX_STEPS[job])
  assert helpers.global_step(last) == MAX_STEPS[job]


def test_jobset_pods_find_each_other_by_dns_name_train_to_the_end_all_exit_0(
    env, tmp_path, sample):
  # What the JobSet's successPolicy counts on: every worker ends by itself, and the ps.
  job = 'jobset'
  pods, chief_index = jobset_pods()
  shared = start_job(env, pods, tmp_path, sample, MAX_STEPS[job])
  assert [pod.memory_limit(env) for pod in pods] == [
      manifests.quantity(pod.container['resources']['limits']['memory']) for pod in pods]
  assert wait_for_exits(env, pods) == [0] * len(pods), job_log(env, pods)
  chief_lines = sum(pods[chief_index].logs(env), [])
  assert ('cluster from JobSet cifar10-dist: 1 ps, 3 workers at cifar10-dist-{ps,worker}-0-'
          '<index>.cifar10-dist:2222; this task: worker 0, the chief (pod '
          'cifar10-dist-worker-0-0)') in chief_lines, job_log(env, pods)
  last = shared / 'train' / ('model.ckpt-%d' % MAX_STEPS[job])
  assert helpers.global_step(last) == MAX_STEPS[job]


def test_tfjob_all_reduce_worker_pod_killed_others_exit_138_restarted_resume_to_the_end(
    env, tmp_path, sample):
  # tfjob-all-reduce.yaml: no ps. A worker's pod killed mid-run fails the others' next
  # all-reduce; each exits 138, which the operator's restartPolicy ExitCode restarts, as
  # `docker start` does here; the chief resumes and sends its checkpoint to every worker.
  # The trainers alone: the evaluator, in no training cluster, is tfjob.yaml's test's.
  everyone, _ = tfjob_pods(manifests.TFJOB_ALL_REDUCE)
  pods = [pod for pod in everyone if '-evaluator-' not in pod.host]
  assert len(pods) == 3 and len(everyone) == 4
  chief = next(pod for pod in pods if '-chief-' in pod.host)
  shared = start_job(env, pods, tmp_path, sample, ALL_REDUCE_STEPS)
  wait_for_checkpoint(env, pods, chief, 10)
  killed = next(pod for pod in pods if '-worker-' in pod.host)
  assert docker(env, 'kill', killed.name).code == 0
  codes = wait_for_exits(env, pods)
  assert sorted(codes) == [137, 138, 138], (codes, job_log(env, pods))
  first_run = [len(lines) for lines in chief.logs(env)]
  restart_and_resume(env, pods, chief, first_run, helpers.global_step(shared / 'train'))
  assert helpers.global_step(shared / 'train') == ALL_REDUCE_STEPS
