"""Ctrl-C and SIGTERM: the trainer finishes its step, saves, and exits 130 or 143."""
import os
import signal
import threading


SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal
SIGNAL_NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}


class StopSignals:
  """Ctrl-C (SIGINT) and SIGTERM ask the step loop to stop after the current step.

  The handlers only set a flag, which the loop reads between steps, so a signal is
  never lost, whenever it arrives: raised as an exception inside TensorFlow's
  own Python code, a KeyboardInterrupt can be swallowed there.

  A second signal is for someone who cannot wait for the step to end. With
  train_dir, the process exits at once, even while its main thread is inside
  TensorFlow's C++ code (a checkpoint write), where no Python handler runs: the C
  handler writes each signal's number to a pipe (signal.set_wakeup_fd) and a
  thread reading it exits on the second. Without train_dir (a launcher whose own
  loop is plain Python), the second signal raises KeyboardInterrupt there.

  SIGXFSZ is ignored, so that a file-size limit makes the checkpoint write fail
  with an error this program reports, instead of killing it without a word.

  Args:
    train_dir: str, named in the line a second signal prints, or None.
  """

  def __init__(self, train_dir=None):
    self.signum = None
    self._train_dir = train_dir
    for signum in SIGNAL_EXIT_CODES:
      signal.signal(signum, self._handle)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if train_dir is not None:
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)  # the C handler must never block
      signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
      threading.Thread(target=self._exit_on_second, args=(read_fd,), daemon=True,
                       name='StopSignals').start()

  def _handle(self, signum, frame):
    del frame
    if self.signum is None:
      self.signum = signum
    elif self._train_dir is None:
      raise KeyboardInterrupt

  def _exit_on_second(self, read_fd):
    seen = 0
    while True:
      for signum in os.read(read_fd, 64):  # one byte per signal, its number
        seen += signum in SIGNAL_EXIT_CODES
        if seen == 2:
          line = ('Stopped by a second %s without saving; the last checkpoint in %s is '
                  'untouched.\n' % (SIGNAL_NAMES[signum], self._train_dir))
          os.write(2, line.encode())  # not sys.stderr: the main thread may hold its lock
          os._exit(SIGNAL_EXIT_CODES[signum])  # pylint: disable=protected-access

  @property
  def requested(self):
    return self.signum is not None

  @property
  def name(self):
    return SIGNAL_NAMES.get(self.signum, 'signal %s' % self.signum)

  @property
  def exit_code(self):
    return SIGNAL_EXIT_CODES.get(self.signum, 1)
