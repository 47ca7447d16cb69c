"""training/prelude.py: the Python check, and TensorFlow's start-up lines kept to its log level."""
import collections
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

import helpers
from training import prelude

BANNER = (b'WARNING: All log messages before absl::InitializeLog() is called are written to '
          b'STDERR\n')
ONEDNN = (b'I0000 00:00:1795605088.891911   23957 port.cc:153] oneDNN custom operations are '
          b'on. You may see slightly different numerical results ...\n')
CUDA = (b'I0000 00:00:1795605088.892324   23957 cudart_stub.cc:31] Could not find cuda drivers '
        b'on your machine, GPU will not be used.\n')
WARNING = b'W1125 11:15:23.675665   23957 some_op.cc:12] something to look at\n'
ERROR = b'E0000 00:00:1795605088.9   23957 dso_loader.cc:9] something broke\n'
FATAL = (b'F0000 00:00:1795605088.9   23957 cpu_feature_guard.cc:1] The TensorFlow library '
         b'was compiled to use AVX instructions, but these aren\'t available on your machine.\n')
PLAIN = b'/usr/lib/python3/warnings.py:1: UserWarning: a Python warning\n'
PROGRAMS = ['multi_gpu_train.py', 'dist_train.py', 'cifar10_eval.py', 'mnist_eval.py',
            'export_model.py', 'cifar10_input.py', 'mnist_input.py']


def test_filter_lines_drops_lines_below_the_level_with_their_banner_and_passes_the_rest():
  # What TensorFlow 2.21 prints at import, once per library with its own absl, and more.
  lines = [BANNER, ONEDNN, CUDA, PLAIN, BANNER, ONEDNN, CUDA, WARNING, ERROR, FATAL]
  assert list(prelude.filter_lines(lines, 2)) == [PLAIN, ERROR, FATAL]
  assert list(prelude.filter_lines(lines, 1)) == [PLAIN, WARNING, ERROR, FATAL]
  assert list(prelude.filter_lines(lines, 3)) == [PLAIN, FATAL]
  # A banner before a line that is shown stays with it.
  assert list(prelude.filter_lines([BANNER, ERROR, CUDA], 2)) == [BANNER, ERROR]
  assert list(prelude.filter_lines([b'partial line, no newline'], 2)) == [
      b'partial line, no newline']


def test_filter_lines_drops_a_ps_step_cleanup_error_and_its_grpc_detail_the_program_says_itself():
  # dist_train.py's workers after a ps restart; the program's own line says what happened.
  cleanup = [b'E0000 00:00:1795675297.2   22365 master_session.cc:1972] Cleanup partition '
             b'error: UNAVAILABLE: sendmsg: Broken pipe (32)\n',
             b'Additional GRPC error information from remote target /job:ps/replica:0/task:0 '
             b'while calling /tensorflow.WorkerService/CleanupGraph:\n',
             b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Broken"}\n']
  said = b'worker 1: the session was aborted: a ps task (127.0.0.1:2222) went away\n'
  assert list(prelude.filter_lines(cleanup + [said, ERROR] + cleanup[1:], 2)) == [
      said, ERROR] + cleanup[1:]  # gRPC's detail after any other line stays
  assert list(prelude.filter_lines(cleanup[:1] + [PLAIN], 3)) == [PLAIN]


def test_min_level_reads_as_tensorflow_does():
  assert [prelude.min_level(v) for v in ('2', '0', '3', '', 'x')] == [2, 0, 3, 0, 0]


def _key(line):
  """A stderr line without its absl prefix (time, thread): notices compared by their text."""
  return re.sub(r'^[IWEF]\d{4} \S+ +\d+ ', '', line)


@pytest.mark.slow
def test_train_then_evaluate_on_the_sample_no_warning_or_error_line_no_notice_twice(sample,
                                                                                    tmp_path):
  # Real records with oneDNN on: before, a transpose of uint8 pixels logged `E... oneDNN
  # supports DT_UINT8 only on platforms with AVX-512` in both programs, and TensorFlow's
  # start-up notices came twice, TF_CPP_MIN_LOG_LEVEL=2 notwithstanding (prelude.py).
  env = helpers.user_env(TF_CPP_MIN_LOG_LEVEL=None)  # the programs' own default
  train_dir = str(tmp_path / 'train')
  runs = [helpers.run(['multi_gpu_train.py', '--onednn=on', '--max_steps=2', '--batch_size=8',
                       '--train_dir=%s' % train_dir] + sample.flags, env=env, cwd=str(tmp_path), fresh=True),
          helpers.run(['cifar10_eval.py', '--onednn=on', '--run_once',
                       '--checkpoint_dir=%s' % train_dir, '--eval_dir=%s' % (tmp_path / 'eval')]
                      + sample.flags, env=env, cwd=str(tmp_path), fresh=True)]
  for done in runs:
    assert done.code == 0, done.log()
    lines = done.err.splitlines()
    assert not [line for line in lines if re.match(r'[EW]\d{4} ', line)], done.log()
    counts = collections.Counter(map(_key, lines))
    assert not [line for line, n in counts.items() if n > 1 and line.strip()], done.log()
  assert 'precision @ 1 = ' in runs[1].out, runs[1].log()


def test_suite_processes_drop_tensorflows_info_lines_programs_get_the_users_level():
  # conftest.py: TensorFlow's INFO lines from a test process landed on pytest's progress
  # line. The programs a test starts must not inherit the level: set at all, it turns
  # their own filter off (prelude.import_tensorflow).
  if prelude.LOG_LEVEL_ENV in os.environ and helpers.TESTS_ONLY_ENV not in os.environ:
    pytest.skip('%s was set before the suite started: it is the user\'s, and stays'
                % prelude.LOG_LEVEL_ENV)
  assert os.environ.get(helpers.TESTS_ONLY_ENV) == prelude.LOG_LEVEL_ENV
  assert os.environ.get(prelude.LOG_LEVEL_ENV) == '1'
  done = helpers.run([sys.executable, '-c', 'import os; print(sorted(set(os.environ) & '
                      '{%r, %r}))' % (prelude.LOG_LEVEL_ENV, helpers.TESTS_ONLY_ENV)])
  assert done.code == 0 and done.out == '[]\n', done.log()


@pytest.mark.slow
def test_trainer_at_log_level_0_shows_tensorflow_start_up_notices(tmp_path):
  # Nothing of TensorFlow's is dropped when the user asks for everything.
  done = helpers.run(['multi_gpu_train.py', '--onednn=on', '--synthetic', '--max_steps=1',
                      '--batch_size=8', '--train_dir=%s' % tmp_path],
                     env=helpers.user_env(TF_CPP_MIN_LOG_LEVEL='0'), fresh=True)
  assert done.code == 0, done.log()
  assert 'oneDNN custom operations are on' in done.err, done.log()


def test_check_python_older_than_3_11_exits_with_one_line():
  with pytest.raises(SystemExit) as e:
    prelude.check_python((3, 10, 13, 'final', 0))
  assert re.fullmatch(r'error: this project needs Python 3\.11 or newer; this is Python '
                      r'3\.10\.13 \(.*\)\. Install one, then `python -m pip install -r '
                      r'requirements.txt` with it\.', e.value.code), e.value.code
  prelude.check_python((3, 11, 0))  # returns
  prelude.check_python((4, 0, 0))


@pytest.mark.parametrize('program', PROGRAMS)
def test_program_on_python_3_10_exits_with_one_line_before_importing_tensorflow(program):
  # This Python, saying it is 3.10: the check runs before anything newer is needed.
  code = ('import runpy, sys\n'
          'sys.version_info = (3, 10, 13, "final", 0)\n'
          'sys.argv = [%r, "--helpshort"]\n'
          'try:\n'
          '  runpy.run_path(%r, run_name="__main__")\n'
          'finally:\n'
          '  print("tensorflow imported:", "tensorflow" in sys.modules)\n'
          % (program, os.path.join(helpers.ROOT, program)))
  done = helpers.run([sys.executable, '-c', code], fresh=True)  # what it imports
  assert done.code == 1 and done.out == 'tensorflow imported: False\n', done.log()
  assert done.err.startswith('error: this project needs Python 3.11 or newer; this is Python '
                             '3.10.13') and len(done.err.splitlines()) == 1, done.log()


def _python_3_10():
  path = shutil.which('python3.10')
  try:
    ok = path and subprocess.run([path, '-c', 'import sys; assert sys.version_info[:2] == '
                                  '(3, 10)'], capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    ok = False
  return path if ok else None


@pytest.mark.skipif(not _python_3_10(), reason='no python3.10 on this machine')
def test_trainer_run_by_a_real_python_3_10_exits_with_one_line():
  done = helpers.run([_python_3_10(), os.path.join(helpers.ROOT, 'multi_gpu_train.py')])
  assert done.code == 1 and len(done.err.splitlines()) == 1, done.log()
  assert done.err.startswith('error: this project needs Python 3.11 or newer'), done.log()


def test_readme_and_requirements_state_the_python_the_check_asks_for():
  wanted = 'Python %d.%d or newer' % prelude.PYTHON
  for name in ('README.md', 'requirements.txt'):
    with open(os.path.join(helpers.ROOT, name)) as f:
      assert wanted in ' '.join(f.read().split()), name


# A PID namespace of its own, whose processes all die with unshare: killed at a test's
# end, unshare alone left PID 1 and the program running.
UNSHARE = ['unshare', '--pid', '--fork', '--kill-child', '--mount-proc']
AS_PID_ONE = """
import os, signal, sys, types
sys.path.insert(0, %r)
from training import prelude, signals
# What is tested is the filter's process and PID 1's, not TensorFlow's import: as in a
# program forked from a loaded TensorFlow, the filter starts with TensorFlow in already.
sys.modules['tensorflow'] = types.ModuleType('tensorflow')
prelude.import_tensorflow(for_life=True)  # dist_train.py's filter, kept for life
os.write(2, b'the last words, with no newline')
if sys.argv[1] == 'exit_now':
  signals.exit_now(3)  # the watchdog's, a second Ctrl-C's: no Python exit
if sys.argv[1] == 'abort':
  os.abort()  # TensorFlow's end on a CPU without its instructions, or a failed check
if sys.argv[1] == 'sigterm':  # as a trainer: the signal's own exit code
  signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # from here on, not lost
  print('pid %%d, waiting for SIGTERM' %% os.getpid(), flush=True)
  signal.sigwait([signal.SIGTERM])
  sys.exit(143)
sys.exit(3)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('unshare'),
                    reason='a PID namespace of its own needs root and unshare')
@pytest.mark.parametrize('how, code', [('exit_now', 3), ('sys.exit', 3), ('abort', 128 + 6)])
def test_filter_for_life_as_pid_1_passes_a_last_partial_line_and_the_exit_code(tmp_path,
                                                                              how, code):
  """A container's first process: when PID 1 exits, the kernel kills every other process
  of its namespace, and a filter child lost a last line without its newline in 1 or 2
  of 6 runs (at abort, still after PID 1 drained it at exit). PID 1 is now the filter,
  the program its child."""
  script = tmp_path / 'as_pid_one.py'
  script.write_text(AS_PID_ONE % helpers.ROOT)
  for _ in range(3):
    done = helpers.run(UNSHARE + [sys.executable, str(script), how])
    assert done.code == code and done.err.endswith('the last words, with no newline'), (
        done.log())


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('unshare'),
                    reason='a PID namespace of its own needs root and unshare')
def test_pid_1_passes_sigterm_on_to_the_program_and_exits_with_its_code(tmp_path, tasks):
  # What `docker stop` and kubelet do: SIGTERM to the container's PID 1 alone.
  script = tmp_path / 'as_pid_one.py'
  script.write_text(AS_PID_ONE % helpers.ROOT)
  unshare = tasks(UNSHARE + [sys.executable, str(script), 'sigterm'])
  unshare.wait_for(lambda line: line == 'pid 2, waiting for SIGTERM', 'the program, pid 2')
  with open('/proc/%d/task/%d/children' % (unshare.pid, unshare.pid)) as f:
    [pid_1] = f.read().split()  # unshare's child, PID 1 inside
  # PID 1 takes the signals it passes on synchronously: waiting in sigwaitinfo, with no
  # handler. A Python handler lost one that came just before its blocking read (1 run in
  # 10 under load, prelude.serve_as_pid_1): this run alone would rarely show that.
  pid_1 = int(pid_1)
  helpers.wait_until(lambda: helpers.sleeping_in(pid_1, 'do_sigtimedwait'),
                     'PID 1 waiting for the signals it passes on', task=unshare)
  assert not helpers.signal_caught(pid_1, signal.SIGTERM)
  os.kill(pid_1, signal.SIGTERM)
  assert unshare.finish() == 143, unshare.log()
  assert unshare.err_lines[-1] == 'the last words, with no newline', unshare.log()


BROKEN_TENSORFLOW = 'raise ImportError("libcudart.so.12: cannot open shared object file")\n'


@pytest.fixture(scope='module')
def bare_pythons(tmp_path_factory):
  """{'bare': a new venv's python, no package installed; 'broken': one whose TensorFlow
  fails at import as an install without its libraries does}."""
  pythons = {}
  for name in ('bare', 'broken'):
    venv = tmp_path_factory.mktemp(name)
    made = helpers.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)])
    assert made.code == 0, made.log()
    pythons[name] = str(venv / 'bin' / 'python')
  site = subprocess.run([pythons['broken'], '-c', 'import sysconfig; '
                         'print(sysconfig.get_paths()["purelib"])'],
                        capture_output=True, text=True, check=True).stdout.strip()
  os.makedirs(os.path.join(site, 'tensorflow'))
  with open(os.path.join(site, 'tensorflow', '__init__.py'), 'w') as f:
    f.write(BROKEN_TENSORFLOW)
  return pythons


@pytest.mark.parametrize('python', ['bare', 'broken'])
@pytest.mark.parametrize('program', PROGRAMS + ['classify.py', '-m benchmarks'])
def test_program_on_python_without_tensorflow_exits_with_one_line_naming_it_and_the_fix(
    bare_pythons, python, program):
  interpreter = bare_pythons[python]
  argv = program.split() if program.startswith('-m') else [os.path.join(helpers.ROOT, program)]
  done = helpers.run([interpreter] + argv)
  assert done.code == 1 and done.out == '' and len(done.err.splitlines()) == 1, done.log()
  package = 'numpy' if program == '-m benchmarks' else 'tensorflow'  # numpy: neither has it
  assert done.err.startswith('error: %s cannot import %s (' % (interpreter, package)), done.log()
  if program != 'classify.py':  # it needs TensorFlow alone, and says so
    assert done.err.endswith(' Install the requirements into this Python: %s -m pip install '
                             '-r %s\n' % (interpreter, prelude.REQUIREMENTS)), done.log()
  if python == 'broken' and program != '-m benchmarks':
    assert 'libcudart.so.12: cannot open shared object file' in done.err, done.log()


def test_help_on_python_without_absl_exits_with_one_line(bare_pythons):
  done = helpers.run([bare_pythons['bare'], os.path.join(helpers.ROOT, 'multi_gpu_train.py'),
                      '--help'])
  assert done.code == 1 and len(done.err.splitlines()) == 1, done.log()
  assert done.err.startswith('error: %s cannot import absl (' % bare_pythons['bare']), done.log()
