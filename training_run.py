"""What a training run needs around its graph: its directory, its checkpoints, its stop.

Both trainers (multi_gpu_train.py and dist_train.py's chief) use these:

    lock = lock_train_dir(train_dir)        # one trainer per directory, or a clear stop
    path, step, kept, notes = checkpoint_to_resume(train_dir)
    saver = make_saver(...)                 # relative paths; rotation across restarts
    save_checkpoint(sess, saver, ...)       # a failed write: one line, nothing lost
    stop = StopSignals()                    # Ctrl-C and SIGTERM: finish the step, save
    write_run_record(train_dir, record)     # what the run used, as JSON

Nothing here builds a model or reads flags. Errors are TrainingError, with a
message that names the path, what is wrong and what to do.
"""
import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import tensorflow as tf

CHECKPOINT_PREFIX = 'model.ckpt'  # files model.ckpt-<step>.{index,data-*}, as the tutorial
STATE_FILE = 'checkpoint'         # TensorFlow's name for the file naming the latest
LOCK_FILE = '.lock'               # held by the running trainer; holds its PID
TRAIN_DIR_FILES = [STATE_FILE, CHECKPOINT_PREFIX + '-*', 'events.out.tfevents.*', 'run-*.json']
SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal
SIGNAL_NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}


class TrainingError(Exception):
  """The run cannot go on; the message says why and what to do."""


# ---- Devices -------------------------------------------------------------------

def list_gpus():
  """tf.config.list_physical_devices('GPU'), without one misleading line.

  Call it first thing in a program: whatever first looks for GPUs prints the
  line (absl's app.run does, through TensorFlow's start-up hooks).

  On a machine with no NVIDIA driver (no /dev/nvidia* device), TensorFlow's CUDA
  build prints `E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)` here: it
  found no driver library, which is the normal state of such a machine. That one
  line is held back there; every other line, and every line on a machine with a
  driver, goes to stderr as TensorFlow wrote it.
  """
  if glob.glob('/dev/nvidia[0-9]*'):
    return tf.config.list_physical_devices('GPU')
  sys.stderr.flush()
  saved_stderr = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      gpus = tf.config.list_physical_devices('GPU')
    finally:
      os.dup2(saved_stderr, 2)
      os.close(saved_stderr)
    captured.seek(0)
    for line in captured.read().decode('utf-8', 'replace').splitlines(True):
      if not re.search(r'failed call to cuInit: .*\(303\)', line):
        sys.stderr.write(line)
  return gpus


# ---- One trainer per directory -------------------------------------------------

def check_train_dir(train_dir):
  """Raises TrainingError when train_dir names something other than a directory."""
  if os.path.exists(train_dir) and not os.path.isdir(train_dir):
    raise TrainingError('--train_dir %s is a file, not a directory. Point --train_dir '
                        'at a directory (it is created if missing).' % train_dir)


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
  try:
    lock = open(path, 'a+')
  except OSError as e:
    raise TrainingError('cannot open the lock file %s: %s. Check that --train_dir is a '
                        'directory you can write to.' % (path, e.strerror)) from e
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
  lock.seek(0)
  lock.truncate()
  lock.write('%d\n' % os.getpid())
  lock.flush()
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
  with open(path + '.tmp', 'w') as f:
    json.dump(record, f, indent=1)
    f.write('\n')
  os.replace(path + '.tmp', path)
  return path


def text_summary(tag, record):
  """A TensorBoard text summary showing `record` as indented JSON."""
  text = '\n'.join('    ' + line for line in json.dumps(record, indent=1).splitlines())
  summary = tf.compat.v1.Summary()
  value = summary.value.add(tag=tag)
  value.metadata.plugin_data.plugin_name = 'text'
  value.tensor.CopyFrom(tf.make_tensor_proto(text))
  return summary


@contextlib.contextmanager
def op_determinism():
  """TensorFlow's deterministic GPU kernels, for one run.

  The switch is process-wide; it is put back as it was at the end, so that an
  unseeded run in the same process (a test, a notebook) does not inherit it.
  """
  from tensorflow.python.framework import config  # the public API can only switch it on
  was_on = config.is_op_determinism_enabled()
  tf.config.experimental.enable_op_determinism()
  try:
    yield
  finally:
    if not was_on:
      config.disable_op_determinism()


# ---- Stopping on a signal ------------------------------------------------------

class StopSignals:
  """Ctrl-C (SIGINT) and SIGTERM ask the step loop to stop after the current step.

  The handlers only set a flag, which the loop reads between steps, so a signal is
  never lost, whenever it arrives: raised as an exception inside TensorFlow's
  own Python code, a KeyboardInterrupt can be swallowed there. A second signal,
  for someone who cannot wait for the step to end, raises KeyboardInterrupt at once.

  SIGXFSZ is ignored, so that a file-size limit makes the checkpoint write fail
  with an error this program reports, instead of killing it without a word.
  """

  def __init__(self):
    self.signum = None
    for signum in SIGNAL_EXIT_CODES:
      signal.signal(signum, self._handle)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum

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


# ---- Checkpoints ---------------------------------------------------------------

def checkpoint_step(path):
  """model.ckpt-1230 -> 1230; None for a name of another form."""
  tail = path.rsplit('-', 1)[-1]
  return int(tail) if tail.isdigit() else None


def _checkpoints_on_disk(train_dir):
  """Prefixes of this directory's model.ckpt-<step> checkpoints, newest first."""
  prefixes = [p[:-len('.index')] for p in
              glob.glob(os.path.join(train_dir, CHECKPOINT_PREFIX + '-*.index'))]
  return sorted((p for p in prefixes if checkpoint_step(p) is not None),
                key=checkpoint_step, reverse=True)


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

  Returns:
    (path, global step, the state file's checkpoints in train_dir that still
     exist, oldest first, for the Saver's rotation, notes to print), or
    (None, 0, [], []) for a directory with no checkpoint.

  Raises:
    TrainingError: the state file or the checkpoint it names cannot be read, or
      no checkpoint on disk reads whole.
  """
  notes = []
  named = read_state_file(train_dir) if os.path.isdir(train_dir) else None
  if named is None:
    return _newest_whole_checkpoint(train_dir)
  paths = [in_this_dir(train_dir, p, notes) for p in named]
  path = paths[0]
  try:
    step = read_whole(path)
  except ValueError as e:
    raise TrainingError(
        'checkpoint %s (named in %s) cannot be read: %s. Point "checkpoint" at an '
        'older %s-<step> in that directory, or pass --fresh to start from step 0.'
        % (path, os.path.join(train_dir, STATE_FILE), e, CHECKPOINT_PREFIX)) from None
  # Only this directory's own files: the Saver deletes the oldest of these.
  kept = [p for p in reversed(paths) if os.path.exists(p + '.index') and
          os.path.dirname(p) == os.path.dirname(os.path.join(train_dir, 'x'))]
  return path, step, kept, notes


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
    return path, step, list(reversed(found[:found.index(path) + 1])), [note]
  raise TrainingError(
      '%s holds checkpoints but none reads whole: %s. Pass --fresh to set them aside '
      'and start from step 0.' % (train_dir, '; '.join(skipped)))


def restore_error(e):
  """What a failed restore says, down to the variable it names, on one line."""
  text = ' '.join(str(e).split())
  named = re.search(r'(Key \S+ not found in checkpoint|[^.]*shape[^.]*\.)', text)
  return named.group(1).rstrip('.') + '.' if named else text[:300]


def make_saver(max_to_keep, var_list=None):
  """A Saver writing the state file with paths relative to its directory.

  A directory written this way can be moved or copied and resumed from.
  """
  return tf.compat.v1.train.Saver(var_list, max_to_keep=max_to_keep,
                                  save_relative_paths=True)


def save_checkpoint(sess, saver, train_dir, step, last_saved):
  """Writes train_dir/model.ckpt-<step>; returns its path.

  A write that fails (disk full, file-size limit, read-only directory) removes
  what it had started and leaves the previous checkpoint and state file as they were.

  Raises:
    TrainingError: naming the path, the OS error and what to do.
  """
  prefix = os.path.join(train_dir, CHECKPOINT_PREFIX)
  try:
    return saver.save(sess, prefix, global_step=step)
  except (tf.errors.OpError, OSError) as e:
    path = '%s-%d' % (prefix, step)
    for leftover in (glob.glob(path + '.*') + glob.glob(path + '_temp*') +
                     glob.glob(os.path.join(train_dir, STATE_FILE + '.tmp*'))):
      if os.path.isdir(leftover):
        shutil.rmtree(leftover, ignore_errors=True)
      else:
        os.remove(leftover)
    kept = ('the previous checkpoint, step %d, and the state file are untouched'
            % last_saved if last_saved else 'no checkpoint was written before')
    raise TrainingError(
        'cannot write checkpoint %s: %s. Free space or raise the file-size limit '
        '(ulimit -f) for %s, or point --train_dir at a writable disk; %s.'
        % (path, _os_error(e, path), train_dir, kept)) from None


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
  found = sorted({p for pattern in TRAIN_DIR_FILES
                  for p in glob.glob(os.path.join(train_dir, pattern))})
  if not found:
    return
  dest = os.path.join(train_dir, 'replaced-' + time.strftime('%Y%m%d-%H%M%S'))
  os.makedirs(dest)
  for path in found:
    shutil.move(path, dest)
  print('--fresh: moved %d files from %s to %s: %s. Delete that directory once you '
        'no longer need them.' % (len(found), train_dir, dest,
                                  ', '.join(os.path.basename(p) for p in found)))
