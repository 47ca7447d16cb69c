"""Paths are TensorFlow's: a local path, or a URL of one of TensorFlow's file systems
(`gs://bucket/run1`), as the original tutorial's tf.gfile took them.

    storage.check(path, '--train_dir')  # a scheme TensorFlow lacks: one line, no write
    storage.is_local(path)              # no scheme: the OS's promises hold (directory.py)
    storage.exists / isdir / size / listdir / makedirs / remove / rename / md5_of

A local path keeps every promise it had: an fcntl lock on --train_dir, writes through a
temporary file renamed into place, O_NONBLOCK reads (directory.py does those). On an
object store (gs://) TensorFlow's file system reaches it, and what holds differs, said
where it matters:
  - no fcntl lock: two trainers on one --train_dir are not stopped (NOT_LOCKED);
  - a whole-object write is atomic by the store itself (the object appears only when
    its upload completes), so a file is written in place, all of it or nothing;
  - a rename is a copy and a delete, object by object, not atomic (RENAME_NOTE);
  - only the run's own objects are ever deleted, as on a local disk.
Nothing of a gs:// run lands in the working directory or HOME; TensorFlow's client
buffers an object being written in a temporary file under TMPDIR, removed once uploaded.
"""
import contextlib
import errno
import hashlib
import os
import re
import shutil

from training.errors import TrainingError, one_line


URL = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')
# What adds a file system TensorFlow 2.21 does not have built in.
ADDED_BY = {'s3': 'the tensorflow-io package (pip install tensorflow-io, then '
                  '`import tensorflow_io` before TensorFlow opens the path)',
            'hdfs': 'the tensorflow-io package', 'az': 'the tensorflow-io package',
            'http': 'the tensorflow-io package', 'https': 'the tensorflow-io package'}
NOT_LOCKED = ('%s is on object storage, where no fcntl lock exists: a second trainer on '
              'it is not stopped (their checkpoints would interleave). Give each run its '
              'own --train_dir.')
RENAME_NOTE = 'a move there is a copy and a delete, object by object, not atomic'
MD5_CHUNK = 1 << 20


def scheme(path):
  """'gs' for gs://bucket/x; None for a local path."""
  found = URL.match(path)
  return found.group(1).lower() if found else None


def is_local(path):
  return scheme(path) is None


def _gfile():
  import tensorflow as tf  # here: directory.py is read before TensorFlow is imported
  return tf.io.gfile


@contextlib.contextmanager
def _as_os_error(path):
  """TensorFlow's errors on an object store as OSError, which every caller already
  turns into its one line (strerror: TensorFlow's first line)."""
  import tensorflow as tf
  try:
    yield
  except tf.errors.OpError as e:
    raise OSError(errno.EIO, one_line(e), path) from None


def check(path, flag):
  """Raises TrainingError, in one line and before anything is written, for a URL whose
  scheme TensorFlow has no file system for (s3:// in 2.21), or whose bucket is not there."""
  name = scheme(path)
  if name is None:
    return
  if name == 'file':
    raise TrainingError('%s=%s: give the local path without file:// (the local promises, '
                        'the lock among them, hold on plain paths).' % (flag, path))
  import tensorflow as tf
  prefix = URL.match(path)
  root = prefix.group(0) + path[prefix.end():].split('/')[0]  # gs://bucket
  try:
    there = tf.io.gfile.exists(root)
  except tf.errors.UnimplementedError:
    raise TrainingError(
        '%s=%s: TensorFlow %s has no file system for %s:// (gs:// is built in); %s adds '
        'it. Nothing was written.'
        % (flag, path, tf.__version__, name, ADDED_BY.get(name, 'a TensorFlow file-system '
                                                          'plugin'))) from None
  except tf.errors.OpError as e:
    raise TrainingError('%s=%s cannot be reached: %s. Nothing was written.'
                        % (flag, path, one_line(e))) from None
  if not there:
    raise TrainingError('%s=%s: %s does not exist (or is not yours to read). Create it, or '
                        'name another; nothing was written.' % (flag, path, root))


def same_place(one, other):
  """Whether two paths name one place: local paths after their links, URLs as written
  (an object store has no links)."""
  if is_local(one) and is_local(other):
    return os.path.realpath(one) == os.path.realpath(other)
  return one.rstrip('/') == other.rstrip('/')


def abspath(path):
  """os.path.abspath for a local path; a URL as it is."""
  return os.path.abspath(path) if is_local(path) else path


def exists(path):
  return os.path.exists(path) if is_local(path) else _gfile().exists(path)


def isdir(path):
  return os.path.isdir(path) if is_local(path) else _gfile().isdir(path)


def isfile(path):
  if is_local(path):
    return os.path.isfile(path)
  return _gfile().exists(path) and not _gfile().isdir(path)


def size(path):
  if is_local(path):
    return os.path.getsize(path)
  with _as_os_error(path):
    return _gfile().stat(path).length


def listdir(path):
  """The names in a directory; [] when it is not one. An object store's 'sub/' is 'sub'."""
  if is_local(path):
    return os.listdir(path) if os.path.isdir(path) else []
  with _as_os_error(path):
    if not _gfile().isdir(path):
      return []
    return sorted({name.rstrip('/') for name in _gfile().listdir(path)})


def makedirs(path):
  """Creates path and its parents if missing. Raises OSError."""
  if is_local(path):
    os.makedirs(path, exist_ok=True)
  else:
    with _as_os_error(path):
      _gfile().makedirs(path)


def remove(path):
  """Removes a file, a symbolic link (not what it points at) or a directory tree."""
  if is_local(path):
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    return
  import tensorflow as tf
  with _as_os_error(path), contextlib.suppress(tf.errors.NotFoundError):
    if _gfile().isdir(path):
      _gfile().rmtree(path)
    else:
      _gfile().remove(path)


def rename(src, dst):
  """Renames src to dst, replacing a file there. Atomic on a local disk (os.replace); on
  an object store a copy and a delete (RENAME_NOTE)."""
  if is_local(src):
    os.replace(src, dst)
  else:
    with _as_os_error(src):
      _gfile().rename(src, dst, overwrite=True)


def move(src, dst_dir):
  """Moves src into the directory dst_dir (shutil.move; on an object store, rename)."""
  if is_local(src):
    shutil.move(src, dst_dir)
  else:
    rename(src, os.path.join(dst_dir, os.path.basename(src.rstrip('/'))))


def read(path):
  """The bytes of a file on an object store, whole (local files: directory.read_bounded)."""
  with _as_os_error(path), _gfile().GFile(path, 'rb') as f:
    return f.read()


def write(path, data):
  """Writes bytes or text to path in one piece: on an object store the object appears
  only when its upload completes, so it is all of it or nothing (a local file is
  written in place: directory.write_whole writes one whole)."""
  if is_local(path):
    with open(path, 'wb' if isinstance(data, bytes) else 'w') as f:
      f.write(data)
    return
  with _as_os_error(path), _gfile().GFile(path, 'wb' if isinstance(data, bytes) else 'w') as f:
    f.write(data)


def md5_of(path):
  """The md5 (hex) of a file, read in chunks: local or on an object store."""
  digest = hashlib.md5()
  with _as_os_error(path), (open(path, 'rb') if is_local(path) else
                            _gfile().GFile(path, 'rb')) as f:
    for chunk in iter(lambda: f.read(MD5_CHUNK), b''):
      digest.update(chunk)
  return digest.hexdigest()
