"""Errors a user can cause, and how a program ends on them: one line and an exit code.

    with one_line_errors(): ...   # main(): `error: <message>`, exit 1 (138: a peer went away)

Errors are TrainingError, with a message that names the path or value, what is
wrong and what to do; PeerGone asks the orchestrator for a restart.
"""
import contextlib
import errno
import os
import re
import signal
import sys

from training import signals


PEER_GONE_EXIT_CODE = 138  # 128 + SIGUSR1: "restart me"; Kubeflow retries codes >= 128


class TrainingError(Exception):
  """The run cannot go on; the message says why and what to do."""


class PeerGone(TrainingError):
  """A task this one needs (a ps task, the chief) is unreachable: a restart may cure it.

  one_line_errors() exits PEER_GONE_EXIT_CODE for it, not 1, so that an
  orchestrator restarts the task instead of failing the job.
  """


class DataError(Exception):
  """The data set is missing, damaged or unsafe; the message says what to do."""


class EvalError(Exception):
  """Evaluation cannot go on; the message says why and what to do."""


class ClusterError(Exception):
  """The environment does not describe a cluster dist_train.py can run; one line."""


class Stopped(Exception):
  """The run stopped on a signal after saving; exit with `exit_code`."""

  def __init__(self, exit_code):
    super().__init__(exit_code)
    self.exit_code = exit_code


class Ended(Stopped):
  """The job ended under this task (its chief gave up), which has said so; exit with
  `exit_code`, the chief's."""


def exit_code(e):
  """The exit code one_line_errors() gives an error: PeerGone 138, the others 1."""
  return PEER_GONE_EXIT_CODE if isinstance(e, PeerGone) else 1


@contextlib.contextmanager
def one_line_errors():
  """Ends a program with one line and an exit code for every failure a user can cause.

  TrainingError, DataError, EvalError and ClusterError print `error: <message>` and
  exit 1, PeerGone the same with PEER_GONE_EXIT_CODE; Stopped exits with its code
  (130, 143), the trainer having said where it stopped; signals.Interrupted (a signal before the first
  step) says where it stopped, then exits with its code. A second Ctrl-C needs no clause:
  StopSignals exits at once.
  """
  try:
    yield
    signals.finish()  # done: a late signal is its exit code, not death by it
  except PeerGone as e:
    print('error: %s' % e, file=sys.stderr, flush=True)
    sys.exit(PEER_GONE_EXIT_CODE)
  except (TrainingError, DataError, EvalError, ClusterError) as e:
    sys.exit('error: %s' % e)
  except signals.Interrupted as e:  # before the first step (StopSignals.raising)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as below
    print('Stopped by %s %s.' % (e.name, 'during %s; nothing else was written' % e.during
                                 if e.during else 'before the first step; nothing was written'),
          flush=True)
    sys.exit(e.exit_code)
  except Stopped as e:
    # Exiting already: a repeated SIGTERM (an orchestrator's, a launcher's) must not
    # turn the exit into death by a signal. Ignored, it stays ignored through the
    # interpreter's shutdown, which resets only the handlers Python installed.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(e.exit_code)


def os_error(e, path):
  """The OS's words in a TensorFlow or Python error: 'File too large', ..."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  # TensorFlow: '... /dir/model.ckpt-4.data-00000-of-00001.tempstate123; File too large'
  said = re.search(re.escape(path) + r'\S*; ([^\n]+)', str(e))
  return said.group(1).strip() if said else one_line(e)


def not_created(e, path):
  """Why os.makedirs(path) failed, in words: the OS's, or, for its `File exists`, a
  symbolic link in a loop or to nothing, which the OS does not name."""
  try:
    os.stat(path)
  except OSError as found:
    if found.errno == errno.ELOOP:
      return 'it is a symbolic link in a loop (it leads back to itself)'
    if found.errno == errno.ENOENT and os.path.islink(path):
      return 'it is a symbolic link to %s, which does not exist' % os.readlink(path)
  return e.strerror


def one_line(e):
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def refuse_arguments(argv):
  """TrainingError, in one line, when a command line holds words that are not flags.

  absl's app.run passes them to main() in argv[1:]; a main that ignored them would
  run as if they were not there (`--run_once true`: a boolean flag takes no value).

  Args:
    argv: main()'s argv: the program, then what absl did not take as flags.
  """
  if len(argv) > 1:
    raise TrainingError('unexpected argument%s %s: %s takes flags only (--name=value; a '
                        'boolean: --name or --noname)' % ('s' * (len(argv) > 2),
                                                          ' '.join(repr(a) for a in argv[1:]),
                                                          os.path.basename(argv[0])))
