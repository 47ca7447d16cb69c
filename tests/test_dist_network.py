"""dist_train.py's tasks at addresses of their own, on links that fail as networks do.

Each task (1 ps, 2 workers) runs in a network namespace of its own on a bridge, all of
it inside one private namespace (benchmarks/netlab.py): a lost peer is not a refused
connection within milliseconds, as on 127.0.0.1, but packets dropped (iptables DROP),
connections reset (REJECT with tcp-reset) or a link down, over links shaped by tbf.
Skipped, saying why, where the namespaces cannot be made (not root, no iptables).
"""
import re
import signal
import time

import pytest

import helpers
from helpers import QUICK_FLAGS, STEADY_FLAGS, WORKER_LOSS_LINE, step_at_least
from benchmarks import netlab
from distributed import all_reduce, local_cluster
from distributed.worker_sessions import STEP_SLACK_SECS

pytestmark = [pytest.mark.slow, pytest.mark.network]

PORT = 2222                  # every host has an address of its own: one port for all
STEP_TIMEOUT_SECS = 5
# The promises' bounds: a whole job stopped by SIGTERM, every task gone with 143 within
# this long however the network is (Kubernetes' grace period is 30 s), and how far the
# global step a worker shows may fall after a fault (the steps of updates in flight).
STOP_SECS = 15
FALL_STEPS = 5
PARTITIONED_SECS = 2         # a partition this old when the whole job is stopped
RESET_SECS = 5               # resets toward the ps task this long, within the step timeout
SHORT_FAULT_SECS = 3         # a fault this long, well within a step timeout of 20 s


@pytest.fixture
def lab():
  why = netlab.available()
  if why:
    pytest.skip(why)
  lab = netlab.Lab()
  yield lab
  lab.stop()


def start_job(lab, tasks, tmp_path, *flags, names=('ps0', 'worker0', 'worker1')):
  """Starts each task on a host of its own; returns ({name: Task}, {name: Host}, start)
  where start(name) starts that task again with its own command (an orchestrator's
  restart)."""
  hosts = {name: lab.hosts.get(name) or lab.add_host(name) for name in names}
  ps_hosts = ['%s:%d' % (hosts[n].address, PORT) for n in names if n.startswith('ps')]
  worker_hosts = ['%s:%d' % (hosts[n].address, PORT) for n in names if n.startswith('w')]
  all_flags = QUICK_FLAGS + STEADY_FLAGS + ['--allow_nonloopback_hosts',  # the lab's own
                                            '--train_dir=%s' % tmp_path, '--summary_steps=0',
                                            '--step_timeout_secs=%d' % STEP_TIMEOUT_SECS,
                                            *flags]

  def start(name):
    job_name, index = re.fullmatch(r'(ps|worker)(\d+)', name).groups()
    return tasks(lab.command(hosts[name], local_cluster.task_command(
        job_name, int(index), ps_hosts, worker_hosts, all_flags)))
  return {name: start(name) for name in names}, hosts, start


def shown_steps(task):
  return helpers.steps(WORKER_LOSS_LINE, task.lines)


def assert_never_fell(task):
  """The global steps the task's loss lines show never fall by more than FALL_STEPS."""
  shown = shown_steps(task)
  falls = [(a, b) for a, b in zip(shown, shown[1:]) if b < a - FALL_STEPS]
  assert not falls, (falls, task.log())


def exit_times(job, since):
  """{name: seconds from `since` to the task's exit}, once every task of job has exited."""
  ended = {}

  def all_ended():
    for name, task in job.items():
      if name not in ended and task.process.poll() is not None:
        ended[name] = time.time() - since
    return len(ended) == len(job)
  helpers.wait_until(all_ended, 'every task\'s end', timeout=60)
  return ended


MODE_FLAGS = {'async': [], 'sync': ['--sync_replicas'], 'all_reduce': ['--all_reduce']}


@pytest.mark.parametrize('mode', ['async', 'sync', 'all_reduce'])
def test_whole_job_sigterm_during_a_blackhole_every_task_143_within_15_s_the_step_saved(
    lab, tasks, tmp_path, mode):
  # The run: a step timeout of 20 s, which the stop must not wait out. The
  # blackhole: between a worker and the ps; all-reduce, which has none, between the
  # workers, and its chief saves its own copy (its step waits on the other worker).
  names = ('worker0', 'worker1') if mode == 'all_reduce' else ('ps0', 'worker0', 'worker1')
  job, hosts, _ = start_job(lab, tasks, tmp_path, '--max_steps=100000',
                            '--step_timeout_secs=20', *MODE_FLAGS[mode], names=names)
  lab.shape(hosts['worker0'], '200mbit')
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(3), 'step 3')
  lab.cut(hosts[names[0]], hosts['worker1'])
  time.sleep(PARTITIONED_SECS)  # the fault's length so far, not a wait for an event
  sent = time.time()
  for task in job.values():
    task.send(signal.SIGTERM)
  ended = exit_times(job, sent)
  for name, task in job.items():
    assert task.finish() == 143, task.log()
    assert ended[name] < STOP_SECS, (ended, task.log())
    assert 'Traceback' not in task.text, task.log()
  stopped = helpers.matches(helpers.STOPPED_LINE, job['worker0'].lines)
  assert [m.group(1) for m in stopped] == ['SIGTERM'], job['worker0'].log()
  assert helpers.global_step(tmp_path) == int(stopped[0].group(2))
  if mode == 'all_reduce':  # the step it showed last is the one saved: nothing lost
    assert shown_steps(job['worker0'])[-1] == int(stopped[0].group(2)), job['worker0'].log()
    assert ('its own copy of the variables is saved at step %s' % stopped[0].group(2)
            in job['worker0'].text), job['worker0'].log()
    assert 'the other workers do not answer' in job['worker1'].text, job['worker1'].log()


def test_all_reduce_workers_cut_off_from_each_other_both_exit_138_at_the_step_timeout(
    lab, tasks, tmp_path):
  # No ps: each worker's all-reduce waits on packets that never come (not a refused
  # connection), until TensorFlow's timeout cancels it; one line each, no traceback.
  job, hosts, _ = start_job(lab, tasks, tmp_path, '--max_steps=100000', '--all_reduce',
                            names=('worker0', 'worker1'))
  for host in hosts.values():
    lab.shape(host, '200mbit')
  for name in job:
    job[name].wait_for(step_at_least(3), 'step 3')
  lab.cut(hosts['worker0'], hosts['worker1'])
  cut_at = time.time()
  ended = exit_times(job, cut_at)
  for name, task in job.items():
    assert task.finish() == 138, task.log()
    assert ended[name] < STEP_TIMEOUT_SECS + all_reduce.STEP_SLACK_SECS + 2 + 1, (ended,
                                                                                  task.log())
    errors = [line for line in task.err_lines if line.startswith('error: ')]
    assert len(errors) == 1 and '--step_timeout_secs=%d: ' % STEP_TIMEOUT_SECS in errors[0], (
        task.log())
    assert 'Traceback' not in task.text, task.log()


def test_chief_cut_off_past_its_step_timeout_rerun_goes_on_from_the_ps_step(
    lab, tasks, tmp_path):
  # Async, on links of 200 Mbit/s: worker 1 trains on while the chief is away. The
  # chief's step ends at its step timeout (before, the watchdog's 30 s later), and its
  # rerun finds the variables live on the ps task and goes on from them: before, it
  # restored its last checkpoint over them, worker 1's updates since thrown away.
  max_steps = 250
  job, hosts, start = start_job(lab, tasks, tmp_path, '--max_steps=%d' % max_steps,
                                '--save_every_n_steps=30')
  for host in hosts.values():
    lab.shape(host, '200mbit')
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(40), 'step 40, past a checkpoint')
  lab.cut(hosts['ps0'], hosts['worker0'])
  cut_at = time.time()
  assert job['worker0'].finish(timeout=60) == 138, job['worker0'].log()
  assert time.time() - cut_at < STEP_TIMEOUT_SECS + STEP_SLACK_SECS + 2, job['worker0'].log()
  saved = max(helpers.steps(helpers.SAVED_LINE, job['worker0'].lines))
  job['worker1'].wait_for(step_at_least(saved + 2 * FALL_STEPS + 20),
                          'worker 1 training on alone')
  lab.mend(hosts['ps0'], hosts['worker0'])
  chief = start('worker0')
  chief.wait_for(re.compile(r'^worker 0: the ps tasks still hold the variables, at global '
                            r'step (\d+): going on from it, not from .*model\.ckpt-%d$'
                            % saved), 'the chief going on from the ps task\'s step')
  held = int(re.search(r'at global step (\d+)', chief.text).group(1))
  assert held > saved + 2 * FALL_STEPS, chief.log()
  for task in (chief, job['worker1'], job['ps0']):
    assert task.finish(timeout=120) == 0, task.log()
  for task in (chief, job['worker1']):
    assert_never_fell(task)
  assert helpers.global_step(tmp_path) == max_steps


def test_tcp_resets_toward_the_ps_within_the_step_timeout_nothing_restored_all_finish(
    lab, tasks, tmp_path):
  # Async. A reset connection is not a restart: the ps task's variables are intact.
  # Each worker's step either waits the resets out or reopens its session, and the
  # chief, if it reopens, goes on from the ps task's variables; no task exits for it.
  # (Sync: the chief exited 138 in 1 of about 6 runs under load, cause not found; not
  # tested until it is.)
  max_steps = 300
  job, hosts, _ = start_job(lab, tasks, tmp_path, '--max_steps=%d' % max_steps,
                            '--save_every_n_steps=50', '--step_timeout_secs=30')
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(60), 'step 60')
  for name in ('worker0', 'worker1'):
    lab.reset(hosts['ps0'], hosts[name])
  time.sleep(RESET_SECS)  # the fault's length, not a wait for an event
  for name in ('worker0', 'worker1'):
    lab.mend(hosts['ps0'], hosts[name])
  for name in ('worker0', 'worker1', 'ps0'):  # the workers' logs first: the ps ends with them
    assert job[name].finish(timeout=120) == 0, job[name].log()
  # The resets aborted the chief's session (a reset is seen at once): it reopened it,
  # and went on from the ps task's step, past its last checkpoint, restoring nothing.
  assert re.search(r'^worker 0: the ps tasks still hold the variables, at global step '
                   r'\d+: going on from it', job['worker0'].text, re.M), job['worker0'].log()
  assert 'the ps tasks restarted' not in job['worker0'].text, job['worker0'].log()
  for name in ('worker0', 'worker1'):
    assert_never_fell(job[name])
  assert helpers.global_step(tmp_path) == max_steps


def test_short_faults_within_the_step_timeout_no_task_exits_for_them(lab, tasks, tmp_path):
  # Async, step timeout 20 s: a worker cut off from the ps for 3 s, the ps task paused
  # 3 s (a VM's pause), its link down 2 s (a flap). Each step waits them out: no task
  # exits, none later for them, no step goes back.
  max_steps = 300
  job, hosts, _ = start_job(lab, tasks, tmp_path, '--max_steps=%d' % max_steps,
                            '--step_timeout_secs=20')
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(30), 'step 30')
  lab.cut(hosts['ps0'], hosts['worker1'])
  time.sleep(SHORT_FAULT_SECS)  # each fault's length, not a wait for an event
  lab.mend(hosts['ps0'], hosts['worker1'])
  job['ps0'].send(signal.SIGSTOP)
  time.sleep(SHORT_FAULT_SECS)
  job['ps0'].send(signal.SIGCONT)
  lab.link(hosts['ps0'], up=False)
  time.sleep(SHORT_FAULT_SECS)
  lab.link(hosts['ps0'], up=True)
  for task in job.values():
    assert task.finish(timeout=120) == 0, task.log()
  for name in ('worker0', 'worker1'):
    assert_never_fell(job[name])
  assert helpers.global_step(tmp_path) == max_steps


@pytest.mark.parametrize('mode', ['async', 'sync'])
def test_ps_paused_past_the_step_timeout_workers_exit_138_at_it(lab, tasks, tmp_path, mode):
  # A stopped ps task answers nothing, as a blackhole: each worker's step ends at
  # --step_timeout_secs plus at most STEP_SLACK_SECS (before, the watchdog's 30 s).
  job, _, _ = start_job(lab, tasks, tmp_path, '--max_steps=100000',
                        *(['--sync_replicas'] if mode == 'sync' else []))
  for name in ('worker0', 'worker1'):
    job[name].wait_for(step_at_least(3), 'step 3')
  job['ps0'].send(signal.SIGSTOP)
  paused = time.time()
  for name in ('worker0', 'worker1'):
    assert job[name].finish(timeout=60) == 138, job[name].log()
    assert time.time() - paused < STEP_TIMEOUT_SECS + STEP_SLACK_SECS + 2, job[name].log()
    assert 'Traceback' not in job[name].text, job[name].log()
  job['ps0'].send(signal.SIGCONT)


def test_ps_unreachable_at_start_worker_exits_138_naming_it(lab, tasks, tmp_path):
  ps, worker = lab.add_host('ps0'), lab.add_host('worker0')
  lab.cut(ps, worker)  # before either starts
  job, _, _ = start_job(lab, tasks, tmp_path, '--startup_timeout_secs=5',
                        names=('ps0', 'worker0'))
  assert job['worker0'].finish(timeout=60) == 138, job['worker0'].log()
  errors = [line for line in job['worker0'].err_lines if line.startswith('error')]
  assert errors == [
      'error: worker 0 waited 5 s for the ps task(s) at %s:%d: nothing accepts connections '
      'there. Start them first (python dist_train.py --job_name=ps --task_index=i with the '
      'same --ps_hosts and --worker_hosts), check --ps_hosts, or raise '
      '--startup_timeout_secs.' % (ps.address, PORT)], job['worker0'].log()
