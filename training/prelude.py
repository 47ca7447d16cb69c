"""What every program does first, before TensorFlow is imported.

    from training import prelude
    if __name__ == '__main__':
      prelude.start(sys.argv)  # before TensorFlow is imported

  1. check_python(): Python 3.11 or newer, else one line and exit 1
     (distributed/local_cluster.py starts its tasks with Popen(process_group=), new
     in 3.11; below it a run would stop on a traceback, or further in).
     A package this Python cannot import (not installed in it, as in a new venv, or
     broken) is one line too, naming this Python and the install command
     (cannot_import), wherever the import is: absl's for --help, TensorFlow's in 4.
  2. answer_help(argv): --help lists every flag, --helpshort the program's own, and
     both exit 0 (absl's print the same short list and exit 1).
  3. machine.choose(argv): TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, at import.
  4. import_tensorflow(): TF_CPP_MIN_LOG_LEVEL=2 unless you set it (TensorFlow's
     errors show, its INFO and WARNING lines do not), applied to the lines TensorFlow
     prints while it loads too. dist_train.py keeps that filter for its whole life:
     it also drops the errors TensorFlow prints about a ps task that went away, which
     the program reports in its own line (SAID_BY_THE_PROGRAM).

Why 4 takes more than setting the variable: TensorFlow prints its first notices
before it reads the level (docs/trainer.md, "The start-up lines in full", tells why).

Imports no TensorFlow but in import_tensorflow().
"""
import contextlib
import importlib.util
import os
import re
import signal
import sys
import threading

from training import machine, signals

PYTHON = (3, 11)              # the oldest Python the programs run on
REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            'requirements.txt')
LOG_LEVEL_ENV = 'TF_CPP_MIN_LOG_LEVEL'
DEFAULT_LOG_LEVEL = '2'       # TensorFlow's errors only; no INFO, WARNING
SEVERITIES = 'IWEF'           # absl's letters, in TF_CPP_MIN_LOG_LEVEL's order 0..3
ABSL_LINE = re.compile(r'([IWEF])\d{4} \d\d:\d\d:[\d.]+ +\d+ ([^ \]]+):\d+\] (.*)')
# TensorFlow's errors that a program says in its own words, as (source file, start of
# the message): a step's clean-up on a ps task that went away (dist_train.py: "the
# session was aborted: a ps task (...) went away or restarted"). Dropped, with the
# lines of gRPC detail that follow them (DETAIL), by a filter kept for life.
SAID_BY_THE_PROGRAM = (('master_session.cc', 'Cleanup partition error: '),)
DETAIL = ('Additional GRPC error information from remote target ',
          ':UNKNOWN:Error received from peer ')
BANNER = 'WARNING: All log messages before absl::InitializeLog() is called are written to'
# As a container's PID 1: passed on to the program (Ctrl-C, SIGTERM), or its word that a
# process it reaps has exited.
PID_1_WAITS_FOR = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
# absl's help flags: True where only the program's own flags are listed.
HELP_ARGS = {'--help': False, '-help': False, '-?': False, '--helpfull': False,
             '-helpfull': False, '--helpshort': True, '-helpshort': True}


def start(argv, hold_signals=False, filter_for_life=False):
  """check_python(), answer_help(argv), machine.choose(argv), import_tensorflow(): a
  program's first lines.

  hold_signals: a trainer's: a Ctrl-C or SIGTERM from here on waits for its step loop
  (signals.hold_until_ready), which stops as soon as it starts, saving.
  filter_for_life: dist_train.py's: TensorFlow's lines stay filtered after its import.
  """
  check_python()
  answer_help(argv)
  if hold_signals:
    signals.hold_until_ready()
  machine.choose(argv)
  import_tensorflow(for_life=filter_for_life)


def answer_help(argv):
  """--help (and --helpfull): every flag the program accepts; --helpshort: the program's
  own (its key flags). Either prints the docstring and the list to stdout and exits 0.

  absl answers both with the short list, and exits 1. The flags are defined after this
  runs, so the help flag is taken out of argv (the list itself, sys.argv) and answered
  once absl has parsed the rest, before main() (absl's call_after_init): an unknown
  flag beside it is still refused by name.
  """
  ends = argv.index('--') if '--' in argv else len(argv)  # after '--': arguments
  asked = [arg for arg in argv[1:ends] if arg in HELP_ARGS]
  if not asked:
    return
  argv[1:ends] = [arg for arg in argv[1:ends] if arg not in HELP_ARGS]
  with cannot_import('absl'):
    from absl import app  # absl only: TensorFlow is not imported yet
  app.call_after_init(lambda: app.usage(shorthelp=HELP_ARGS[asked[0]], writeto_stdout=True,
                                        exitcode=0))


def check_python(version=None):
  """Exits with one line when this Python is older than PYTHON."""
  version = tuple(version or sys.version_info)
  if version[:2] < PYTHON:
    sys.exit('error: this project needs Python %d.%d or newer; this is Python %s (%s). '
             'Install one, then `python -m pip install -r requirements.txt` with it.'
             % (PYTHON + ('.'.join(map(str, version[:3])), sys.executable)))


@contextlib.contextmanager
def cannot_import(package):
  """Around an import of package: if this Python cannot import it (not installed in this
  interpreter, a venv's without the requirements say, or a broken install), exits 1 with
  one line naming the interpreter, what failed and the command that installs it; no
  traceback. The first line of the error stays, e.g. a missing CUDA library's name."""
  try:
    yield
  except Exception as error:  # noqa: BLE001  (a broken install raises more than ImportError)
    said = (str(error).strip().splitlines() or [''])[0]
    exit_for_missing(package, '%s: %s' % (type(error).__name__, said))


def require(*packages):
  """Exits as cannot_import does if this Python has not one of packages installed; imports
  none of them (python -m benchmarks' parent imports no TensorFlow, its workers do)."""
  for package in packages:
    if importlib.util.find_spec(package) is None:
      exit_for_missing(package, 'not installed')


def exit_for_missing(package, why):
  sys.exit('error: %s cannot import %s (%s). Install the requirements into this Python: '
           '%s -m pip install -r %s'
           % (sys.executable, package, why, sys.executable, REQUIREMENTS))


def import_tensorflow(environ=None, for_life=False):
  """Imports TensorFlow with TF_CPP_MIN_LOG_LEVEL (2 unless set) applied to its loading too.

  While TensorFlow loads (for_life: from then on), stderr (file descriptor 2, where
  its C++ code writes) goes through a pipe to a filter in another process that passes
  on every line but those filter_lines() drops. A process, not a thread: a message
  TensorFlow prints just before it aborts (a CPU without the instructions it was built
  for), or one printed just before os._exit, still gets out, to its last partial line.
  Kept for life, the filter ends once this process, and every process it started that
  shares its stderr, has exited. With TensorFlow loaded already (a program forked from a
  loaded one: the tests'), for_life still starts the filter, for the lines TensorFlow
  prints from then on.

  The filter is a child that ignores Ctrl-C and SIGTERM, but as PID 1 (a container's
  first process) the program goes on in a child and PID 1 filters (serve_as_pid_1): when
  PID 1 ends the kernel kills every other process of its namespace, and a filter child
  lost the lines still in its pipe.
  """
  environ = os.environ if environ is None else environ
  environ.setdefault(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL)
  level = min_level(environ[LOG_LEVEL_ENV])
  if level == 0 or ('tensorflow' in sys.modules and not for_life):
    with cannot_import('tensorflow'):
      import tensorflow  # noqa: F401  (nothing to drop, or too late to: loaded already)
    return
  sys.stderr.flush()
  read_end, write_end = os.pipe()
  if os.getpid() == 1:
    filter_pid, drained = None, fork_from_pid_1(read_end, write_end, level)
  else:
    filter_pid, drained = start_filter(read_end, write_end, level), None
  saved_stderr = os.dup(2)
  os.dup2(write_end, 2)
  os.close(write_end)
  try:
    with cannot_import('tensorflow'):
      import tensorflow  # noqa: F401,F811
  finally:
    if for_life:  # the filter stays, and ends after this process
      os.close(saved_stderr)
      if drained is not None:
        os.close(drained)  # PID 1's word that it has drained: not waited for
    else:
      sys.stderr.flush()
      os.dup2(saved_stderr, 2)  # the pipe's last writer gone, the filter reads to its end
      os.close(saved_stderr)
      wait_for_filter(filter_pid, drained)  # its lines come before anything printed after


def start_filter(read_end, write_end, level):
  """A child that passes the pipe's lines on to stderr, ignoring Ctrl-C and SIGTERM (the
  program decides); returns its pid."""
  child = os.fork()
  if child == 0:
    os.close(write_end)
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, signal.SIG_IGN)
    try:
      pass_on(read_end, level)
    finally:
      os._exit(0)
  os.close(read_end)
  return child


def fork_from_pid_1(read_end, write_end, level):
  """As PID 1: forks; the program goes on in the child, which this returns in, with a
  read end that reaches its end once PID 1 has passed the filtered lines on. PID 1 serves
  (serve_as_pid_1) and never returns. Ctrl-C, SIGTERM and SIGCHLD are blocked across the
  fork and stay blocked in PID 1, which takes them one at a time; the child gets back the
  mask it had."""
  drained, done = os.pipe()
  was = signal.pthread_sigmask(signal.SIG_BLOCK, PID_1_WAITS_FOR)
  child = os.fork()
  if child == 0:
    os.close(read_end)
    os.close(done)
    take_the_terminal()
    signal.pthread_sigmask(signal.SIG_SETMASK, was)
    return drained
  os.close(write_end)
  os.close(drained)
  serve_as_pid_1(child, read_end, done, level)


def take_the_terminal():
  """The program's own process group, the terminal's foreground one if it has a terminal
  (`docker run -it`), as tini does: a Ctrl-C typed there reaches the program once, not
  also through PID 1; and its reads of the terminal are not stopped as a background's."""
  os.setpgid(0, 0)
  if os.isatty(0):
    was = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # sent to a background caller
    with contextlib.suppress(OSError):  # a terminal, but not this session's
      os.tcsetpgrp(0, os.getpgrp())
    signal.signal(signal.SIGTTOU, was)


def serve_as_pid_1(child, read_end, done, level):
  """PID 1's life beside the program, its child: passes Ctrl-C and SIGTERM on to it, its
  stderr on through the filter (a thread), and reaps every process left to it; once the
  child has exited and its stderr has reached its end, exits with the child's code (128 +
  the signal's number, for a death by a signal).

  The signals stay blocked and are taken with sigwaitinfo, not a Python handler: a
  handler runs between bytecodes, and a SIGTERM that came just before PID 1 blocked in
  the pipe's read waited behind it for ever, never passed on. tests/test_prelude.py's
  AS_PID_ONE program under `unshare --pid`, sent SIGTERM at its first line, beside 3
  busy loops on this project's 2-core EPYC: 10 of 100 runs hung so, 0 of 300 since
  (2026-11-28)."""
  def pass_on_then_say():
    pass_on(read_end, level)
    os.close(done)  # the program's import may go on: its lines are out
  passing = threading.Thread(target=pass_on_then_say, daemon=True)
  passing.start()  # with the signals blocked, as in this thread
  while True:
    signum = signal.sigwaitinfo(PID_1_WAITS_FOR).si_signo
    if signum != signal.SIGCHLD:
      os.kill(child, signum)
      continue
    code = reap_all(child)
    if code is not None:
      passing.join()
      os._exit(code)  # pylint: disable=protected-access


def reap_all(child):
  """Reaps every exited process; returns the child's exit code if it was one, else None."""
  code = None
  with contextlib.suppress(ChildProcessError):
    while True:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        break
      if pid == child:
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
  return code


def pass_on(read_end, level):
  """The lines of the pipe's read end that filter_lines() keeps, written to stderr until
  the pipe's end; should no one read our stderr, each is still read, and dropped."""
  with os.fdopen(read_end, 'rb') as lines, os.fdopen(os.dup(2), 'wb', buffering=0) as out:
    for line in filter_lines(lines, level):
      with contextlib.suppress(OSError):
        out.write(line)


def wait_for_filter(filter_pid, drained):
  """Until the filter has passed its last line on: its exit, or PID 1's word."""
  if filter_pid is not None:
    os.waitpid(filter_pid, 0)
  else:
    os.read(drained, 1)  # b'' once PID 1 has closed its end
    os.close(drained)


def min_level(value):
  """TF_CPP_MIN_LOG_LEVEL's value as TensorFlow reads it: an integer, 0 if it is none."""
  try:
    return int(value)
  except ValueError:
    return 0


def filter_lines(lines, level):
  """The lines (bytes) to show: all but absl-format lines below `level`, and those
  SAID_BY_THE_PROGRAM with the DETAIL lines that follow them.

  absl's banner is held until the next line: shown before a line that is shown,
  dropped with one that is dropped.
  """
  banner, said = None, False
  for line in lines:
    text = line.decode('utf-8', 'replace')
    if said and text.startswith(DETAIL):
      continue
    said = False
    if text.startswith(BANNER):
      banner = line
      continue
    found = ABSL_LINE.match(text)
    if found and (SEVERITIES.index(found.group(1)) < level or
                  any(found.group(2) == source and found.group(3).startswith(message)
                      for source, message in SAID_BY_THE_PROGRAM)):
      banner, said = None, True
      continue
    if banner:
      yield banner
      banner = None
    yield line
