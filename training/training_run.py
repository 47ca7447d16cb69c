"""What a training run needs around its graph: its directory, its checkpoints, its stop.

Both trainers (multi_gpu_train.py and dist_train.py's chief) use these:

    lock = lock_train_dir(train_dir)        # one trainer per directory, or a clear stop
    path, step, kept, notes = checkpoint_to_resume(train_dir)  # also clears leftovers
    saver = make_saver(var_list)            # relative paths; never deletes anything
    save_checkpoint(sess, saver, train_dir, step, keep)  # writes, rotates; one-line errors
    stop = StopSignals(train_dir)           # Ctrl-C, SIGTERM: finish the step, save
    write_run_record(train_dir, record)     # what the run used, as JSON
    writer = SummaryWriter(train_dir)       # event files; a failed write said once
    with one_line_errors(): ...             # main(): one line and an exit code, no traceback

The directory's own files are found by listing it and matching their names,
never by a glob of its path: a --train_dir such as runs/g[12] must not reach
runs/g1 and runs/g2.

Nothing here builds a model or reads flags; its messages name the flags a user
would change (--train_dir, --fresh), as the trainers' users know them. Errors are
TrainingError, with a message that names the path, what is wrong and what to do.
"""
import contextlib
import errno
import fcntl
import fnmatch
import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
import threading
import time

import tensorflow as tf

from training import input_lib

CHECKPOINT_PREFIX = 'model.ckpt'  # files model.ckpt-<step>.{index,data-*}, as the tutorial
STATE_FILE = 'checkpoint'         # TensorFlow's name for the file naming the latest
LOCK_FILE = '.lock'               # held by the running trainer; holds its PID
GLOB_CHARACTERS = '*?[\\'         # TensorFlow's checkpoint reader expands these in a path
TRAIN_DIR_FILES = [STATE_FILE, CHECKPOINT_PREFIX + '-*', 'events.out.tfevents.*', 'run-*.json']
CHECKPOINT_INDEX = re.compile(r'model\.ckpt-(\d+)\.index$')  # one file per checkpoint
SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal
SIGNAL_NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}
PEER_GONE_EXIT_CODE = 138  # 128 + SIGUSR1: "restart me"; Kubeflow retries codes >= 128


class TrainingError(Exception):
  """The run cannot go on; the message says why and what to do."""


class PeerGone(TrainingError):
  """A task this one needs (a ps task, the chief) is unreachable: a restart may cure it.

  one_line_errors() exits PEER_GONE_EXIT_CODE for it, not 1, so that an
  orchestrator restarts the task instead of failing the job.
  """


# ---- One trainer per directory -------------------------------------------------

def check_train_dir(train_dir):
  """Raises TrainingError when train_dir names something other than a directory, or
  a path TensorFlow could not read a checkpoint back from."""
  if os.path.exists(train_dir) and not os.path.isdir(train_dir):
    raise TrainingError('--train_dir %s is a file, not a directory. Point --train_dir '
                        'at a directory (it is created if missing).' % train_dir)
  found = sorted(set(GLOB_CHARACTERS) & set(train_dir))
  if found:
    raise TrainingError('--train_dir %s has %s in its path: TensorFlow reads a checkpoint '
                        'back through a glob of its path, so this run could never resume. '
                        'Name the directory without any of %s.'
                        % (train_dir, ' '.join(found), ' '.join(GLOB_CHARACTERS)))


def make_train_dir(train_dir):
  """Creates train_dir if missing, or raises TrainingError naming it and the OS error."""
  try:
    os.makedirs(train_dir, exist_ok=True)
  except OSError as e:
    raise TrainingError('cannot create --train_dir %s: %s. Point it at a directory you '
                        'can write to.' % (train_dir, e.strerror)) from None


def lock_train_dir(train_dir):
  """Takes an exclusive OS lock on train_dir for as long as the returned file is open.

  The kernel releases the lock when the process ends, however it ends, so a
  killed run never leaves a stale lock behind. Readers (cifar10_eval.py) do not
  take it and are never blocked.

  Returns:
    the open lock file; keep a reference for the whole run.

  Raises:
    TrainingError: another process holds the lock, naming it by PID.
  """
  path = os.path.join(train_dir, LOCK_FILE)
  not_a_file = ('%s is not a regular file (a symbolic link, a directory or a pipe), so '
                'the trainer will not write its PID into it. Remove it; the trainer '
                'creates its own.' % path)
  try:  # O_NOFOLLOW: a symlink planted as .lock must not redirect the PID elsewhere
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
  except OSError as e:
    if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
      raise TrainingError(not_a_file) from None
    raise TrainingError('cannot open the lock file %s: %s. Check that --train_dir is a '
                        'directory you can write to.' % (path, e.strerror)) from None
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise TrainingError(not_a_file)
  lock = os.fdopen(fd, 'r+')
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      raise
    lock.seek(0)
    holder = lock.read().strip() or 'unknown'
    lock.close()
    raise TrainingError(
        '%s is in use by another trainer (PID %s): two runs in one directory would '
        'overwrite each other\'s checkpoints. Stop that run, or give this one another '
        '--train_dir.' % (train_dir, holder)) from None
  try:
    lock.seek(0)
    lock.truncate()
    lock.write('%d\n' % os.getpid())
    lock.flush()
  except OSError as e:
    lock.close()
    raise TrainingError('cannot write this trainer\'s PID into %s: %s. Free space or '
                        'raise the file-size limit (ulimit -f), or point --train_dir at a '
                        'writable disk.' % (path, e.strerror)) from None
  return lock


# ---- A record of each run ------------------------------------------------------

def constants_of(module):
  """The module's UPPER_CASE constants of plain types: {name: value}."""
  return {name: value for name, value in sorted(vars(module).items())
          if name.isupper() and isinstance(value, (bool, int, float, str, list, tuple))}


def write_run_record(train_dir, record):
  """Writes `record` (a dict) as train_dir/run-<date>-<time>-step<N>.json; returns the path."""
  path = os.path.join(train_dir, 'run-%s-step%d.json' % (time.strftime('%Y%m%d-%H%M%S'),
                                                         record.get('start_step', 0)))
  try:
    _write_whole(path, json.dumps(record, indent=1) + '\n')
  except OSError as e:
    raise TrainingError('cannot write the run record %s: %s. Point --train_dir at a '
                        'directory you can write to, with free space and no file-size '
                        'limit (ulimit -f).' % (path, e.strerror or e)) from None
  return path


def _write_whole(path, text):
  """Writes text to path through a temporary file beside it: all of it or nothing.

  Raises:
    OSError: the temporary file is removed; path is as it was.
  """
  tmp_path = '%s.tmp%d' % (path, os.getpid())
  try:
    with open(tmp_path, 'w') as f:
      f.write(text)
    os.replace(tmp_path, path)
  except OSError:
    with contextlib.suppress(OSError):
      os.remove(tmp_path)
    raise


def text_summary(tag, record):
  """A TensorBoard text summary showing `record` as indented JSON."""
  text = '\n'.join('    ' + line for line in json.dumps(record, indent=1).splitlines())
  summary = tf.compat.v1.Summary()
  value = summary.value.add(tag=tag)
  value.metadata.plugin_data.plugin_name = 'text'
  value.tensor.CopyFrom(tf.make_tensor_proto(text))
  return summary


def new_event_file(logdir):
  """A path in logdir for a new event file, one no file has yet.

  TensorFlow's name, 'events.out.tfevents.<seconds>.<host>', and then the
  microseconds: a run resumed within the second its last run started (a short run
  does) gets a name of its own instead of writing over that run's events, and the
  names sort in the order the files were made, which is the order TensorBoard
  reads them in.
  """
  now = time.time()
  while True:
    path = os.path.join(logdir, 'events.out.tfevents.%010d.%s.%06d' % (
        now, socket.gethostname(), round(now % 1 * 1e6) % 1000000))
    if not os.path.exists(path):
      return path
    now += 1e-6


class SummaryWriter:
  """An event file for TensorBoard whose failed write is said once, plainly.

  tf.compat.v1.summary.FileWriter writes from a thread of its own: a write that
  fails (a file-size limit, a full disk) prints a traceback from that thread and
  raises later, from whichever call comes next. This writer writes and flushes
  each event in the caller's thread, in the same format (TFRecords of Event
  protos, named as TensorFlow names them). The first failure prints one line to
  stderr; after it nothing more is written, and training goes on.

  Args:
    logdir: str, an existing directory.
    graph: a tf.Graph to show in TensorBoard, or None.
  """

  def __init__(self, logdir, graph=None):
    self.path = new_event_file(logdir)
    self.failed = False
    self._writer = None
    self._write(tf.compat.v1.Event(wall_time=time.time(), file_version='brain.Event:2'),
                step=0)
    if graph is not None:
      self._write(tf.compat.v1.Event(wall_time=time.time(), graph_def=graph.as_graph_def(
          add_shapes=True).SerializeToString()), step=0)

  def add_summary(self, summary, global_step):
    """summary: a tf.compat.v1.Summary, or its serialized bytes (a summary op's value)."""
    if isinstance(summary, bytes):
      summary = tf.compat.v1.Summary.FromString(summary)
    self._write(tf.compat.v1.Event(wall_time=time.time(), step=int(global_step),
                                   summary=summary), int(global_step))

  def flush(self):
    """Each event is flushed as it is written; here for FileWriter's callers."""

  def close(self):
    if self._writer is not None and not self.failed:
      self._writer.close()
    self._writer = None

  def _write(self, event, step):
    if self.failed:
      return
    try:
      if self._writer is None:
        self._writer = tf.io.TFRecordWriter(self.path)
      self._writer.write(event.SerializeToString())
      self._writer.flush()
    except (tf.errors.OpError, OSError) as e:
      self.failed = True
      sys.stderr.write('warning: cannot write %s: %s. Training goes on, but TensorBoard '
                       'will show no summaries from step %d on; free space or raise the '
                       'file-size limit (ulimit -f) to keep them.\n'
                       % (self.path, _os_error(e, self.path), step))
      sys.stderr.flush()


# ---- Stopping on a signal ------------------------------------------------------

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


class Stopped(Exception):
  """The run stopped on a signal after saving; exit with `exit_code`."""

  def __init__(self, exit_code):
    super().__init__(exit_code)
    self.exit_code = exit_code


def refuse_arguments(argv):
  """Stops the program in one line when its command line holds words that are not flags.

  absl's app.run passes them to main() in argv[1:]; a main that ignored them would
  run as if they were not there (`--run_once true`: a boolean flag takes no value).

  Args:
    argv: main()'s argv: the program, then what absl did not take as flags.
  """
  if len(argv) > 1:
    sys.exit('error: unexpected argument%s %s: %s takes flags only (--name=value; a '
             'boolean: --name or --noname)' % ('s' * (len(argv) > 2),
                                               ' '.join(repr(a) for a in argv[1:]),
                                               os.path.basename(argv[0])))


@contextlib.contextmanager
def one_line_errors():
  """Ends a program with one line and an exit code for every failure a user can cause.

  TrainingError and DataError print `error: <message>` and exit 1, PeerGone the
  same with PEER_GONE_EXIT_CODE; Stopped exits with its code (130, 143), the
  trainer having said where it stopped. A second Ctrl-C needs no clause:
  StopSignals exits at once.
  """
  try:
    yield
  except PeerGone as e:
    print('error: %s' % e, file=sys.stderr, flush=True)
    sys.exit(PEER_GONE_EXIT_CODE)
  except (TrainingError, input_lib.DataError) as e:
    sys.exit('error: %s' % e)
  except Stopped as e:
    sys.exit(e.exit_code)


# ---- Checkpoints ---------------------------------------------------------------

def checkpoint_step(path):
  """model.ckpt-1230 -> 1230; None for a name of another form."""
  tail = path.rsplit('-', 1)[-1]
  return int(tail) if tail.isdigit() else None


def _names(train_dir):
  """The names of train_dir's entries: listed, never globbed (see the module docstring)."""
  return os.listdir(train_dir) if os.path.isdir(train_dir) else []


def _checkpoints_on_disk(train_dir):
  """Prefixes of this directory's model.ckpt-<step> checkpoints, newest first."""
  steps = [int(found.group(1)) for found in map(CHECKPOINT_INDEX.match, _names(train_dir))
           if found]
  return [os.path.join(train_dir, '%s-%d' % (CHECKPOINT_PREFIX, step))
          for step in sorted(steps, reverse=True)]


def read_whole(path):
  """Reads every tensor of checkpoint `path`; returns its global step.

  Raises:
    ValueError: with the first line of what went wrong (a truncated file, ...).
  """
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)  # reads every byte: a truncated file fails here
    return int(reader.get_tensor('global_step'))
  except Exception as e:  # OpError, IndexError ('Read less bytes'), ...: all unreadable
    raise ValueError(str(e).strip().splitlines()[0] if str(e).strip() else
                     type(e).__name__) from e


def read_state_file(train_dir):
  """The checkpoint paths a 'checkpoint' state file names, latest first, as written.

  Returns:
    list of str (possibly absolute, possibly relative), or None without a state file.

  Raises:
    TrainingError: the file is empty, binary or not a checkpoint state.
  """
  from google.protobuf import text_format  # TensorFlow's own parser of this file
  from tensorflow.python.checkpoint import checkpoint_management
  state_file = os.path.join(train_dir, STATE_FILE)
  if not os.path.exists(state_file):
    return None
  fix = ('Fix it (its first line names the latest checkpoint: model_checkpoint_path: '
         '"%s-<step>"), or remove it; to train from step 0 instead, pass the trainer '
         '--fresh.' % CHECKPOINT_PREFIX)
  try:
    with open(state_file, 'rb') as f:
      text = f.read().decode('utf-8')
    state = text_format.Parse(text, checkpoint_management.CheckpointState())
  except (OSError, UnicodeDecodeError, text_format.ParseError) as e:
    raise TrainingError('%s cannot be read as a checkpoint state file (%s). %s'
                        % (state_file, _one_line(e), fix)) from None
  if not state.model_checkpoint_path:
    raise TrainingError('%s names no checkpoint (it is empty or has no '
                        'model_checkpoint_path). %s' % (state_file, fix))
  paths = [state.model_checkpoint_path]
  paths += [p for p in reversed(state.all_model_checkpoint_paths) if p not in paths]
  return paths


def in_this_dir(train_dir, path, notes):
  """Where a path from the state file is, looking in train_dir first.

  A state file written with absolute paths (older versions of this trainer, or
  TensorFlow's default) names the directory it was written in. After the
  directory was moved or copied, its own file of that name is the one meant.
  """
  if not os.path.isabs(path):
    return os.path.join(train_dir, path)
  local = os.path.join(train_dir, os.path.basename(path))
  if os.path.realpath(os.path.dirname(path)) == os.path.realpath(train_dir):
    return local
  if os.path.exists(local + '.index'):
    notes.append('%s names %s; using %s in this directory.'
                 % (os.path.join(train_dir, STATE_FILE), path, local))
    return local
  notes.append('%s names %s, outside this directory, and this directory has no file of '
               'that name: reading that one.' % (os.path.join(train_dir, STATE_FILE), path))
  return path


def checkpoint_to_resume(train_dir):
  """The checkpoint a rerun continues from, after checking it can be read whole.

  With a state file, the checkpoint it names (found in train_dir first, even when
  named by an absolute path). Without one (a run killed between a checkpoint's
  files and its state file), the newest checkpoint on disk that reads whole.

  Call it holding the lock (lock_train_dir): first it removes what killed runs
  left of their checkpoint writes (remove_leftovers).

  Returns:
    (path, global step, the checkpoints of train_dir that save_checkpoint's
     rotation continues with, oldest first, notes to print), or
    (None, 0, [], notes) for a directory with no checkpoint.

  Raises:
    TrainingError: the state file or the checkpoint it names cannot be read, or
      no checkpoint on disk reads whole.
  """
  notes = remove_leftovers(train_dir)
  named = read_state_file(train_dir) if os.path.isdir(train_dir) else None
  if named is None:
    path, step, kept, more_notes = _newest_whole_checkpoint(train_dir)
    return path, step, kept, notes + more_notes
  paths = [in_this_dir(train_dir, p, notes) for p in named]
  path = paths[0]
  try:
    step = read_whole(path)
  except ValueError as e:
    raise TrainingError(
        'checkpoint %s (named in %s) cannot be read: %s. Point "checkpoint" at an '
        'older %s-<step> in that directory, or pass --fresh to start from step 0.'
        % (path, os.path.join(train_dir, STATE_FILE), e, CHECKPOINT_PREFIX)) from None
  return path, step, _own_checkpoints(train_dir, paths), notes


def _own_checkpoints(train_dir, paths):
  """Of the paths a state file names (latest first, as found by in_this_dir), those
  rotation may delete: this directory's own model.ckpt-<step> that exist, oldest first.

  A path outside train_dir (../victim/model.ckpt-1, /elsewhere/model.ckpt-1) is
  never among them.
  """
  here = os.path.dirname(os.path.join(train_dir, 'x'))
  return [p for p in reversed(paths) if os.path.dirname(p) == here and
          CHECKPOINT_INDEX.match(os.path.basename(p) + '.index') and
          os.path.exists(p + '.index')]


def _rotation(train_dir):
  """The checkpoints save_checkpoint rotates, oldest first: the state file's own,
  or without a state file, this directory's checkpoints by step."""
  named = read_state_file(train_dir)
  if named is None:
    return list(reversed(_checkpoints_on_disk(train_dir)))
  return _own_checkpoints(train_dir, [in_this_dir(train_dir, p, []) for p in named])


def _newest_whole_checkpoint(train_dir):
  found = _checkpoints_on_disk(train_dir) if os.path.isdir(train_dir) else []
  if not found:
    return None, 0, [], []
  skipped = []
  for path in found:
    try:
      step = read_whole(path)
    except ValueError as e:
      skipped.append('%s (%s)' % (os.path.basename(path), e))
      continue
    note = ('%s has no "%s" state file (a run stopped before writing it); resuming '
            'from the newest checkpoint that reads whole, %s.'
            % (train_dir, STATE_FILE, os.path.basename(path)))
    if skipped:
      note += ' Skipped, unreadable: %s.' % '; '.join(skipped)
    return path, step, list(reversed(found)), [note]
  raise TrainingError(
      '%s holds checkpoints but none reads whole: %s. Pass --fresh to set them aside '
      'and start from step 0.' % (train_dir, '; '.join(skipped)))


def restore_error(e):
  """What a failed restore says, down to the variable it names, on one line."""
  text = ' '.join(str(e).split())
  named = re.search(r'(Key \S+ not found in checkpoint|[^.]*shape[^.]*\.)', text)
  return named.group(1).rstrip('.') + '.' if named else text[:300]


def make_saver(var_list=None):
  """A Saver that writes checkpoints and deletes nothing: save_checkpoint rotates.

  The Saver's own rotation (max_to_keep) deletes through a glob of the
  directory's path, and a --train_dir such as runs/g[12] would lose the files
  of runs/g1 and runs/g2; max_to_keep=None turns it off.
  """
  return tf.compat.v1.train.Saver(var_list, max_to_keep=None, save_relative_paths=True)


def save_checkpoint(sess, saver, train_dir, step, keep):
  """Writes train_dir/model.ckpt-<step>, names it in the state file, rotates; returns its path.

  The state file then names this directory's newest `keep` checkpoints, by
  names relative to it (a directory written this way can be moved or copied and
  resumed from); the older ones are deleted, after the state file is written.
  Only this directory's own files named model.ckpt-<step>.{index,data-*,meta} are
  ever deleted: a path the state file names elsewhere is left alone.

  A write that fails (disk full, file-size limit, read-only directory) removes
  what it had started and leaves the previous checkpoint and state file as they were.

  Args:
    sess: the session holding the variables.
    saver: from make_saver().
    train_dir: str.
    step: int, the global step, in the checkpoint's name.
    keep: int >= 1, how many checkpoints to keep.

  Raises:
    TrainingError: naming the path, the OS error and what to do.
  """
  if keep < 1:
    raise ValueError('keep must be at least 1, got %r' % (keep,))
  path = os.path.join(train_dir, '%s-%d' % (CHECKPOINT_PREFIX, step))
  before = _rotation(train_dir)
  kept = [p for p in before if p != path] + [path]
  try:
    saver.save(sess, os.path.join(train_dir, CHECKPOINT_PREFIX), global_step=step,
               write_state=False)
    _write_state_file(train_dir, kept[-keep:])
  except (tf.errors.OpError, OSError) as e:
    for name in _names(train_dir):
      if name.startswith(CHECKPOINT_PREFIX + '-%d.' % step) or name.startswith(
          CHECKPOINT_PREFIX + '-%d_temp' % step) or name.startswith(STATE_FILE + '.tmp'):
        _remove(os.path.join(train_dir, name))
    previous = [p for p in before if p != path]
    untouched = ('the previous checkpoint, step %d, and the state file are untouched'
                 % checkpoint_step(previous[-1]) if previous else
                 'no checkpoint was written before')
    raise TrainingError(
        'cannot write checkpoint %s: %s. Free space or raise the file-size limit '
        '(ulimit -f) for %s, or point --train_dir at a writable disk; %s.'
        % (path, _os_error(e, path), train_dir, untouched)) from None
  for old in kept[:-keep]:
    _remove_checkpoint(train_dir, checkpoint_step(old))
  return path


def _write_state_file(train_dir, kept):
  """train_dir/checkpoint naming `kept` (oldest first) by their names, the last as latest."""
  from google.protobuf import text_format
  from tensorflow.python.checkpoint import checkpoint_management
  names = [os.path.basename(p) for p in kept]
  state = checkpoint_management.CheckpointState(model_checkpoint_path=names[-1],
                                                all_model_checkpoint_paths=names)
  _write_whole(os.path.join(train_dir, STATE_FILE), text_format.MessageToString(state))


def _remove_checkpoint(train_dir, step):
  """Deletes this directory's model.ckpt-<step>.{index,data-*,meta}, the index first:
  a kill midway leaves data without an index, which remove_leftovers recognises."""
  prefix = '%s-%d.' % (CHECKPOINT_PREFIX, step)
  names = [name for name in _names(train_dir) if name.startswith(prefix) and
           (name[len(prefix):] in ('index', 'meta') or name[len(prefix):].startswith('data-'))]
  for name in sorted(names, key=lambda name: not name.endswith('.index')):
    _remove(os.path.join(train_dir, name))


def _remove(path):
  """Removes a file, a symbolic link (not what it points at) or a directory tree."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)


# What killed runs leave in train_dir, matched against the names of its entries.
LEFTOVERS = re.compile(r'(model\.ckpt-\d+(\..*(tempstate|\.tmp)|_temp)|checkpoint\.tmp|'
                       r'run-.*\.json\.tmp)')
WITHOUT_INDEX = re.compile(r'(model\.ckpt-\d+)\.(data-.*|meta)$')  # leftovers if no .index


def remove_leftovers(train_dir):
  """Removes what killed runs left of checkpoint writes in train_dir itself.

  That is: temporary files of a save (model.ckpt-<step>.data-*tempstate*,
  model.ckpt-<step>_temp*, checkpoint.tmp*, run-*.json.tmp*), and the data or
  graph of a checkpoint whose .index is missing (a run killed while deleting it).
  Nothing outside train_dir, and no other name. Call it holding the lock.

  Returns:
    notes to print: one line naming what was removed, or none.
  """
  names = set(_names(train_dir))
  removed = sorted(name for name in names if LEFTOVERS.match(name) or (
      WITHOUT_INDEX.match(name) and
      WITHOUT_INDEX.match(name).group(1) + '.index' not in names))
  for name in removed:
    _remove(os.path.join(train_dir, name))
  if not removed:
    return []
  return ['Removed what interrupted runs left in %s: %s.' % (train_dir, ', '.join(removed))]


def _os_error(e, path):
  """The OS's words in a TensorFlow or Python error: 'File too large', ..."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  # TensorFlow: '... /dir/model.ckpt-4.data-00000-of-00001.tempstate123; File too large'
  said = re.search(re.escape(path) + r'\S*; ([^\n]+)', str(e))
  return said.group(1).strip() if said else _one_line(e)


def _one_line(e):
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def set_aside(train_dir):
  """--fresh: moves checkpoints and event files into train_dir/replaced-<time>/."""
  found = sorted(name for name in _names(train_dir)
                 if any(fnmatch.fnmatchcase(name, pattern) for pattern in TRAIN_DIR_FILES))
  if not found:
    return
  dest = os.path.join(train_dir, 'replaced-' + time.strftime('%Y%m%d-%H%M%S'))
  try:
    os.makedirs(dest)
    for name in found:
      shutil.move(os.path.join(train_dir, name), dest)
  except OSError as e:
    raise TrainingError('--fresh cannot move the files of %s into %s: %s. Move them '
                        'yourself, or point --train_dir at an empty directory.'
                        % (train_dir, dest, e.strerror or e)) from None
  print('--fresh: moved %d files from %s to %s: %s. Delete that directory once you '
        'no longer need them.' % (len(found), train_dir, dest, ', '.join(found)))
