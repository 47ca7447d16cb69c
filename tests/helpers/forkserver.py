"""The programs the tests run, started from an imported TensorFlow: a fork server.

A program spends seconds of CPU importing TensorFlow before its first line (figures:
docs/tests.md), and the suite runs a few hundred of them. So, as TensorFlow's own
multi-process tests do (a forkserver whose preload imports TensorFlow), a server
process imports tensorflow, numpy and absl once, and forks each program from there:

    server (python forkserver.py SOCKET): single-threaded, no session or server made
      -> fork -> the child takes the request's standard streams (stdin /dev/null),
                 session and file-size limit, then becomes the script as
                 training/forked_run.py does it (--local_cluster's tasks are forked so).

A child is a real process: its own pid, signalled and killed like any other (in a
session of its own when asked), its exit status read by the server, its parent, and
passed back as Popen gives it (143 for an exit of its own, -9 for a SIGKILL). `Forked`
is the client's handle, with as much of Popen's interface as the tests use.

Fresh interpreters stay where what a test checks happens before or while TensorFlow
loads (processes.start says which): a run whose variables read at import (oneDNN's
choice, TF_CPP_MIN_LOG_LEVEL, PYTHONPATH, ...) differ from the server's
(import_environment), anything but a script or `python -c`, and the runs whose tests
ask for fresh ones, as what they check happens as TensorFlow loads: test_prelude.py's and
test_onednn.py's (the lines TensorFlow prints then, the setting it reads then),
test_trainer_signals.py's signals sent while TensorFlow loads and as Python exits, and
the `python -c` runs that look at what a fresh process has imported.

Two differences from a fresh process remain (training/forked_run.py): a child ends in
os._exit, so a test of what happens at Python's own exit runs fresh; and TensorFlow's
generator for unseeded ops may be shared by siblings, so a test that needs two runs to
differ gives seeds.
"""
import atexit
import ctypes
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from training import forked_run  # noqa: E402  (imports no TensorFlow)
PRELOAD = ('tensorflow', 'numpy', 'absl.app', 'absl.flags')  # what every program imports first
# Variables read while Python and TensorFlow load: a run whose values differ from a
# server's is not forked from it.
IMPORT_TIME = re.compile(r'(TF_|ONEDNN_|DNNL_|CUDA_|OMP_|KMP_|MKL_|PYTHON|LD_|GRPC_)')
# Read by the program as it runs; CUDA_VISIBLE_DEVICES by the CUDA driver when TensorFlow
# first lists its devices (cuInit), which the server never does.
NOT_IMPORT_TIME = {'TF_CONFIG', 'PYTHONUNBUFFERED', 'CUDA_VISIBLE_DEVICES'}
REQUEST_BYTES = 1 << 20      # one request's JSON: argv, environment, cwd
CLONE_NEWNET = 0x40000000    # setns()'s kind: a network namespace (<sched.h>)
SERVER_ENV = {'OPENBLAS_NUM_THREADS': '1'}  # numpy's OpenBLAS would start a thread
# The server's log line once PRELOAD is in: its CPU time from the interpreter's start, the
# cost of every fresh program's start, and so a measure of how fast the host runs now.
IMPORTED_LINE = 'imported %s in %.2f CPU-s'
IMPORTED = re.compile(r'^imported .* in ([\d.]+) CPU-s$', re.M)


# ---- Which runs are forked -------------------------------------------------------------

def script_of(argv):
  """(script, unbuffered) when argv is `python [-u] script.py ...` with this Python,
  ('-c', unbuffered) when it is `python [-u] -c CODE ...`, else (None, False)."""
  unbuffered = len(argv) > 2 and argv[1] == '-u'
  script = argv[2 if unbuffered else 1] if len(argv) > 1 else ''
  code = script == '-c' and len(argv) > (3 if unbuffered else 2)
  if argv[0] != sys.executable or not (script.endswith('.py') or code):
    return None, False
  return script, unbuffered


def netns_of(argv):
  """(PATH, the program's argv) for `nsenter --net=PATH -- program...` (a host of
  benchmarks/netlab.py's), else (None, argv)."""
  if len(argv) > 3 and argv[0] == 'nsenter' and argv[1].startswith('--net=') and (
      argv[2] == '--'):
    return argv[1][len('--net='):], list(argv[3:])
  return None, argv


def import_environment(argv, env):
  """What a program run as argv, in env, has read by the time TensorFlow is in: env's
  import-time variables, with prelude's log level and machine.choose's oneDNN setting."""
  from training import machine, prelude
  env = dict(env)
  env.setdefault(prelude.LOG_LEVEL_ENV, prelude.DEFAULT_LOG_LEVEL)
  machine.apply(machine.decide(machine.flag_value(argv), env, machine.platform.machine(),
                               machine.cpu_flags()), env)
  return {name: value for name, value in sorted(env.items())
          if (IMPORT_TIME.match(name) and name not in NOT_IMPORT_TIME)
          or name == machine.SET_HERE_ENV}


# ---- The client's side -------------------------------------------------------------------

class Server:
  """A server process for one import environment, started by this test process."""

  def __init__(self, env, log_path):
    self.directory = tempfile.mkdtemp(prefix='forkserver-')  # a short path: AF_UNIX's limit
    self.path = os.path.join(self.directory, 'socket')
    self.log_path = log_path
    with open(log_path, 'ab') as log:
      # stdin is the server's lifeline: it exits when this process closes the pipe.
      self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path],
                                      env=dict(env, **SERVER_ENV), cwd=ROOT,
                                      stdin=subprocess.PIPE, stdout=log, stderr=log)
    atexit.register(self.stop)

  def connect(self):
    """A connection to the server, once it listens (it binds before its imports)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    while True:
      try:
        conn.connect(self.path)
        return conn
      except (FileNotFoundError, ConnectionRefusedError):
        if self.process.poll() is not None:
          raise AssertionError('the fork server exited with %s; its log: %s'
                               % (self.process.returncode, self.log_path)) from None
        select.select([], [], [], 0.01)

  def import_cpu_secs(self):
    """The CPU time the server took to start and import PRELOAD; None until it has."""
    with open(self.log_path) as log:
      found = IMPORTED.search(log.read())
    return float(found.group(1)) if found else None

  def stop(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      self.process.wait()
    shutil.rmtree(self.directory, ignore_errors=True)  # its socket's


class Forked:
  """A program forked by a Server: pid, stdout, stderr, poll, wait, send_signal, kill,
  returncode, as Popen has them (text pipes, line-buffered)."""

  def __init__(self, server, argv, env, cwd, new_session=False, file_size_limit=None,
               netns=None):
    self.args, self.returncode = argv, None
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)  # stdin: no program reads one, and a test
    self._conn = server.connect()             # process's own may be xdist's channel
    request = dict(argv=list(map(str, argv)), env=env, cwd=str(cwd), new_session=new_session,
                   file_size_limit=file_size_limit, netns=netns)
    try:
      socket.send_fds(self._conn, [json.dumps(request).encode()], [null, out_write, err_write])
    finally:
      for fd in (null, out_write, err_write):
        os.close(fd)
    answer = self._conn.recv(64)
    if not answer.startswith(b'pid '):
      raise AssertionError('the fork server did not start %s (%r); its log: %s'
                           % (argv, answer, server.log_path))
    self.pid = int(answer.split()[1])
    self.stdout = open(out_read, 'r', buffering=1)
    self.stderr = open(err_read, 'r', buffering=1)

  def poll(self):
    return self.wait(0, raise_timeout=False)

  def wait(self, timeout=None, raise_timeout=True):
    """The exit code, once the server has reported it; TimeoutExpired after timeout s."""
    if self.returncode is None:
      if not select.select([self._conn], [], [], timeout)[0]:
        if raise_timeout:
          raise subprocess.TimeoutExpired(self.args, timeout)
        return None
      status = self._conn.recv(64)
      if not status.startswith(b'exit '):
        raise AssertionError('the fork server went away before %s ended' % self.pid)
      self.returncode = int(status.split()[1])
      self._conn.close()
    return self.returncode

  def send_signal(self, signum):
    if self.poll() is None:
      os.kill(self.pid, signum)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout=None):
    """(stdout, stderr) read to their ends, then the exit waited for, as Popen's."""
    if not hasattr(self, '_readers'):  # started once: a call after a timeout goes on reading
      self._texts = {}
      self._readers = [threading.Thread(target=self._read_all, args=(pipe,), daemon=True)
                       for pipe in (self.stdout, self.stderr)]
      for reader in self._readers:
        reader.start()
    for reader in self._readers:
      reader.join(timeout)
      if reader.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(timeout)
    return self._texts[self.stdout], self._texts[self.stderr]

  def _read_all(self, pipe):
    self._texts[pipe] = pipe.read()


# ---- The server's side ---------------------------------------------------------------------

def serve(path):
  """Listens on path, imports PRELOAD, then forks a child per request until stdin ends."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(path)
  listener.listen(64)
  for name in PRELOAD:
    __import__(name)
  print(IMPORTED_LINE % (', '.join(PRELOAD), time.process_time()), flush=True)
  threads = os.listdir('/proc/self/task')
  if len(threads) != 1:  # a fork would copy a lock some other thread holds
    sys.exit('fork server: %d threads after the imports; forking is unsafe' % len(threads))
  wake_read, wake_write = os.pipe()
  os.set_blocking(wake_write, False)
  signal.set_wakeup_fd(wake_write)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  children = {}  # pid -> the connection its exit status goes to
  while True:
    ready = select.select([listener, sys.stdin, wake_read], [], [])[0]
    if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
      return
    if wake_read in ready:
      os.read(wake_read, 4096)
      report_exits(children)
    if listener in ready:
      conn = listener.accept()[0]
      own = [listener.fileno(), sys.stdin.fileno(), wake_read, wake_write, conn.fileno()]
      child = start_child(conn, own + [c.fileno() for c in children.values()])
      if child:
        children[child] = conn


def report_exits(children):
  """Reaps every child that has exited; sends each its exit code as Popen gives it."""
  while children:
    pid, status = os.waitpid(-1, os.WNOHANG)
    if not pid:
      return
    conn = children.pop(pid, None)
    if conn:
      try:
        conn.send(b'exit %d' % os.waitstatus_to_exitcode(status))
      except OSError:  # the client went away
        pass
      conn.close()


def start_child(conn, server_fds):
  """Forks the child a request on conn asks for; returns its pid (None: refused)."""
  message, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 3)
  if len(fds) != 3:
    conn.send(b'refused: expected 3 descriptors')
    return None
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    try:
      become(json.loads(message), fds, server_fds)
    finally:
      os._exit(70)  # not reached: become() ends in os._exit
  for fd in fds:
    os.close(fd)
  conn.send(b'pid %d' % pid)
  return pid


def become(request, fds, server_fds):
  """In the child: takes on what a fresh `python script.py` would have, then runs it."""
  for fd in server_fds:
    os.close(fd)
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  if request['new_session']:
    os.setsid()
  if request['netns']:  # as nsenter --net=PATH would; this child has one thread
    fd = os.open(request['netns'], os.O_RDONLY)
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
      sys.exit('fork server: setns(%s): %s' % (request['netns'],
                                               os.strerror(ctypes.get_errno())))
    os.close(fd)
  if request['file_size_limit'] is not None:
    limit = request['file_size_limit']
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  forked_run.run_script(request['argv'], request['env'], request['cwd'])


if __name__ == '__main__':
  serve(sys.argv[1])
  os._exit(0)  # nothing to save; Python's teardown of TensorFlow takes a second (conftest.py)
