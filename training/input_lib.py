"""What every data set's input module shares: its errors, the verified download,
the clean-up after a killed one, the seeded order of samples, and the synthetic batch.

cifar10_input.py and mnist_input.py use these; nothing here knows a data set.
"""
import hashlib
import http.client
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

import tensorflow as tf
from tensorflow.python.util import deprecation

DOWNLOAD_TIMEOUT_SECS = 60   # a read that stalls this long stops the download


class DataError(Exception):
  """The data set is missing, damaged or unsafe; the message says what to do."""


# ---- The download ------------------------------------------------------------------

def md5_of(path):
  digest = hashlib.md5()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def temp_file(directory, prefix):
  """Creates a new empty file `directory/<prefix>XXXXXXXX.part`, to be renamed into place.

  Its mode is the one open() gives under the user's umask (0666 & ~umask), not
  mkstemp's 0600, which the renamed file would keep: data only its owner can read.

  Returns:
    (an open file descriptor, the path).
  """
  fd, path = tempfile.mkstemp(prefix=prefix, suffix='.part', dir=directory)
  os.fchmod(fd, 0o666 & ~umask())
  return fd, path


def umask():
  """The process's umask (reading it means setting it, so it is set straight back)."""
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def part_prefix(name):
  """Prefix of the temporary file a download of `name` goes to, with this PID."""
  return '.%s.%d.' % (name, os.getpid())


def download(url, path, md5, expected_bytes=None, offline_hint='', mismatch_hint=''):
  """Streams url to a temporary file beside `path`, verifies it, renames it to path.

  On any failure the temporary file is removed and `path` is not created.

  Args:
    url: str.
    path: str, where the verified file goes.
    md5: str, its expected md5.
    expected_bytes: int or None, its expected size.
    offline_hint: str, a sentence for the message when the download fails.
    mismatch_hint: str, a sentence for the message when size or md5 differ.

  Raises:
    DataError: naming the URL, what went wrong and what to do.
  """
  name, directory = os.path.basename(path), os.path.dirname(path)
  try:
    fd, tmp_path = temp_file(directory, part_prefix(name))
  except OSError as e:
    raise DataError('cannot write into --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (directory, e.strerror)) from None
  try:
    with os.fdopen(fd, 'wb') as out:
      received, digest, length = _stream(url, out, name, expected_bytes)
    if length and received != int(length):
      raise DataError('download of %s stopped after %d of %s bytes; run again to '
                      'retry.' % (url, received, length))
    if expected_bytes and received != expected_bytes:
      raise DataError('%s gave %d bytes; the official file has %d. Check --data_url. %s'
                      % (url, received, expected_bytes, mismatch_hint))
    if digest != md5:
      raise DataError('%s has md5 %s; expected %s. The copy is damaged or different: '
                      'check --data_url. %s' % (url, digest, md5, mismatch_hint))
    os.replace(tmp_path, path)
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    os.remove(tmp_path)
    raise DataError('cannot download %s: %s. Check the network, point --data_url at '
                    'another copy, or put %s in %s yourself. %s'
                    % (url, getattr(e, 'reason', e), name, directory, offline_hint)) from e
  except BaseException:
    os.remove(tmp_path)
    raise
  print('Downloaded %s, %d bytes, md5 %s' % (path, received, md5))


def _stream(url, out, name, expected_bytes):
  """Copies url into the open file `out`, showing progress.

  Returns:
    (bytes received, their md5, the Content-Length header or None).
  """
  digest, received, shown = hashlib.md5(), 0, -1
  with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECS) as response:
    length = response.headers.get('Content-Length')
    total = int(length) if length else expected_bytes
    for chunk in iter(lambda: response.read(1 << 16), b''):
      out.write(chunk)
      digest.update(chunk)
      received += len(chunk)
      if total and int(1000 * received / total) != shown:
        shown = int(1000 * received / total)
        sys.stdout.write('\r>> Downloading %s %.1f%% (%.1f of %.1f MB)' % (
            name, shown / 10.0, received / 1e6, total / 1e6))
        sys.stdout.flush()
  sys.stdout.write('\n')
  return received, digest.hexdigest(), length


def make_data_dir(data_dir):
  """Creates data_dir if missing; returns True when it did (for remove_if_empty)."""
  created = not os.path.isdir(data_dir)
  try:
    os.makedirs(data_dir, exist_ok=True)
  except OSError as e:
    raise DataError('cannot create --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (data_dir, e.strerror)) from None
  return created


def remove_if_empty(data_dir, created):
  """After a failed download: no empty directory left behind that this run created."""
  if created and os.path.isdir(data_dir) and not os.listdir(data_dir):
    os.rmdir(data_dir)


# ---- What killed runs leave behind -----------------------------------------------

def remove_leftovers(data_dir, patterns):
  """Removes temporary files and directories of killed downloads and conversions.

  Args:
    data_dir: str.
    patterns: regular expressions of this program's own temporary names, each
      with the PID that made the name as group 1; only dead processes' are removed.
  """
  for entry in os.listdir(data_dir):
    found = next(filter(None, (re.match(p, entry) for p in patterns)), None)
    if not found or _alive(int(found.group(1))):
      continue
    path = os.path.join(data_dir, entry)
    print('Removing %s, left by an interrupted download or extraction (process %s).'
          % (path, found.group(1)))
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process
  return True


# ---- TFRecord files ----------------------------------------------------------------

def tfrecords(path):
  """Yields each record of a TFRecord file, one at a time, CRCs checked.

  Memory stays bounded whatever the file's size. A file must end where its last
  record ends: TensorFlow's reader takes a file cut inside a record's length
  header for one that ends there, and would count one record less.

  Each record on disk: its length (8 bytes, little-endian), the length's masked
  CRC (4), the data, the data's masked CRC (4).

  Raises:
    DataError: naming the file, the record, its offset and what to do.
  """
  size, offset, index = os.path.getsize(path), 0, 0
  try:
    # tf_record_iterator checks each record's CRCs. It is deprecated in favour of
    # eager tf.data, which graph-mode programs such as the trainers do not have.
    with deprecation.silence():
      records = tf.compat.v1.io.tf_record_iterator(path)
    for record in records:
      yield record
      offset += 8 + 4 + len(record) + 4
      index += 1
  except tf.errors.OpError as e:  # DataLossError: a bad CRC or a cut-off record
    raise DataError('%s record %d cannot be read (at byte offset %d): %s. The file is '
                    'damaged: remove it to write it again.'
                    % (path, index, offset, _first_line(e))) from None
  if offset != size:
    raise DataError('%s ends with %d bytes at byte offset %d that do not make a record '
                    '(after record %d): the file was cut short or has bytes appended. '
                    'Remove it to write it again.' % (path, size - offset, offset, index - 1))


def _first_line(e):
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


# ---- The seeded order of samples -----------------------------------------------------

UNIFORM_STEPS = 1 << 24   # resolution of seeded_uniforms: values k / 2**24


def seeded_dataset(records, num_records, global_batch, seed, start_step, num_uniforms,
                   to_batch):
  """Global batches fixed by (seed, global step) alone, in TensorFlow ops only.

  Sample i of the run (global batch k holds samples k * global_batch onwards) is
  position i mod N of epoch i // N, N the number of records. Each epoch's order of
  the records is a permutation drawn from (seed, epoch) (index_shuffle, so none
  is ever materialised), and each sample's random values from (seed, epoch, its
  position). Nothing depends on the batch size, the towers or where a run
  resumed: a run resumed at step k starts at sample k * global_batch at no cost.
  No Python runs in the pipeline (a tf.data generator slows every later session
  of the process by a third, measured).

  Args:
    records: a uint8 [N, record_bytes] tensor or variable, held on the CPU.
    num_records: int, N.
    global_batch: int, samples per step over all towers.
    seed: int >= 0.
    start_step: int, the global step the run starts from.
    num_uniforms: int, random values in [0, 1) each sample needs.
    to_batch: callable (uint8 [global_batch, record_bytes] records, float32
      [global_batch, num_uniforms] uniforms) -> the batch's tensors.

  Returns:
    tf.data.Dataset of to_batch's results, one per step from start_step on.
  """
  def batch_at(step):
    samples = step * global_batch + tf.range(global_batch, dtype=tf.int64)
    epoch, position = samples // num_records, samples % num_records

    def shuffle(stream, max_index):  # a permutation of 0..max_index per (seed, stream, epoch)
      seeds = tf.stack([tf.fill([global_batch], tf.constant(seed, tf.int64)),
                        tf.fill([global_batch], tf.constant(stream, tf.int64)), epoch], axis=1)
      # The raw op: tf.random.experimental.index_shuffle pads a batch of seeds wrongly.
      return tf.raw_ops.RandomIndexShuffle(index=position, seed=seeds,
                                           max_index=max_index, rounds=4)

    order = shuffle(0, num_records - 1)
    uniforms = [tf.cast(shuffle(k + 1, UNIFORM_STEPS - 1), tf.float32) / UNIFORM_STEPS
                for k in range(num_uniforms)]
    uniforms = tf.stack(uniforms, axis=1) if uniforms else tf.zeros([global_batch, 0])
    return to_batch(tf.gather(records, order), uniforms)

  dataset = tf.data.Dataset.range(start_step, 1 << 62).map(
      batch_at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return dataset.prefetch(tf.data.AUTOTUNE)


def records_variable(initial_value, name):
  """A local (never checkpointed), untrainable variable holding every record.

  Filled when the session runs its initializer, from ops that read the files:
  no copy of the data goes into the graph, or into TensorBoard's graph view.
  """
  return tf.compat.v1.Variable(initial_value, trainable=False, name=name,
                               collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


# ---- The synthetic batch -------------------------------------------------------------

def repeated_batch(make_batch):
  """One batch, made by TensorFlow ops the first time it is read, then repeated forever.

  The batch is made in the pipeline and cached there, not held in the graph as a
  constant: a constant of --batch_size=100000 CIFAR-10 images is 691 MB that the
  graph copies as it is built (30 s before the memory check could refuse the batch).

  Args:
    make_batch: callable () -> a tuple of tensors, the batch; stateless random ops
      with a fixed seed give every process the same batch.

  Returns:
    tf.data.Dataset of make_batch's tuple, the same values every step.
  """
  return tf.data.Dataset.from_tensors(0).map(lambda _: make_batch()).cache().repeat()
