"""What several test files share: running the programs, and reading what they print and write.

One runner for programs that run to the end (`run`), one for programs watched line by
line while they run (`Task`), one set of log-line patterns, one checkpoint reader,
one event-file reader. A failed check on a subprocess names a file holding its whole
log (`Run.log()`, `Task.log()`), not just the tail that fits in the message.

Programs run with the environment a user's shell gives them: nothing here quiets
TensorFlow or hides a GPU unless a test asks for it.
"""
import collections
import contextlib
import fcntl
import glob
import itertools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bounds on waits that end long before them on a healthy run, loaded or not: a run
# that reaches one has hung. pytest-timeout (pytest.ini) bounds each test as a whole.
RUN_TIMEOUT_SECS = 300   # one program, start to end
WAIT_SECS = 180          # one awaited line of a running program
LOG_DIR = None           # where whole logs go; conftest.py sets it for the session
TAIL_LINES = 40

# ---- The lines the programs print ---------------------------------------------------
_STAMP = r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}'
_LOSS = (_STAMP + r': step (\d+), loss = \d+\.\d\d \(\d+\.\d examples/sec; '
         r'\d+\.\d{3} sec/batch\)')
LOSS_LINE = re.compile('^' + _LOSS + '$')                          # multi_gpu_train.py
WORKER_LOSS_LINE = re.compile('^' + _LOSS + r' \[worker (\d+), local step (\d+)\]$')
DONE_LINE = re.compile(r'^worker (\d+) done: (\d+) local steps, global step (\d+)$')
SAVED_LINE = re.compile(r'^Saved checkpoint .*model\.ckpt-(\d+)$')
RESUMING_LINE = re.compile(r'^Resuming from .*model\.ckpt-(\d+) at step (\d+)$')
STOPPED_LINE = re.compile(r'^Stopped by (Ctrl-C|SIGTERM) at step (\d+); rerun the same '
                          r'command to resume\.$')
SKIP_LINE = re.compile(r'^\S+ \S+: step (\d+) skipped: gradients overflowed at loss scale '
                       r'(\S+); scale now (\S+)$')
PRECISION_LINE = re.compile(
    '^' + _STAMP + r': precision @ 1 = (\d\.\d{3}) \(global step (\d+), (\d+) test records, '
    r'(moving averages|raw weights), cross-entropy (\S+)\)$')
TASK_PREFIX = re.compile(r'^\[(ps\d+|worker\d+)\] (.*)$')         # --local_cluster's relay
TRAINING_FROM = re.compile(r'^worker (\d+): training from global step (\d+)')


def matches(pattern, lines):
  """The match objects of pattern over lines, in order."""
  return [m for m in map(pattern.match, lines) if m]


def steps(pattern, lines):
  """The step numbers (group 1) of the lines that match pattern."""
  return [int(m.group(1)) for m in matches(pattern, lines)]


def examples_per_sec(pattern, lines):
  """The examples/sec of the loss lines (LOSS_LINE, WORKER_LOSS_LINE) among lines."""
  return [float(re.search(r'\((\d+\.\d) examples/sec;', m.group(0)).group(1))
          for m in matches(pattern, lines)]


def listed_flags(help_text):
  """The flag names a program's --help or --helpshort output lists."""
  return set(re.findall(r'^  --(?:\[no\])?(\w+)', help_text, re.M))


def sample_commands(printed):
  """The command lines a sample writer's hint prints (`  python prog.py --flag=value ...`),
  as (program, {flag: value}) in order."""
  commands = []
  for line in printed.splitlines():
    words = line.split()
    if line.startswith('  python ') and len(words) > 1:
      commands.append((words[1], dict(w[2:].split('=', 1) for w in words[2:]
                                      if w.startswith('--') and '=' in w)))
  return commands


def assert_each_training_evaluated_into_its_own_eval_dir(printed, eval_program):
  """Every trainer command printed is followed by an eval_program command that reads its
  --train_dir, and no two evaluations write to one --eval_dir."""
  commands = sample_commands(printed)
  train_dirs = [f['train_dir'] for prog, f in commands if 'train_dir' in f]
  evals = [f for prog, f in commands if prog == eval_program]
  assert len(train_dirs) == 2, printed
  assert [f.get('checkpoint_dir') for f in evals] == train_dirs, printed
  eval_dirs = [f.get('eval_dir') for f in evals]
  assert None not in eval_dirs and len(set(eval_dirs)) == len(eval_dirs), printed


def by_task(lines):
  """{'ps0': [its lines], 'worker0': [...]} from a --local_cluster launcher's output."""
  found = collections.defaultdict(list)
  for m in matches(TASK_PREFIX, lines):
    found[m.group(1)].append(m.group(2))
  return dict(found)


# ---- Whole logs, kept for a failure's message -----------------------------------------
_log_numbers = itertools.count()


def write_log(argv, code, text):
  """Writes a process's whole log to a file; returns a message naming it, with its tail."""
  global LOG_DIR
  if LOG_DIR is None:  # outside pytest (helpers used from a shell): this process's own
    LOG_DIR = tempfile.mkdtemp(prefix='cifar10_test_logs-')
  os.makedirs(LOG_DIR, exist_ok=True)  # the session's, made on the first failure
  name = os.path.basename(next((a for a in argv if a.endswith('.py')), argv[0]))
  path = os.path.join(LOG_DIR, '%03d-%s.log' % (next(_log_numbers), name))
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

def user_env(**changes):
  """This process's environment as a user's shell has it, with changes (None removes)."""
  env = dict(os.environ)
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


def run(argv, timeout=RUN_TIMEOUT_SECS, env=None, cwd=ROOT, **kwargs):
  """Runs argv to the end; a script name first runs it with this Python. Returns a Run."""
  if argv[0].endswith('.py'):
    argv = [sys.executable, os.path.join(ROOT, argv[0])] + list(argv[1:])
  try:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=user_env() if env is None else env, cwd=cwd, **kwargs)
  except subprocess.TimeoutExpired as e:
    text = 'stdout:\n%s\nstderr:\n%s' % (_text(e.stdout), _text(e.stderr))
    raise AssertionError('still running after %d s: %s' % (
        timeout, write_log(argv, 'a kill', text))) from None
  return Run(argv, done.returncode, done.stdout, done.stderr)


def _text(data):
  return data.decode(errors='replace') if isinstance(data, bytes) else (data or '')


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

  def __init__(self, argv, env=None, cwd=ROOT):
    if argv[0].endswith('.py'):
      argv = self.python_argv(argv[0]) + list(argv[1:])
    self.argv = argv
    self.process = subprocess.Popen(argv, cwd=cwd, env=user_env() if env is None else env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, bufsize=1, start_new_session=True)
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
  """A generator for fixtures: yields start(argv, env=None) -> Task, then kills them all."""
  started = []

  def start(argv, env=None):
    started.append(Task(argv, env))
    return started[-1]
  yield start
  for task in started:
    task.kill()


def trainer_settings(train_dir, data_dir, **given):
  """A training.settings.Settings as multi_gpu_train.py's flags give it: its training
  knobs (those of --dataset, given or cifar10), but for the arguments given."""
  import multi_gpu_train
  from training.settings import Settings
  per_dataset = multi_gpu_train.DATASET_DEFAULTS[given.get('dataset', 'cifar10')]
  knobs = dict(num_gpus=multi_gpu_train.NUM_GPUS, batch_size=per_dataset['batch_size'],
               max_steps=per_dataset['max_steps'], log_frequency=multi_gpu_train.LOG_FREQUENCY,
               summary_steps=multi_gpu_train.SUMMARY_STEPS,
               save_every_n_steps=multi_gpu_train.SAVE_EVERY_N_STEPS)
  return Settings(str(train_dir), data_dir, **dict(knobs, **given))


def tasks_of(launcher_pid):
  """{PID: command-line words} of the live processes a --local_cluster launcher started.

  A task's own child (prelude's stderr filter) is not a task while its parent lives;
  left behind by it, it counts, as anything of a task's left running does.
  """
  from distributed import local_cluster
  marker = ('%s=%d' % (local_cluster.DIE_WITH_LAUNCHER_ENV, launcher_pid)).encode()
  marked = {}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open('/proc/%s/environ' % pid, 'rb') as f:
        if marker not in f.read().split(b'\0'):
          continue
      with open('/proc/%s/stat' % pid, 'rb') as f:
        parent = int(f.read().rpartition(b')')[2].split()[1])
      with open('/proc/%s/cmdline' % pid, 'rb') as f:
        marked[int(pid)] = parent, f.read().decode(errors='replace').split('\0')
    except OSError:  # gone meanwhile
      pass
  return {pid: words for pid, (parent, words) in marked.items() if parent not in marked}


def task_pid(launcher_pid, job_name, task_index):
  """The PID of one task a --local_cluster launcher started (AssertionError if none)."""
  wanted = {'--job_name=%s' % job_name, '--task_index=%d' % task_index}
  pids = [pid for pid, words in tasks_of(launcher_pid).items() if wanted <= set(words)]
  assert len(pids) == 1, (job_name, task_index, tasks_of(launcher_pid))
  return pids[0]


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


def run_local_cluster(start, num_ps, num_workers, train_dir, *flags):
  """Runs dist_train.py --local_cluster to the end; returns {task: [its lines]}."""
  launcher = local_cluster_task(start, num_ps, num_workers, train_dir, *flags)
  assert launcher.finish() == 0, launcher.log()
  return by_task(launcher.lines)


# ---- What the programs write --------------------------------------------------------------

def checkpoint(path):
  """{variable name: value} of a checkpoint, or of the latest one in a directory."""
  import tensorflow as tf
  reader = tf.train.load_checkpoint(str(path))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def global_step(path):
  """The global step stored in a checkpoint, or in the latest one of a directory."""
  import tensorflow as tf
  return int(tf.train.load_checkpoint(str(path)).get_tensor('global_step'))


def copy_checkpoint(checkpoint_path, train_dir):
  """Copies one checkpoint into a new train_dir, as its only (latest) one."""
  os.makedirs(train_dir)
  for path in glob.glob(str(checkpoint_path) + '.*'):
    shutil.copy(path, train_dir)
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % os.path.basename(str(checkpoint_path)))


def event_files(directory):
  return sorted(glob.glob(os.path.join(str(directory), 'events.out.tfevents.*')))


def scalars_per_file(directory, tag):
  """[{step: value} of tag, one dict per event file in name order], as TensorBoard reads them."""
  from tensorboard.backend.event_processing import event_accumulator
  found = []
  for path in event_files(directory):
    events = event_accumulator.EventAccumulator(path, size_guidance={'scalars': 0})
    events.Reload()
    found.append({e.step: e.value for e in events.Scalars(tag)}
                 if tag in events.Tags()['scalars'] else {})
  return found


def scalars(directory, tag):
  """{step: value} of tag over every event file of the directory."""
  merged = {}
  for values in scalars_per_file(directory, tag):
    merged.update(values)
  return merged


def summary_tags(directory):
  """Every tag of every summary value in the directory's event files."""
  import tensorflow as tf
  return {value.tag for path in event_files(directory)
          for event in tf.compat.v1.train.summary_iterator(path)
          for value in event.summary.value}


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


# ---- Data sets, from the product's own sample writers -----------------------------------

class Sample(collections.namedtuple('Sample', ['dir', 'md5'])):
  """A data set from cifar10_input.write_sample: its directory and its archive's md5."""

  @property
  def flags(self):
    return ['--data_dir=%s' % self.dir, '--data_md5=%s' % self.md5]


def write_sample(path, records_per_file):
  """A CIFAR-10 sample in the real binary layout, in path; returns its Sample."""
  import cifar10_input  # imports TensorFlow: only once a test asks for data
  return Sample(str(path), cifar10_input.write_sample(str(path), records_per_file))


# ---- Files and their modes ---------------------------------------------------------------

@contextlib.contextmanager
def umask(mask):
  """Runs the block under this umask, then restores the one before."""
  before = os.umask(mask)
  try:
    yield
  finally:
    os.umask(before)


def modes(root):
  """{path relative to root: permission bits} of every file and directory under root."""
  found = {}
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(directory, name)
      found[os.path.relpath(path, root)] = os.stat(path).st_mode & 0o777
  return found


# ---- One synchronous step of the trainer's own graph, in this process -------------------

def one_train_step(num_towers, images, labels, start_values=None, model=None):
  """Builds multi_gpu_train's graph over num_towers virtual CPUs and runs one step.

  images, labels: the global batch (numpy), split evenly over the towers in order.
  start_values: {variable name: value} to start from instead of fresh initial values.
  model: the model package (default cifar10).

  Returns:
    ({name: value} of every global variable before the step, and after it).
  """
  import tensorflow as tf
  import cifar10
  import multi_gpu_train
  from training import placement
  model = model or cifar10
  per_tower = len(images) // num_towers
  slices = iter([(images[i * per_tower:(i + 1) * per_tower],
                  labels[i * per_tower:(i + 1) * per_tower]) for i in range(num_towers)])
  with tf.Graph().as_default():
    graph = multi_gpu_train.build(
        lambda: tuple(map(tf.constant, next(slices))),
        ['/cpu:%d' % i for i in range(num_towers)], per_tower,
        model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, model=model, summaries=False)
    variables = tf.compat.v1.global_variables()
    start = [v.assign(start_values[v.op.name]) for v in variables] if start_values else []
    config = placement.session_config(num_cpu_devices=num_towers)
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(start)
      before = dict(zip([v.op.name for v in variables], sess.run(variables)))
      sess.run(graph.train_op)
      after = dict(zip([v.op.name for v in variables], sess.run(variables)))
  return before, after


def bfloat16_units():
  """training.machine.bfloat16_units_here(1): where it is not ok, --use_bf16 is
  refused and the tests that train in bfloat16 are skipped, saying why."""
  from training import machine
  return machine.bfloat16_units_here(1)


# ---- A server on 127.0.0.1, for the download tests ---------------------------------------

@contextlib.contextmanager
def serve(directory):
  """An HTTP server on 127.0.0.1 serving directory's files; yields its base URL."""
  import functools
  import http.server

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass
  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(Quiet, directory=str(directory)))
  with _served(server) as url:
    yield url


@contextlib.contextmanager
def serve_stream(headers, chunks):
  """A hostile HTTP server on 127.0.0.1: every GET gets status 200, `headers` (a dict;
  no Content-Length unless given) and then each bytes object of `chunks()`, an
  iterable that may sleep between them; the connection closes when it ends or when
  the block does. Yields the base URL."""
  import http.server
  done = threading.Event()

  class Hostile(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
      self.send_response(200)
      for name, value in headers.items():
        self.send_header(name, value)
      self.end_headers()
      try:
        for chunk in chunks():
          if done.is_set():
            return
          self.wfile.write(chunk)
          self.wfile.flush()
      except OSError:  # the client went away
        pass

    def log_message(self, *args):
      pass
  with _served(http.server.ThreadingHTTPServer(('127.0.0.1', 0), Hostile), done.set) as url:
    yield url


@contextlib.contextmanager
def _served(server, on_close=lambda: None):
  """Serves on a daemon thread; yields the base URL; on_close(), then stops it."""
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield 'http://127.0.0.1:%d/' % server.server_address[1]
  finally:
    on_close()
    server.shutdown()
    server.server_close()


def drip(byte_every_secs, most_bytes):
  """chunks for serve_stream: one byte every byte_every_secs, at most most_bytes."""
  def chunks():
    for _ in range(most_bytes):
      time.sleep(byte_every_secs)
      yield b'x'
  return chunks


def tree(root):
  """The paths of every file under root, relative to it, sorted."""
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(str(root)) for f in files)


def scalar_steps_per_file(directory, tag):
  """[[the step of every event of tag, in order, repeats kept], one list per event file].

  scalars_per_file's dicts keep one value per step; this shows a step written twice.
  """
  from tensorboard.backend.event_processing import event_accumulator
  found = []
  for path in event_files(directory):
    events = event_accumulator.EventAccumulator(path, size_guidance={'scalars': 0})
    events.Reload()
    found.append([e.step for e in events.Scalars(tag)]
                 if tag in events.Tags()['scalars'] else [])
  return found


# ---- Hostile files a user can leave where a program reads -------------------------------

HOSTILE_FILES = ['fifo', 'dev_zero', 'sparse_3gb']


def make_hostile(path, kind):
  """Puts at path a FIFO (a read waits forever), a link to /dev/zero (never ends) or a
  sparse 3 GB file (no disk used; read whole, it fills the memory)."""
  path = str(path)
  if kind == 'fifo':
    os.mkfifo(path)
  elif kind == 'dev_zero':
    os.symlink('/dev/zero', path)
  else:
    with open(path, 'wb') as f:
      f.truncate(3 << 30)


def returns_within(secs, function, *args, unblock=None):
  """function(*args)'s result or exception, or an AssertionError when it has not returned
  within secs (then unblock(), if given, frees the thread: opens a FIFO's other end)."""
  outcome = []

  def call():
    try:
      outcome.append(('value', function(*args)))
    except BaseException as e:  # noqa: B902 -- handed to the caller
      outcome.append(('raised', e))
  thread = threading.Thread(target=call, daemon=True)
  thread.start()
  thread.join(secs)
  if thread.is_alive():
    if unblock:
      unblock()
    raise AssertionError('%s has not returned within %d s' % (function.__name__, secs))
  kind, value = outcome[0]
  if kind == 'raised':
    raise value
  return value


def unblock_fifo(path):
  """A writer for the FIFO at path, at once closed: its reader sees the end."""
  def unblock():
    with contextlib.suppress(OSError):
      os.close(os.open(str(path), os.O_WRONLY | os.O_NONBLOCK))
  return unblock


# ---- Running processes, as Linux's /proc shows them ---------------------------------------

def send_and_mark(task, signum, text):
  """Sends signum to a task, then writes the line `text` into the task's own stdout pipe.

  The line lands behind all the task wrote before the signal was sent, so its place
  in task.out_lines splits the output in two: before the signal, and after it.
  """
  with open('/proc/%d/fd/1' % task.pid, 'w') as pipe:  # open even if the task exits at once
    task.send(signum)
    pipe.write(text + '\n')


def process_state(pid):
  """The state letter of a process: R running, S sleeping, T stopped (SIGSTOP), Z exited."""
  with open('/proc/%d/stat' % pid) as f:
    return f.read().rsplit(')', 1)[1].split()[0]


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


def trainer_flags(*argv):
  """multi_gpu_train.py's flags parsed from argv, on flags of their own (not absl's
  global FLAGS), the data set's defaults applied: what check_trainer_flags reads."""
  from absl import flags
  import multi_gpu_train
  from training import settings
  flag_values = flags.FlagValues()
  settings.define_trainer_flags(multi_gpu_train.DATASET_DEFAULTS, 1, 10, 100, 1000,
                                flag_values=flag_values)
  flag_values(['multi_gpu_train.py', *argv])
  settings.apply_dataset_defaults(flag_values, multi_gpu_train.DATASET_DEFAULTS)
  return flag_values


def assert_each_refused_in_one_line(runs, refused):
  """Each run (a Task) of a program given refused[i] = (flags, pattern) exits 1 with
  one error line matching pattern, no traceback and nothing on stdout."""
  for run, (flags, expected) in zip(runs, refused):
    assert run.finish() == 1, (flags, run.log())
    errors = [line for line in run.err_lines if line.startswith('error')]
    assert len(errors) == 1 and re.search(expected, errors[0]), (flags, run.log())
    assert 'Traceback' not in run.err and run.out == '', (flags, run.log())
