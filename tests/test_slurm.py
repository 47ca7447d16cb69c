"""deploy/slurm/train.sbatch through a real sbatch, on a Slurm of one host.

deploy/slurm/local_slurm.sh starts the Slurm (munged, slurmctld, two slurmd's) once
for this module and stops it at the end, unless it was running before. Each test
submits the shipped script as a user would, from the repository root, with the
tasks on one node (two nodes of one host would give two tasks the same port) and
dist_train.py's flags after the script's name. Slurm's own record is read with
`scontrol show job` (no slurmdbd: no sacct); the tasks' exit codes with srun's
lines in the job's output. Each job's output, when a check fails, is in the message.
"""
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

import helpers
from helpers import DONE_LINE, RESUMING_LINE, SAVED_LINE, STOPPED_LINE

if shutil.which('slurmctld') is None or shutil.which('sbatch') is None:
  pytest.skip('Slurm is not installed (deploy/slurm/local_slurm.sh start installs it)',
              allow_module_level=True)
if os.geteuid() != 0:
  pytest.skip('local_slurm.sh runs its daemons as root', allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('slurm')]

SCRIPT = os.path.join(helpers.ROOT, 'deploy', 'slurm', 'local_slurm.sh')
SBATCH = os.path.join(helpers.ROOT, 'deploy', 'slurm', 'train.sbatch')
STATE_DIR = os.environ.get('LOCAL_SLURM_DIR', '/tmp/local-slurm')
# One node, 1 ps task and 2 workers, whatever the script's #SBATCH lines ask: a job of
# several workers, each task starting fresh (TensorFlow's import: 3 s of CPU each).
TASKS = 3
ONE_NODE = ['--nodes=1', '--ntasks-per-node=%d' % TASKS, '--cpus-per-task=1']
# Runs of thousands of async steps: the book's MNIST network settles where CIFAR-10
# at a learning rate of 0.1 on synthetic batches of 8 diverged by step 124 (3 workers).
# About 160 steps a second (2 workers), every task started 20 s after the job: the job's
# loss lines, `python -m pytest tests/test_slurm.py -n 0`, 2-core EPYC, 2026-11-28.
STEADY_FLAGS = ['--dataset=mnist', '--synthetic', '--batch_size=8',
                '--save_every_n_steps=200', '--log_frequency=1000']
CHIEF = 1                   # SLURM_PROCID of worker 0 with --num_ps=1
JOB_SECS = 240              # submit to done, one run; about 20-70 s on 2 busy cores
TIME_LIMIT_STEPS = 1000     # more than the first run trains before its tasks are stopped
                            # to wait for the warning: 210 and 234 (first save: 201), the
                            # chief's `Stopped by SIGTERM at step N` in the job's output,
                            # `python -m pytest tests/test_slurm.py -n 0`, 2026-11-28
WARNED_LINE = 'time limit near: stopping the tasks to requeue'  # train.sbatch's
WARNING_SECS = 150          # the time-limit test's --signal=B:USR1@: due at once once set
LOOK_SECS = 30              # slurmctld looks at time limits this often
STOP_SECS = 45              # from the warning to the limit, at least: the tasks save, the
                            # script requeues (a few seconds here)
ENDED = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY',
         'BOOT_FAIL', 'DEADLINE', 'PREEMPTED'}
RANK_LINE = re.compile(r'^(\d+): (.*)$')                            # srun --label
TASK_EXIT = re.compile(r'^srun: error: \S+: tasks? ([\d,-]+): (.*)$')


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  """The environment that reaches the Slurm: SLURM_CONF, and `python` as this one.

  sbatch hands the job this environment, so the tasks run this Python: a script that
  execs it by the path it was started by, not a symlink to it, which a venv's python
  is not reached through (Python finds its venv beside the path it was started by: a
  link in another folder started the base interpreter, without the venv's TensorFlow).
  """
  was_running = helpers.pid_file_alive(os.path.join(STATE_DIR, 'slurmctld.pid'))
  started = helpers.run(['bash', SCRIPT, 'start'], timeout=600)
  assert started.code == 0, started.log()
  conf = re.search(r'^export SLURM_CONF=(\S+)$', started.out, re.M).group(1)
  bin_dir = tmp_path_factory.mktemp('bin')
  python = bin_dir / 'python'
  python.write_text('#!/bin/sh\nexec %s "$@"\n' % shlex.quote(sys.executable))
  python.chmod(0o755)
  yield helpers.user_env(SLURM_CONF=conf,
                         PATH='%s:%s' % (bin_dir, os.environ.get('PATH', '')))
  if not was_running:
    stopped = helpers.run(['bash', SCRIPT, 'stop'])
    assert stopped.code == 0, stopped.log()


@pytest.fixture
def submit(slurm, tmp_path):
  """submit(*sbatch_options, flags=[...]) -> Job; its jobs are cancelled at the test's end."""
  jobs = []

  def start(*options, flags=()):
    output = str(tmp_path / 'slurm-%j.out')
    done = helpers.run(['sbatch', '--parsable', '--chdir=' + helpers.ROOT,
                        '--output=' + output, *ONE_NODE, *options, SBATCH, *flags],
                       env=slurm)
    assert done.code == 0, done.log()
    jobs.append(Job(done.out.strip().split(';')[0], output, slurm))
    return jobs[-1]
  yield start
  for job in jobs:
    subprocess.run(['scancel', job.id], env=slurm, capture_output=True)


class Job:
  """One batch job: Slurm's record of it, and the lines its tasks wrote."""

  def __init__(self, job_id, output, env):
    self.id, self.env = job_id, env
    self.output = output.replace('%j', job_id)

  def info(self):
    """{field: value} of `scontrol show job`, e.g. JobState, ExitCode, Restarts."""
    done = helpers.run(['scontrol', 'show', 'job', '--oneliner', self.id], env=self.env)
    assert done.code == 0, done.log()
    return dict(word.split('=', 1) for word in done.out.split() if '=' in word)

  @property
  def text(self):
    try:
      with open(self.output) as f:
        return f.read()
    except FileNotFoundError:
      return ''

  def lines(self, rank):
    """What the task of this SLURM_PROCID printed, its `N: ` label taken off."""
    return [m.group(2) for m in map(RANK_LINE.match, self.text.splitlines())
            if m and int(m.group(1)) == rank]

  def task_exits(self):
    """{rank: how srun says it ended} for the tasks that did not exit 0."""
    found = {}
    for m in map(TASK_EXIT.match, self.text.splitlines()):
      if m:
        for rank in _ranks(m.group(1)):
          found[rank] = m.group(2)
    return found

  def wait_for(self, condition, what, timeout=JOB_SECS):
    """Polls condition() until it is truthy; returns it. Fails with the job's output at
    the timeout, or as soon as the job has ended without it (a job whose tasks all
    failed at once is not waited for)."""
    deadline = time.time() + timeout
    while True:
      ended = self.info()['JobState'] in ENDED
      found = condition()  # after the look at the state: an end comes after its lines
      if found:
        return found
      if ended:
        raise AssertionError('no %s: the job ended first: %s' % (what, self.log()))
      if time.time() > deadline:
        raise AssertionError('no %s within %d s: %s' % (what, timeout, self.log()))
      time.sleep(0.5)

  def wait_end(self, timeout=JOB_SECS):
    """Waits until Slurm has finished with the job; returns its last info()."""
    return self.wait_for(lambda: (lambda i: i['JobState'] in ENDED and i)(self.info()),
                         'end of job %s' % self.id, timeout)

  def log(self):
    return helpers.write_log(['sbatch', self.id], self.info().get('JobState'), self.text)


def _ranks(text):
  """[0, 1, 3] from srun's `0-1,3`."""
  ranks = []
  for part in text.split(','):
    first, _, last = part.partition('-')
    ranks.extend(range(int(first), int(last or first) + 1))
  return ranks


def limit_warned_at_next_look(job, env):
  """Gives a running job a time limit whose warning (--signal=B:USR1@WARNING_SECS) is due
  at once, and whose end is still STOP_SECS past slurmctld's next look at time limits.

  The shortest limit is a minute, and slurmctld looks every LOOK_SECS: a job submitted
  with its short limit trained flat out until a warning due after its tasks' start (20-40
  s here), for 45-75 s; given it once training, it waits for the next look.
  """
  hours, minutes, seconds = map(int, job.info()['RunTime'].split(':'))
  elapsed = 3600 * hours + 60 * minutes + seconds
  limit = math.ceil((elapsed + LOOK_SECS + STOP_SECS) / 60)  # minutes
  assert 60 * limit - WARNING_SECS <= elapsed, (elapsed, limit)  # due already
  updated = helpers.run(['scontrol', 'update', 'JobId=' + job.id, 'TimeLimit=%d' % limit],
                        env=env)
  assert updated.code == 0, updated.log()


def send_to_tasks(job, signum):
  """Sends signum to every process of the job's `python dist_train.py` (its tasks, and
  their stderr filters); returns their PIDs, at least one per task."""
  marker = ('SLURM_JOB_ID=%s' % job.id).encode()
  pids = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open('/proc/%s/environ' % pid, 'rb') as f:
        if marker not in f.read().split(b'\0'):
          continue
      with open('/proc/%s/cmdline' % pid, 'rb') as f:
        argv = f.read().split(b'\0')
    except OSError:  # gone meanwhile
      continue
    if os.path.basename(argv[0]).startswith(b'python') and argv[1].endswith(b'dist_train.py'):
      os.kill(int(pid), signum)
      pids.append(int(pid))
  assert len(pids) >= TASKS, (pids, job.log())
  return pids


def first_checkpoint_after_zero(job):
  """The chief's first `Saved checkpoint ...model.ckpt-N` with N > 0: its N."""
  return next((n for n in helpers.steps(SAVED_LINE, job.lines(CHIEF)) if n > 0), None)


def test_train_sbatch_scontrol_requeue_mid_run_resumes_from_checkpoint_completes(
    submit, slurm, tmp_path):
  train_dir = tmp_path / 'train'
  job = submit(flags=STEADY_FLAGS + ['--max_steps=1000', '--train_dir=%s' % train_dir])
  saved = job.wait_for(lambda: first_checkpoint_after_zero(job), 'checkpoint past step 0')
  requeued = helpers.run(['scontrol', 'requeue', job.id], env=slurm)
  assert requeued.code == 0, requeued.log()
  info = job.wait_end(timeout=2 * JOB_SECS)
  assert (info['JobState'], info['ExitCode'], info['Restarts']) == ('COMPLETED', '0:0', '1'), \
      job.log()
  resumed = helpers.matches(RESUMING_LINE, job.lines(CHIEF))  # the second run's, appended
  assert len(resumed) == 1 and int(resumed[0].group(2)) >= saved, job.log()
  assert helpers.global_step(train_dir) == 1000


def test_train_sbatch_whole_job_sigterm_after_checkpoint_saves_resubmitted_resumes(
    submit, slurm, tmp_path):
  train_dir = tmp_path / 'train'
  flags = STEADY_FLAGS + ['--train_dir=%s' % train_dir]
  job = submit(flags=flags + ['--max_steps=100000'])
  job.wait_for(lambda: first_checkpoint_after_zero(job), 'checkpoint past step 0')
  # No --full, no --batch: every task of the step gets SIGTERM, the script does not.
  cancelled = helpers.run(['scancel', '--signal=TERM', job.id], env=slurm)
  assert cancelled.code == 0, cancelled.log()
  job.wait_end()
  stopped = helpers.matches(STOPPED_LINE, job.lines(CHIEF))
  assert [m.group(1) for m in stopped] == ['SIGTERM'], job.log()
  step = int(stopped[0].group(2))
  assert os.path.exists(str(train_dir / ('model.ckpt-%d.index' % step))), job.log()
  assert helpers.global_step(train_dir) == step
  assert job.task_exits() == {r: 'Exited with exit code 143' for r in range(TASKS)}, job.log()
  assert 'Traceback' not in job.text, job.log()

  again = submit(flags=flags + ['--max_steps=%d' % (step + 200)])
  info = again.wait_end()
  assert (info['JobState'], info['ExitCode']) == ('COMPLETED', '0:0'), again.log()
  resumed = helpers.matches(RESUMING_LINE, again.lines(CHIEF))
  assert [int(m.group(2)) for m in resumed] == [step], again.log()
  assert helpers.global_step(train_dir) == step + 200


def test_train_sbatch_time_limit_shorter_than_training_saves_requeues_resumes(
    submit, slurm, tmp_path):
  train_dir = tmp_path / 'train'
  job = submit('--time=10', '--signal=B:USR1@%d' % WARNING_SECS,
               flags=STEADY_FLAGS + ['--max_steps=%d' % TIME_LIMIT_STEPS,
                                     '--train_dir=%s' % train_dir])
  job.wait_for(lambda: first_checkpoint_after_zero(job), 'checkpoint past step 0')
  # Until the warning comes, at slurmctld's next look (up to LOOK_SECS), the tasks are
  # stopped: trained flat out, they spent 60 CPU-s of the suite's 2 cores meanwhile, and
  # as much again after the requeue, to train past where they had got. The warning's
  # SIGTERM waits for them, as a signal that comes mid-step does.
  stopped_tasks = send_to_tasks(job, signal.SIGSTOP)
  try:
    limit_warned_at_next_look(job, slurm)
    job.wait_for(lambda: WARNED_LINE in job.text.splitlines(), 'warning')
  finally:
    for pid in stopped_tasks:
      os.kill(pid, signal.SIGCONT)
  job.wait_for(lambda: job.info()['Restarts'] == '1', 'requeue', timeout=JOB_SECS)
  # The rest in one run, its limit set before the requeued run starts (Slurm holds it for
  # cred_expire, 10 s here): with this one, its warning would be due at once.
  updated = helpers.run(['scontrol', 'update', 'JobId=' + job.id, 'TimeLimit=10'], env=slurm)
  assert updated.code == 0, updated.log()
  stopped = helpers.matches(STOPPED_LINE, job.lines(CHIEF))
  assert [m.group(1) for m in stopped] == ['SIGTERM'], job.log()
  assert WARNED_LINE in job.text.splitlines(), job.log()
  # The script requeues the job once srun has ended: its lines are all there.
  assert job.task_exits() == {r: 'Exited with exit code 143' for r in range(TASKS)}, job.log()
  # tf.data's autotuning once paused for long, and a session whose iterator waited for it
  # did not close before the ps tasks left (training/input_data.py's closing_at_once;
  # tests/test_cifar10_input.py looks for the thread in every pipeline).
  assert 'its session did not close' not in job.text, job.log()
  info = job.wait_end()
  assert (info['JobState'], info['ExitCode'], info['Restarts']) == ('COMPLETED', '0:0', '1'), \
      job.log()
  resumed = helpers.matches(RESUMING_LINE, job.lines(CHIEF))
  assert [m.group(2) for m in resumed] == [stopped[0].group(2)], job.log()
  assert 'Traceback' not in job.text, job.log()
  assert helpers.global_step(train_dir) == TIME_LIMIT_STEPS


def test_train_sbatch_two_jobs_flags_after_script_one_node_reserved_ports_both_complete(
    submit, sample, tmp_path):
  # Two jobs on one node at once, dist_train.py's flags after the script's name: the
  # CIFAR-10 sample for 20 steps, and MNIST for 400. Without the ports srun reserves
  # for each step (MpiParams=ports=, SLURM_STEP_RESV_PORTS) both jobs' tasks would listen
  # on 8888.. of the same node, and the second would stop with `cannot listen on n1:8888`.
  train_dirs, max_steps = [tmp_path / 'cifar10', tmp_path / 'mnist'], [20, 400]
  flags = [['--batch_size=8', *sample.flags], STEADY_FLAGS]
  jobs = [submit('--nodelist=n1', flags=job_flags + [
      '--max_steps=%d' % steps, '--train_dir=%s' % train_dir])
          for job_flags, steps, train_dir in zip(flags, max_steps, train_dirs)]
  infos = [job.wait_end() for job in jobs]
  for job, info, train_dir, steps in zip(jobs, infos, train_dirs, max_steps):
    assert (info['JobState'], info['ExitCode'], info['Restarts']) == (
        'COMPLETED', '0:0', '0'), job.log()
    assert job.task_exits() == {}, job.log()  # srun names every task that does not exit 0
    assert 'Traceback' not in job.text, job.log()
    done = helpers.matches(DONE_LINE, job.lines(CHIEF))
    assert [(m.group(1), m.group(3)) for m in done] == [('0', str(steps))], job.log()
    assert helpers.global_step(train_dir) == steps
    assert job.lines(0)[-1] == 'ps task 0 done: training is over', job.log()
  ports = [re.findall(r'; ports (\S+) reserved by srun \(SLURM_STEP_RESV_PORTS\)',
                      '\n'.join(job.lines(CHIEF))) for job in jobs]
  assert all(len(found) == 1 for found in ports) and ports[0] != ports[1], ports
  # They ran side by side: each started before the other ended.
  assert infos[1]['StartTime'] < infos[0]['EndTime'] and (
      infos[0]['StartTime'] < infos[1]['EndTime']), infos


def test_train_sbatch_all_reduce_without_ps_every_task_a_worker_completes(submit, tmp_path):
  # train.sbatch's own command, --num_ps=0 --all_reduce after the script's name: the
  # step's 3 tasks are 3 workers, rank 0 the chief, averaging by all-reduce.
  train_dir = tmp_path / 'train'
  job = submit(flags=STEADY_FLAGS + ['--num_ps=0', '--all_reduce', '--max_steps=300',
                                     '--train_dir=%s' % train_dir])
  info = job.wait_end()
  assert (info['JobState'], info['ExitCode']) == ('COMPLETED', '0:0'), job.log()
  assert job.task_exits() == {} and 'Traceback' not in job.text, job.log()
  for rank in range(TASKS):
    done = helpers.matches(DONE_LINE, job.lines(rank))
    assert [(m.group(1), m.group(3)) for m in done] == [(str(rank), '300')], job.log()
  assert re.search(r'cluster from Slurm \(SLURM_\*\): 0 ps, 3 workers', job.text), job.log()
  assert helpers.global_step(train_dir) == 300
