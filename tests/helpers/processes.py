"""Running the programs: to the end (`run`, a Run), or watched line by line (`Task`).

A failed check on a subprocess names a file holding its whole log (`Run.log()`,
`Task.log()`), not just the tail that fits in the message. Programs run with the
environment a user's shell gives them: nothing here quiets TensorFlow or hides a GPU
unless a test asks for it. Running processes are read as Linux's /proc shows them.
"""
import collections
import contextlib
import fcntl
import itertools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

from helpers import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Bounds on waits that end long before them on a healthy run, loaded or not: a run
# that reaches one has hung. pytest-timeout (pytest.ini) bounds each test as a whole.
RUN_TIMEOUT_SECS = 300   # one program, start to end
WAIT_SECS = 180          # one awaited line of a running program
LOG_DIR = None           # where whole logs go; conftest.py sets it for the session
TAIL_LINES = 40


# ---- Whole logs, kept for a failure's message -----------------------------------------
_log_numbers = itertools.count()


def _log_path(name):
  """A new file's path in the session's log directory, made on first use."""
  global LOG_DIR
  if LOG_DIR is None:  # outside pytest (helpers used from a shell): this process's own
    LOG_DIR = tempfile.mkdtemp(prefix='cifar10_test_logs-')
  os.makedirs(LOG_DIR, exist_ok=True)
  return os.path.join(LOG_DIR, '%03d-%s.log' % (next(_log_numbers), name))


def write_log(argv, code, text):
  """Writes a process's whole log to a file; returns a message naming it, with its tail."""
  name = os.path.basename(next((a for a in argv if a.endswith('.py')), argv[0]))
  path = _log_path(name)
  with open(path, 'w') as f:
    f.write('$ %s\nexit code %s\n\n%s\n' % (' '.join(map(str, argv)), code, text))
  tail = '\n'.join(text.splitlines()[-TAIL_LINES:])
  return '%s exited with %s; whole log: %s; it ends:\n%s' % (name, code, path, tail)


# ---- Setups shared by the whole run ----------------------------------------------------

def once_per_run(tmp_path_factory, name, setup):
  """setup(directory)'s result, computed once per pytest run, whatever its processes.

  The first xdist process to ask runs setup under a file lock in a directory of this
  run shared by all its processes; the others wait for the lock and read the result
  (JSON) it left. A setup that failed fails each asker with its message, which names the
  log holding the output (write_log), rather than running again.
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):  # each worker's is a subdirectory of the run's
    root = root.parent
  directory = root / name
  directory.mkdir(exist_ok=True)
  result, failure = directory / 'result.json', directory / 'failure.txt'
  with open(directory / 'lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not result.exists() and not failure.exists():
      try:
        result.write_text(json.dumps(setup(directory)))
      except BaseException as e:
        failure.write_text('%s: %s' % (name, e))
        raise
  if failure.exists():
    raise AssertionError('set up once for the whole run, and failed: %s'
                         % failure.read_text())
  return json.loads(result.read_text())


# ---- Programs that run to the end -------------------------------------------------------

# conftest.py sets TensorFlow's C++ log level (prelude.LOG_LEVEL_ENV) for the test
# processes alone, and names it in TESTS_ONLY_ENV, which xdist's processes inherit with it.
TESTS_ONLY_ENV = 'CIFAR10_TESTS_ONLY'


def user_env(**changes):
  """This process's environment as a user's shell has it, with changes (None removes)."""
  tests_only = set(os.environ.get(TESTS_ONLY_ENV, '').split(',')) | {TESTS_ONLY_ENV}
  env = {name: value for name, value in os.environ.items() if name not in tests_only}
  for name, value in changes.items():
    if value is None:
      env.pop(name, None)
    else:
      env[name] = value
  return env


class Run(collections.namedtuple('Run', ['argv', 'code', 'out', 'err'])):
  """A program that ran to the end: its argv, exit code, stdout and stderr."""

  def log(self):
    """Writes the whole output to a file; returns a failure message naming it."""
    return write_log(self.argv, self.code, 'stdout:\n%s\nstderr:\n%s' % (self.out, self.err))

  @property
  def errors(self):
    """The `error: ...` lines of stderr."""
    return [line for line in self.err.splitlines() if line.startswith('error')]


def run(argv, timeout=RUN_TIMEOUT_SECS, env=None, cwd=ROOT, file_size_limit=None,
        fresh=False):
  """Runs argv to the end; a script name first runs it with this Python. Returns a Run.

  file_size_limit: the program can write no file past this many bytes (RLIMIT_FSIZE).
  fresh: in a new interpreter, not forked (start()).
  """
  if argv[0].endswith('.py'):
    argv = [sys.executable, os.path.join(ROOT, argv[0])] + list(argv[1:])
  process = start(argv, env, cwd, file_size_limit=file_size_limit, fresh=fresh)
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    out, err = process.communicate()
    text = 'stdout:\n%s\nstderr:\n%s' % (out, err)
    raise AssertionError('still running after %d s: %s' % (
        timeout, write_log(argv, 'a kill', text))) from None
  return Run(argv, process.returncode, out, err)


# ---- Starting them: forked from an imported TensorFlow, or fresh ------------------------
# How many of each this test process started (conftest.py sums them over the suite).
STARTS = collections.Counter()
_servers = {}  # import environment (JSON) -> forkserver.Server; one, in practice


def start(argv, env=None, cwd=ROOT, new_session=False, file_size_limit=None, fresh=False):
  """Starts argv with its stdout and stderr piped (text); returns a Popen or a Forked.

  A project script run with this Python is forked from a server that has imported
  TensorFlow (forkserver.py), unless fresh=True or its import-time environment differs
  from this process's own: then, and for anything else, a fresh process. Under
  `nsenter --net=PATH --` (benchmarks/netlab.py's hosts), the forked program joins that namespace.
  """
  env = user_env() if env is None else env
  # A --local_cluster launcher forks its tasks (local_cluster.start_tasks).
  STARTS['launchers'] += any(str(arg).startswith('--local_cluster=') for arg in argv)
  netns, program = forkserver.netns_of(argv)
  script, _ = forkserver.script_of(program)
  if script and not fresh:
    wanted = forkserver.import_environment(program, env)
    if wanted == forkserver.import_environment(program, user_env()):
      STARTS['forked runs'] += 1
      return forkserver.Forked(_server(wanted), program, env, cwd, new_session,
                               file_size_limit, netns)
  if sys.executable in argv:  # this Python, itself or under a wrapper (prlimit)
    STARTS['fresh interpreters'] += 1
  preexec = file_size_limit and (lambda: resource.setrlimit(
      resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit)))
  return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, bufsize=1,
                          start_new_session=new_session, preexec_fn=preexec or None)


def server_import_secs():
  """The CPU seconds each fork server of this process took to start and import TensorFlow
  (forkserver.IMPORTED_LINE): how fast the host ran while the suite did."""
  return [secs for secs in (s.import_cpu_secs() for s in _servers.values()) if secs]


def _server(environment):
  key = json.dumps(environment)
  if key not in _servers:
    STARTS['fork servers'] += 1
    _servers[key] = forkserver.Server(dict(user_env(), **environment), _log_path('forkserver'))
  return _servers[key]


def trainer_argv(sample, train_dir, *extra):
  """multi_gpu_train.py's command line on a Sample: 8 images and a loss line a step, no
  summaries. Run by this Python without -u: the trainer flushes its lines itself."""
  return [sys.executable, os.path.join(ROOT, 'multi_gpu_train.py'), '--batch_size=8',
          '--summary_steps=0', '--log_frequency=1', '--train_dir=%s' % train_dir
          ] + sample.flags + list(extra)


def run_eval_once(sample, checkpoint_dir, eval_dir):
  """Runs cifar10_eval.py --run_once on a Sample to the end; returns its Run."""
  return run(['cifar10_eval.py', '--run_once', '--checkpoint_dir=%s' % checkpoint_dir,
              '--eval_dir=%s' % eval_dir] + sample.flags)


# ---- Programs watched while they run -----------------------------------------------------

class Task:
  """One running process in a session of its own; its lines read as they come.

  `lines` holds stdout and stderr merged in the order they arrived (`arrived`: when,
  by time.time()); `out` and `err` each stream alone. Signals go to the process (`send`), `kill` takes its whole
  process group (a launcher's tasks too).
  """

  @staticmethod
  def python_argv(script):
    """The argv that runs one of the project's scripts unbuffered with this Python."""
    return [sys.executable, '-u', os.path.join(ROOT, script)]

  def __init__(self, argv, env=None, cwd=ROOT, fresh=False):
    if argv[0].endswith('.py'):
      argv = self.python_argv(argv[0]) + list(argv[1:])
    self.argv = argv
    self.process = start(argv, env, cwd, new_session=True, fresh=fresh)
    self.lines, self.arrived, self.out_lines, self.err_lines = [], [], [], []
    self._changed = threading.Condition()
    self._readers = [threading.Thread(target=self._read, args=(pipe, own), daemon=True)
                     for pipe, own in ((self.process.stdout, self.out_lines),
                                       (self.process.stderr, self.err_lines))]
    for reader in self._readers:
      reader.start()

  @property
  def pid(self):
    return self.process.pid

  @property
  def out(self):
    with self._changed:
      return ''.join(line + '\n' for line in self.out_lines)

  @property
  def err(self):
    with self._changed:
      return ''.join(line + '\n' for line in self.err_lines)

  @property
  def text(self):
    with self._changed:
      return '\n'.join(self.lines)

  def _read(self, pipe, own):
    for line in pipe:
      with self._changed:
        own.append(line.rstrip('\n'))
        self.lines.append(own[-1])
        self.arrived.append(time.time())
        self._changed.notify_all()
    with self._changed:
      self._changed.notify_all()

  def _reading(self):
    return any(reader.is_alive() for reader in self._readers)

  def wait_for(self, condition, what, start=0, timeout=WAIT_SECS):
    """Returns the first truthy condition(line) over lines[start:], as they come.

    condition: a function of one line, or a compiled pattern (its match).
    """
    if hasattr(condition, 'match'):
      condition = condition.match
    deadline = time.time() + timeout
    with self._changed:
      while True:
        for line in self.lines[start:]:
          found = condition(line)
          if found:
            return found
        start = len(self.lines)
        if not self._reading() or time.time() > deadline:
          raise AssertionError('no %s within %d s: %s' % (what, timeout, self.log()))
        self._changed.wait(0.5)

  def finish(self, timeout=RUN_TIMEOUT_SECS):
    """Waits for the exit; returns its exit code (the output is in lines, out, err)."""
    try:
      code = self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise AssertionError('still running after %d s: %s' % (timeout, self.log())) from None
    for reader in self._readers:
      reader.join(30)
    return code

  def send(self, signum):
    """Sends signum to the process (SIGSTOP pauses it, SIGCONT resumes it)."""
    os.kill(self.process.pid, signum)

  def kill(self):
    """Kills its process group, if anything is left of it, and reaps the process."""
    try:
      os.killpg(self.process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.process.wait()

  def log(self):
    """Writes every line so far to a file; returns a failure message naming it."""
    return write_log(self.argv, self.process.poll(), self.text)


def started_tasks():
  """A generator for fixtures: yields start(argv, env=None, fresh=False) -> Task, then
  kills them all."""
  started = []

  def start(argv, env=None, fresh=False):
    started.append(Task(argv, env, fresh=fresh))
    return started[-1]
  yield start
  for task in started:
    task.kill()


# ---- Running processes, as Linux's /proc shows them ---------------------------------------

def send_and_mark(task, signum, text):
  """Sends signum to a task, then writes the line `text` into the task's own stdout pipe.

  The line lands behind all the task wrote before the signal was sent, so its place
  in task.out_lines splits the output in two: before the signal, and after it
  (split_at_mark).
  """
  with open('/proc/%d/fd/1' % task.pid, 'w') as pipe:  # open even if the task exits at once
    task.send(signum)
    pipe.write(text + '\n')  # one write: it cannot be cut by the task's


def split_at_mark(lines, text):
  """(the lines before send_and_mark's line `text`, the lines after it).

  The mark may land inside a line of the task's: unbuffered (PYTHONUNBUFFERED=1, or
  -u), print() writes its text and its newline in two writes, and the mark can come
  between them ('step 3, loss = 4.66-- mark --', then the rest, '' or more). That
  line was begun before the mark: it is put back together, before it.
  """
  marked = [i for i, line in enumerate(lines) if line.endswith(text)]
  assert marked, 'the mark %r is not in the lines' % text
  at = marked[0]
  begun = lines[at][:-len(text)]
  if not begun:
    return lines[:at], lines[at + 1:]
  rest = lines[at + 1:at + 2] or ['']  # none: the task ended before its newline
  return lines[:at] + [begun + rest[0]], lines[at + 2:]


def process_state(pid):
  """The state letter of a process: R running, S sleeping, T stopped (SIGSTOP), Z exited."""
  with open('/proc/%d/stat' % pid) as f:
    return f.read().rsplit(')', 1)[1].split()[0]


def sleeping_in(pid, kernel_function):
  """True while a thread of the process sleeps in kernel_function (its wchan, without
  the compiler's suffix: do_sigtimedwait.isra.0): a FIFO's open waiting for its other end
  sleeps in wait_for_partner."""
  for tid in os.listdir('/proc/%d/task' % pid):
    with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
      with open('/proc/%d/task/%s/wchan' % (pid, tid)) as f:
        if f.read().partition('.')[0] == kernel_function:
          return True
  return False


def signal_pending(pid, signum):
  """True while signum, sent to the process (not one thread), waits to be delivered."""
  with open('/proc/%d/status' % pid) as f:
    mask = next(int(line.split()[1], 16) for line in f if line.startswith('ShdPnd:'))
  return bool(mask >> (signum - 1) & 1)


def signal_caught(pid, signum):
  """True once the process has a handler of its own for signum (not the default action)."""
  with open('/proc/%d/status' % pid) as f:
    mask = next(int(line.split()[1], 16) for line in f if line.startswith('SigCgt:'))
  return bool(mask >> (signum - 1) & 1)


def wait_until(condition, what, task=None, timeout=WAIT_SECS):
  """Polls condition() until it is true; fails at once, with the log, if the task exits."""
  deadline = time.time() + timeout
  while not condition():
    if (task and task.process.poll() is not None) or time.time() > deadline:
      raise AssertionError('no %s within %d s%s' % (what, timeout,
                                                     ': ' + task.log() if task else ''))
    time.sleep(0.001)


def tasks_of(launcher_pid):
  """{PID: task name} of the live processes a --local_cluster launcher started: in its
  session (the tests start it in one of its own), named for their task (ps0, worker1:
  the launcher names the tasks it forks). A task's own child (prelude's stderr filter)
  has its name too: not a task while its parent lives; left behind by it, it counts, as
  anything of a task's left running does.
  """
  named = {}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open('/proc/%s/stat' % pid, 'rb') as f:
        stat = f.read()
    except OSError:  # gone meanwhile
      continue
    name = stat[stat.index(b'(') + 1:stat.rindex(b')')].decode(errors='replace')
    state, parent, _, session = stat[stat.rindex(b')') + 2:].split()[:4]
    if (int(session) == launcher_pid and re.match(r'^(ps|worker)\d+$', name)
        and state not in (b'Z', b'X')):  # a zombie has ended: its reaper has yet to see
      named[int(pid)] = int(parent), name
  return {pid: name for pid, (parent, name) in named.items() if parent not in named}


def pid_file_alive(pid_file):
  """Whether the process a daemon's pid file names is running (a daemon the tests may
  start, and then stop only if it was not running before)."""
  try:
    with open(pid_file) as f:
      os.kill(int(f.read()), 0)
    return True
  except (OSError, ValueError):
    return False


def task_pid(launcher_pid, job_name, task_index):
  """The PID of one task a --local_cluster launcher started (AssertionError if none)."""
  pids = [pid for pid, name in tasks_of(launcher_pid).items()
          if name == '%s%d' % (job_name, task_index)]
  assert len(pids) == 1, (job_name, task_index, tasks_of(launcher_pid))
  return pids[0]
