"""The training directory: its checks, its lock (one trainer per directory), its files;
and how every program reads a file a user can put anything at: read_bounded, parse_json.
Any of them may be on an object store (gs://): storage.py reaches it, and says what
holds there instead of the lock and the atomic rename.

The directory's own files are found by listing it and matching their names,
never by a glob of its path: a --train_dir such as runs/g[12] must not reach
runs/g1 and runs/g2. Messages name the flags a user would change (--train_dir,
--fresh), as the trainers' users know them.
"""
import contextlib
import errno
import fnmatch
import fcntl
import json
import os
import re
import stat
import time

from training import errors, storage
from training.errors import TrainingError


LOCK_FILE = '.lock'               # held by the running trainer; holds its PID
GLOB_CHARACTERS = '*?[\\'         # TensorFlow's checkpoint reader expands these in a path
MAX_JSON_DEPTH = 100              # levels of [ and {: a run record has 4, TF_CONFIG 3


def check_train_dir(train_dir):
  """Raises TrainingError when train_dir names something other than a directory, or
  a path TensorFlow could not read a checkpoint back from, or a URL TensorFlow cannot
  reach (storage.check)."""
  storage.check(train_dir, '--train_dir')
  if storage.exists(train_dir) and not storage.isdir(train_dir):
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
    storage.makedirs(train_dir)
  except OSError as e:
    raise TrainingError('cannot create --train_dir %s: %s. Point it at a directory you '
                        'can write to.' % (train_dir, errors.not_created(e, train_dir))) from None


def lock_train_dir(train_dir):
  """Takes an exclusive OS lock on train_dir for as long as the returned file is open.

  The kernel releases the lock when the process ends, however it ends, so a
  killed run never leaves a stale lock behind. Readers (cifar10_eval.py) do not
  take it and are never blocked.

  Returns:
    the open lock file; keep a reference for the whole run.

  On an object store there is no such lock: it says so in one line (storage.NOT_LOCKED)
  and returns a context that holds nothing.

  Raises:
    TrainingError: another process holds the lock, naming it by PID.
  """
  if not storage.is_local(train_dir):
    print(storage.NOT_LOCKED % train_dir, flush=True)
    return contextlib.nullcontext()
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
    if e.errno not in (errno.EAGAIN, errno.EACCES):  # ENOLCK: NFS without its lock daemon
      lock.close()
      raise TrainingError('cannot lock %s: %s. Give --train_dir on a file system that has '
                          'locks (a local disk).' % (lock.name, e.strerror)) from None
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


def write_whole(path, text):
  """Writes text to path through a temporary file beside it: all of it or nothing.

  On an object store, in place: an upload is all or nothing by itself.

  Raises:
    OSError: the temporary file is removed; path is as it was.
  """
  if not storage.is_local(path):
    storage.write(path, text)
    return
  tmp_path = '%s.tmp%d' % (path, os.getpid())
  try:
    with open(tmp_path, 'w') as f:
      f.write(text)
    os.replace(tmp_path, path)
  except OSError:
    with contextlib.suppress(OSError):
      os.remove(tmp_path)
    raise


def read_bounded(path, max_bytes, follow_links=True):
  """The bytes of the regular file at path, read whole: never more than max_bytes, and
  never a wait.

  Opened with O_NONBLOCK and checked before any read: a FIFO (whose read waits for a
  writer forever), a device (/dev/zero, or a link to it, never ends) or a file larger
  than max_bytes (a sparse 20 GB file reads as 20 GB of zeros) is refused. Every file a
  program reads whole from a place a user fills (run records, the checkpoint state
  file, an export's record, images, class names) is read here.

  Args:
    follow_links: False refuses a symbolic link too (O_NOFOLLOW).

  Raises:
    OSError: its strerror says what is wrong, for a one-line message ('not a regular
      file but a FIFO', '21474836480 bytes, more than the 1048576 expected', the OS's).
  """
  if not storage.is_local(path):  # an object: no FIFO or device there; its size first
    if storage.isdir(path):
      raise OSError(errno.EINVAL, 'not a regular file but a directory', path)
    size = storage.size(path)
    if size > max_bytes:
      raise OSError(errno.EFBIG, '%d bytes, more than the %d expected' % (size, max_bytes),
                    path)
    return storage.read(path)
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW))
  with os.fdopen(fd, 'rb') as f:
    mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
    if not stat.S_ISREG(mode):
      raise OSError(errno.EINVAL, 'not a regular file but %s' % _kind(mode), path)
    if size > max_bytes:
      raise OSError(errno.EFBIG, '%d bytes, more than the %d expected' % (size, max_bytes),
                    path)
    data = f.read(max_bytes + 1)
  if len(data) > max_bytes:  # it grew as it was read
    raise OSError(errno.EFBIG, 'more than the %d bytes expected' % max_bytes, path)
  return data


def _kind(mode):
  for test, name in ((stat.S_ISFIFO, 'a FIFO'), (stat.S_ISCHR, 'a character device'),
                     (stat.S_ISBLK, 'a block device'), (stat.S_ISSOCK, 'a socket'),
                     (stat.S_ISDIR, 'a directory')):
    if test(mode):
      return name
  return 'a special file'


# A JSON string, whole (escapes included), or a bracket outside any string.
_JSON_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def parse_json(text, max_depth=MAX_JSON_DEPTH):
  """json.loads, after checking that its brackets nest at most max_depth deep: Python's
  parser recurses, and 200,000 levels end in a RecursionError, not a ValueError.

  Raises:
    ValueError: not JSON (json.JSONDecodeError), or nested too deep.
  """
  depth = 0
  for found in _JSON_BRACKETS.finditer(text):
    bracket = found.group()
    if bracket in '[{':
      depth += 1
      if depth > max_depth:
        raise ValueError('nested more than %d levels deep' % max_depth)
    elif bracket in ']}':
      depth -= 1
  return json.loads(text)


def entries(train_dir):
  """The names of train_dir's entries: listed, never globbed (see the module docstring)."""
  return storage.listdir(train_dir)


remove = storage.remove  # a file, a symbolic link (not what it points at), a tree


def move_aside(directory, patterns):
  """Moves the files of `directory` whose names match one of `patterns` (fnmatch) into a
  new <directory>-replaced-<date>-<time>/ beside it. Returns (that directory, the names
  moved), or (None, []) when none match. Raises OSError. On an object store each move
  is a copy and a delete (storage.RENAME_NOTE)."""
  found = sorted(name for name in entries(directory)
                 if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))
  if not found:
    return None, []
  dest = '%s-replaced-%s' % (storage.abspath(directory.rstrip('/')),
                             time.strftime('%Y%m%d-%H%M%S'))
  if storage.is_local(dest):
    os.makedirs(dest)  # fails if it exists: never merged into another run's
  elif storage.exists(dest):
    raise OSError(errno.EEXIST, 'File exists', dest)
  else:
    storage.makedirs(dest)
  for name in found:
    storage.move(os.path.join(directory, name), dest)
  return dest, found
