"""Ctrl-C and SIGTERM: the trainer finishes its step, saves, and exits 130 or 143; a
program with no step loop (the exporter), or the trainer before its first step (the
download: StopSignals.raising), stops where it is and removes what it was writing.

A second Ctrl-C exits at once; a second SIGTERM changes nothing (StopSignals).
"""
import contextlib
import os
import signal
import sys
import threading


SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal
SIGNAL_NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}


_early = []  # the signal hold_until_ready() heard before a StopSignals was made
_made = []   # the StopSignals of this program: finish() reads what they heard


def hold_until_ready():
  """Ctrl-C and SIGTERM before the trainer's StopSignals exist are noted, not fatal.

  A trainer spends seconds loading TensorFlow and checking its input before its step
  loop can hear a signal; an orchestrator that stops a whole job at once (a time
  limit) often finds its tasks there. The first signal is handed to StopSignals,
  so the run stops as soon as it can, the chief after saving. A second Ctrl-C
  exits at once. Call it before TensorFlow is imported (training/prelude.py).
  """
  def note(signum, frame):
    del frame
    if _early and signum == signal.SIGINT:
      os.write(2, b'Stopped by a second Ctrl-C before training started; nothing was '
                  b'written.\n')
      exit_now(SIGNAL_EXIT_CODES[signum])
    if not _early:
      _early.append(signum)
  for signum in SIGNAL_EXIT_CODES:
    signal.signal(signum, note)


class StopSignals:
  """Ctrl-C (SIGINT) and SIGTERM ask the step loop to stop after the current step.

  The handlers only set a flag, which the loop reads between steps, so a signal is
  never lost, whenever it arrives: raised as an exception inside TensorFlow's
  own Python code, a KeyboardInterrupt can be swallowed there.

  A second Ctrl-C is for someone who cannot wait for the step to end. With
  train_dir, the process exits at once, even while its main thread is inside
  TensorFlow's C++ code (a checkpoint write), where no Python handler runs: the C
  handler writes each signal's number to a pipe (signal.set_wakeup_fd) and a
  thread reading it exits on a Ctrl-C that follows the first signal. Without
  train_dir (a launcher, a ps task, whose loops are plain Python), that Ctrl-C
  raises KeyboardInterrupt there.

  A second SIGTERM stops nothing: it is an orchestrator's, not a person's. Slurm's
  srun --kill-on-bad-exit sends one to every task once any task has exited (143,
  after its own save), and a person's `kill` twice means the same as once; it must
  not turn the chief's save in progress into a run lost since the last one. SIGKILL
  remains for what cannot wait.

  SIGXFSZ is ignored, so that a file-size limit makes the checkpoint write fail
  with an error this program reports, instead of killing it without a word.

  Args:
    train_dir: str, named in the line a second signal prints, or None.
  """

  def __init__(self, train_dir=None):
    self.signum = _early[0] if _early else None  # heard while the program started
    self._train_dir = train_dir
    self._said_again = False
    self._starting = False  # inside raising(): before the first step, nothing to save
    self._answered = False  # `requested` has said True: the program acts on the stop
    _made.append(self)
    for signum in SIGNAL_EXIT_CODES:
      signal.signal(signum, self._handle)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if train_dir is not None:
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)  # the C handler must never block
      signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
      threading.Thread(target=self._exit_on_second, args=(read_fd,), daemon=True,
                       name='StopSignals').start()

  @contextlib.contextmanager
  def raising(self):
    """Inside the block Ctrl-C and SIGTERM raise Interrupted where the main thread is,
    at once: for start-up work that has no step to finish (the data set's download),
    whose except and finally blocks remove what it was writing. The first signal
    raises; one more while that clean-up runs is ignored, but a Ctrl-C still exits at
    once (the thread of train_dir), saying that nothing was saved."""
    raised = []

    def handle(signum, frame):
      if not raised:
        raised.append(signum)
        self.signum = signum
        raise_in_our_code(Interrupted(signum), frame)
    self._starting = True
    for signum in SIGNAL_EXIT_CODES:
      signal.signal(signum, handle)
    try:
      yield
    finally:
      for signum in SIGNAL_EXIT_CODES:
        signal.signal(signum, self._handle)
      self._starting = False

  def _handle(self, signum, frame):
    if self.signum is None:
      self.signum = signum
    elif self._train_dir is None and signum == signal.SIGINT:
      raise_in_our_code(KeyboardInterrupt(), frame)
    elif self._train_dir is None and signum == signal.SIGTERM:
      self._say_sigterm_again(sys.stdout.fileno())

  def _exit_on_second(self, read_fd):
    first = None
    while True:
      for signum in os.read(read_fd, 64):  # one byte per signal, its number
        if signum not in SIGNAL_EXIT_CODES:
          continue
        if first is None:
          first = signum
          # Heard here at once: the Python handler runs only when the main thread
          # leaves TensorFlow's C++ code, and a step may wait there for long.
          if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
          which = 'a second Ctrl-C' if first == signal.SIGINT else 'Ctrl-C after SIGTERM'
          line = ('Stopped by %s before the first step; nothing was saved (the next run '
                  'removes what a download or extraction left).\n' % which
                  if self._starting else
                  'Stopped by %s without saving; the last checkpoint in %s is untouched.\n'
                  % (which, self._train_dir))
          os.write(2, line.encode())  # not sys.stderr: the main thread may hold its lock
          exit_now(SIGNAL_EXIT_CODES[signum])
        else:
          self._say_sigterm_again(1)

  def _say_sigterm_again(self, fd):
    """Once: a repeated SIGTERM changes nothing."""
    if not self._said_again:
      self._said_again = True
      os.write(fd, b'SIGTERM again: still finishing the step and its save (a Ctrl-C ends '
                   b'at once, losing them)\n')

  @property
  def requested(self):
    self._answered = self._answered or self.signum is not None
    return self.signum is not None

  @property
  def unanswered(self):
    """Heard after the program's last look at `requested`: as it ended."""
    return self.signum is not None and not self._answered

  @property
  def name(self):
    return SIGNAL_NAMES.get(self.signum, 'signal %s' % self.signum)

  @property
  def exit_code(self):
    return SIGNAL_EXIT_CODES.get(self.signum, 1)


class Interrupted(KeyboardInterrupt):
  """Ctrl-C or SIGTERM, raised in the main thread by raise_on_signals' handler, or
  StopSignals.raising()'s.

  A KeyboardInterrupt, so that the finally blocks and `except KeyboardInterrupt` of
  the code it interrupts treat SIGTERM as they treat Ctrl-C.
  """

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum
    self.name = SIGNAL_NAMES[signum]
    self.exit_code = SIGNAL_EXIT_CODES[signum]
    self.finished = False  # set by the code it stopped when its work was whole by then
    self.during = None     # set by the code it stopped: 'the download of URL; the partial
                           # file is removed', for the line that says where it stopped


class _Raising:
  """The state raise_on_signals' handler shares with held()."""
  raised = False   # one Interrupted per run: a later signal would cut the cleanup short
  holding = 0      # > 0 inside held()
  pending = None   # the signal that came while held


def raise_on_signals():
  """Ctrl-C and SIGTERM raise Interrupted where the main thread is, once.

  For a program that has no step loop to finish: its finally blocks remove what it was
  writing. Without this, SIGTERM kills it where it stands and nothing is removed. A
  signal hold_until_ready() heard before is raised at once. One that lands inside
  TensorFlow is raised in the code that called it (raise_in_our_code). Code that a
  raise must not cut (the renames of a swap) runs inside held().
  """
  def handle(signum, frame):
    if _Raising.raised:
      return
    if _Raising.holding:
      _Raising.pending = _Raising.pending or signum
      return
    _Raising.raised = True
    raise_in_our_code(Interrupted(signum), frame)
  for signum in SIGNAL_EXIT_CODES:
    signal.signal(signum, handle)
  if _early:  # heard while TensorFlow loaded (hold_until_ready): raised now
    signal.raise_signal(_early.pop())


def raise_in_our_code(error, frame):
  """Raises error (Interrupted, KeyboardInterrupt) for a signal handler called at frame:
  there, unless that is inside TensorFlow's Python; then in the frame that called
  TensorFlow, at its next line, or as TensorFlow's exception or return reaches it.

  Raised inside, it could break what TensorFlow was doing: its C++ runs Python as it
  goes (errors_impl's __init__, building the exception of an op that failed), and an
  exception raised there replaces the one being built, which pybind11 turns into a
  RuntimeError ('MISMATCH of original and normalized active exception types'): a
  traceback and exit 1 where the signal's own exit was due. TensorFlow's default-graph
  scopes, cut half-way, stay unbalanced. The raise waits as pdb's breakpoints do: a
  trace function set on the caller's frame, with tracing on until it runs.
  """
  caller = _caller_of_tensorflow(frame)
  if caller is None:
    raise error

  def trace(frame, event, arg):
    del frame, event, arg
    caller.f_trace = None
    sys.settrace(None)
    raise error
  caller.f_trace = trace
  sys.settrace(lambda frame, event, arg: None)  # no frame but the caller's is traced


def _caller_of_tensorflow(frame):
  """The frame that called the outermost of TensorFlow's frames on frame's stack; None
  where TensorFlow's Python is not under way (or not loaded)."""
  tensorflow = sys.modules.get('tensorflow')
  if tensorflow is None or not getattr(tensorflow, '__file__', None):
    return None
  package = os.path.dirname(tensorflow.__file__) + os.sep
  caller = None
  while frame is not None:
    if frame.f_code.co_filename.startswith(package):
      caller = frame.f_back
    frame = frame.f_back
  return caller


def ignore():
  """Ctrl-C and SIGTERM change nothing from here on: a program whose work is done and
  said, exiting (one would raise inside Python's exit functions, a traceback)."""
  for signum in SIGNAL_EXIT_CODES:
    signal.signal(signum, signal.SIG_IGN)


def exit_now(code):
  """os._exit(code), for a program that cannot wait for Python's exit."""
  os._exit(code)  # pylint: disable=protected-access


def finish():
  """A program's work is done and written: a signal from here on changes nothing, and
  one its StopSignals heard after their last look (as the run ended: a job stopped
  whole as it reached --max_steps) makes the exit its code, 143 or 130, said in a line.

  Without this, a SIGTERM while Python exits killed the task (-15): Python puts back
  the default action of every handler it installed as it finalizes, but not SIG_IGN.
  """
  ignore()
  heard = [stop for stop in _made if stop.unanswered]
  if heard:
    print('Stopped by %s as the run ended; its work was done and written.' % heard[0].name,
          flush=True)
    sys.exit(heard[0].exit_code)


@contextlib.contextmanager
def held(reraise=True):
  """A signal inside the block waits for its end: steps that must not be cut in two
  (renames that swap directories, the removal of what was written).

  reraise: raise the waiting Interrupted at the end of the block; False drops it, for a
  block that runs while the program is stopping anyway (an error on its way out). A
  block that raises drops it too: its own exception is already stopping the program.
  """
  _Raising.holding += 1
  try:
    yield
  except BaseException:
    _release(reraise=False)
    raise
  _release(reraise)


def _release(reraise):
  _Raising.holding -= 1
  if _Raising.holding or _Raising.pending is None:
    return  # an outer block still holds it, or none came
  signum, _Raising.pending = _Raising.pending, None
  _Raising.raised = True
  if reraise:
    raise Interrupted(signum)
