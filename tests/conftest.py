"""Fixtures several test files use; the helpers they call are in tests/helpers/.

The data sets are written once per test process by the product's own sample
writers; a test that changes one makes its own. Every process a test starts
through `tasks` is killed when the test ends, pass or fail.
"""
import atexit
import collections
import os
import re
import shutil
import signal
import statistics
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))

import helpers  # noqa: E402  (after the paths it needs)
from training import machine, prelude  # noqa: E402

# The kernels of this process are the programs' kernels. A test that compares a
# run in this process with a program's run (tests/test_dist_train.py's sync workers
# against one-process SGD) needs both on the same ones: so this process takes the
# programs' own choice, before any test module imports TensorFlow. Without this, on
# CPUs with AVX2 and no AVX512_VNNI, TensorFlow left oneDNN off here while every
# program's --onednn=auto turned it on. TF_ENABLE_ONEDNN_OPTS set by the user still
# wins, here and in every program the suite starts (.ci/run forces it each way).
machine.choose(['pytest'])

# TensorFlow's C++ INFO lines from the test processes (a session waiting for a cluster's
# task: `CreateSession still waiting for response from worker`) landed on pytest's
# progress line: they drop them, unless the user set a level. The programs the tests
# start get the user's environment without it (helpers.user_env), and print what they
# print at their own default.
if prelude.LOG_LEVEL_ENV not in os.environ:
  os.environ.update({prelude.LOG_LEVEL_ENV: '1', helpers.TESTS_ONLY_ENV: prelude.LOG_LEVEL_ENV})

# A suite started in the background by a script (`cmd &`, nohup) inherits SIGINT
# ignored, and so would every program it starts: Python then installs no Ctrl-C
# handler, and the tests that send one would wait for nothing. With Python's own
# handler here, the programs start with the default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

CIFAR10_SAMPLE_RECORDS = 40      # per file: 200 training records, 40 test records
MNIST_SAMPLE_RECORDS = (2000, 500)  # train, test


@pytest.fixture(scope='session', autouse=True)
def whole_logs(tmp_path_factory):
  """Failed subprocess checks write whole logs under this session's temporary directory."""
  helpers.processes.LOG_DIR = str(tmp_path_factory.getbasetemp() / 'logs')


@pytest.fixture(scope='session')
def sample(tmp_path_factory):
  """A CIFAR-10 sample (helpers.Sample) that tests read and never change."""
  return helpers.write_sample(tmp_path_factory.mktemp('cifar10'), CIFAR10_SAMPLE_RECORDS)


@pytest.fixture(scope='session')
def mnist_sample(tmp_path_factory):
  """The directory of an MNIST sample (train.tfrecords, test.tfrecords), read only."""
  import mnist_input
  path = str(tmp_path_factory.mktemp('mnist'))
  mnist_input.write_sample(path, *MNIST_SAMPLE_RECORDS)
  return path


@pytest.fixture(scope='session')
def helpshort():
  """helpshort('dist_train.py') -> its --helpshort Run, started once per test process.

  Tests that read it carry @pytest.mark.xdist_group('helpshort'), so that one process
  starts each program once.
  """
  runs = {}

  def get(program):
    if program not in runs:
      runs[program] = helpers.run([program, '--helpshort'])
    return runs[program]
  return get


@pytest.fixture
def tasks():
  """start(argv, env=None) -> helpers.Task; every task of the test is killed at its end."""
  yield from helpers.started_tasks()


@pytest.fixture(scope='module')
def module_tasks():
  """start(argv, env=None) -> helpers.Task, for processes a module's tests share."""
  yield from helpers.started_tasks()


# ---- Exported models: tests/test_export_model.py and tests/test_classify.py -------------
# Once per test process for both files: their tests that use one carry
# @pytest.mark.xdist_group('export'), so that one process trains and exports each once.

@pytest.fixture(scope='session')
def exported(sample, tmp_path_factory):
  """A CIFAR-10 model trained 20 steps on the sample, exported by `python export_model.py`."""
  import multi_gpu_train
  root = tmp_path_factory.mktemp('export')
  train_dir, export_dir = str(root / 'train'), str(root / 'model')
  multi_gpu_train.train(helpers.trainer_settings(
      train_dir, sample.dir, num_gpus=1, batch_size=16, max_steps=20, summary_steps=0,
      data_md5=sample.md5, seed=1))
  done = helpers.run(['export_model.py', '--train_dir=' + train_dir,
                      '--export_dir=' + export_dir])
  assert done.code == 0, done.log()
  return types.SimpleNamespace(root=str(root), train_dir=train_dir, export_dir=export_dir,
                               checkpoint=os.path.join(train_dir, 'model.ckpt-20'), run=done)


@pytest.fixture(scope='session')
def mnist_exported(mnist_sample, tmp_path_factory):
  """An MNIST model trained 20 steps on the sample, exported in this process."""
  import export_model
  import multi_gpu_train
  root = tmp_path_factory.mktemp('mnist_export')
  train_dir, export_dir = str(root / 'train'), str(root / 'model')
  multi_gpu_train.train(helpers.trainer_settings(
      train_dir, mnist_sample, dataset='mnist', num_gpus=1, batch_size=50, max_steps=20,
      summary_steps=0, seed=1))
  path, step = export_model.export(train_dir, export_dir, 'mnist')
  assert (path, step) == (os.path.join(train_dir, 'model.ckpt-20'), 20)
  return types.SimpleNamespace(train_dir=train_dir, export_dir=export_dir, checkpoint=path)


# ---- A test process's end ---------------------------------------------------------------
# An xdist worker has sent its last result before Python's exit starts; Python's teardown
# of a process that has loaded TensorFlow and built hundreds of graphs then took about 3 s
# of every run's end (this project's 2-core EPYC, 2026-11-28: timestamps logged at each
# worker's sessionfinish and atexit, `python -m pytest tests -m "not slow"`). A worker
# ends once the exit handlers registered after this one have run (the fork servers' stop).
def _end_worker_now():
  if os.environ.get('PYTEST_XDIST_WORKER'):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


atexit.register(_end_worker_now)


# ---- Progress while slow tests run -------------------------------------------------
# -q prints a dot per test, and nothing while a test takes minutes: the run looked hung
# for 15 minutes. Each phase (setup, call) that takes SLOW_PHASE_SECS or more gets a line
# of its own as it ends, naming the test, in the process that writes the terminal.
SLOW_PHASE_SECS = 30
_controller = []  # the pytest config of the process that writes the terminal


# The real-Slurm tests mostly wait on Slurm's clock (a time limit's warning, a requeue's
# hold): first, so that the other tests run beside those waits rather than after them.
WAITING_FIRST = 'test_slurm.py'


def pytest_xdist_auto_num_workers(config):
  """One test process per core, and one more where Slurm is installed and its tests may
  run: the one that runs them mostly waits, on Slurm's clock. Not for -m "not slow"
  (every Slurm test is slow): a third process on two cores, with nothing to wait for,
  cost the quick loop CPU time, not only its import (measured on this project's 2-core
  EPYC with `/usr/bin/time python -m pytest tests -m "not slow" -n 3`, then `-n 2`:
  171-207 CPU-s against 143, 2026-11-28)."""
  slurm = bool(shutil.which('slurmctld') and shutil.which('sbatch'))
  quick_loop = re.search(r'\bnot\s+slow\b', config.getoption('markexpr') or '')
  return (os.cpu_count() or 1) + (slurm and not quick_loop)


def pytest_collection_modifyitems(items):
  items.sort(key=lambda item: item.path.name != WAITING_FIRST)  # stable: else as collected


def pytest_configure(config):
  if not hasattr(config, 'workerinput'):  # not an xdist worker: the controller, or -n 0
    _controller.append(config)


# ---- How the programs were started: the last line of every run ----------------------------
# Forked from an imported TensorFlow, or fresh (tests/helpers/forkserver.py says which
# and why): a test that quietly goes back to fresh interpreters shows here.
# Beside them, how long a fork server took to start and import TensorFlow: the host's
# speed during the run, which on this project's shared host moved the suite's time by a
# quarter within the hour (docs/tests.md).
_starts = collections.Counter()
_import_secs = []


def pytest_sessionfinish(session):
  if hasattr(session.config, 'workerinput'):  # an xdist worker: to the controller
    session.config.workeroutput.update(starts=dict(helpers.STARTS),
                                       import_secs=helpers.server_import_secs())
  else:
    _starts.update(helpers.STARTS)
    _import_secs.extend(helpers.server_import_secs())


def pytest_testnodedown(node, error):
  output = getattr(node, 'workeroutput', {})
  _starts.update(output.get('starts', {}))
  _import_secs.extend(output.get('import_secs', []))


def pytest_terminal_summary(terminalreporter):
  if sum(_starts.values()):
    terminalreporter.write_line(
        'programs started: %d forked from an imported TensorFlow, %d fresh interpreters, '
        '%d fork servers (tests/helpers/forkserver.py); %d of them --local_cluster '
        'launchers, which fork their tasks' % (
            _starts['forked runs'], _starts['fresh interpreters'], _starts['fork servers'],
            _starts['launchers']))
  if _import_secs:
    terminalreporter.write_line(
        'this host\'s speed: a fork server started and imported TensorFlow in %.2f CPU-s '
        '(median of %d); compare suite times taken at like figures' % (
            statistics.median(_import_secs), len(_import_secs)))


def pytest_runtest_logreport(report):
  if report.when == 'teardown' or report.duration < SLOW_PHASE_SECS or not _controller:
    return
  reporter = _controller[0].pluginmanager.get_plugin('terminalreporter')
  if reporter is not None:
    reporter.write_line('[%s %.0f s, %s] %s' % (report.when, report.duration, report.outcome,
                                                report.nodeid))
