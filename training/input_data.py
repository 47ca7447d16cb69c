"""Input, from the data set's bytes to the batch a tower trains on.

What every data set's input module shares (cifar10_input.py and mnist_input.py use
these; nothing here knows a data set): the verified download, the clean-up after a
killed one, the seeded order of samples, and the synthetic batch. Then what the
trainers build from a data set's input module: the epoch the schedule counts, the
pipeline every tower draws from, a distributed worker's batches.
"""
import collections
import hashlib
import http.client
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings

import tensorflow as tf
from tensorflow.python.util import deprecation

from training import errors, mixed_precision, storage
from training.errors import DataError

DOWNLOAD_TIMEOUT_SECS = 4 * 3600  # a whole download; 170 MB at 100 kbit/s takes 3.8 h
DOWNLOAD_STALL_SECS = 120         # no byte for this long stops the download
PROGRESS_SECS = 10                # the progress line is shown again at least this often


# ---- The download ------------------------------------------------------------------

def md5_of(path):
  """The md5 of the file at path, streamed; DataError for a FIFO or a device, whose
  read would wait forever or never end."""
  check_regular(path)
  return storage.md5_of(path)


def check_regular(path):
  """Raises DataError unless path (followed through links) is a regular file."""
  if storage.exists(path) and not storage.isfile(path):
    raise DataError('%s is not a regular file (a FIFO, a device or a directory), so it is '
                    'not read. Remove it; the program downloads or writes its own.' % path)


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


Deadlines = collections.namedtuple('Deadlines', [
    'total_secs',  # the whole download (--download_timeout_secs)
    'stall_secs',  # no byte for this long (--download_stall_secs)
], defaults=(DOWNLOAD_TIMEOUT_SECS, DOWNLOAD_STALL_SECS))

Limit = collections.namedtuple('Limit', [
    'bytes',  # int: the most a download may write
    'why',    # str: where that number comes from, for the message
])


def download(url, path, md5, expected_bytes=None, offline_hint='', mismatch_hint='',
             limit=None, deadlines=Deadlines()):
  """Streams url to a temporary file beside `path`, verifies it, renames it to path.

  Bounded whatever the server does: no more than the limit's bytes are written,
  and the download stops after deadlines.total_secs, or when no byte came for
  deadlines.stall_secs. On any failure, and on Ctrl-C or SIGTERM (a
  KeyboardInterrupt: signals.Interrupted), the temporary file is removed and
  `path` is not created.

  Args:
    url: str.
    path: str, where the verified file goes.
    md5: str, its expected md5.
    expected_bytes: int or None, its exact size when known (an official file).
    offline_hint: str, a sentence for the message when the download fails.
    mismatch_hint: str, a sentence for the message when size or md5 differ.
    limit: a Limit; None: expected_bytes (then required).
    deadlines: Deadlines.

  Raises:
    DataError: naming the URL, what went wrong and what to do.
  """
  name, directory = os.path.basename(path), os.path.dirname(path)
  limit = limit or Limit(expected_bytes, 'the official file\'s size')
  try:
    fd, tmp_path = temp_file(directory, part_prefix(name))
  except OSError as e:
    raise DataError('cannot write into --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (directory, e.strerror)) from None
  try:
    with os.fdopen(fd, 'wb') as out:
      received, digest, length = _stream(url, out, name, expected_bytes, limit, deadlines,
                                         mismatch_hint)
    _check_received(url, received, length, expected_bytes, digest, md5, mismatch_hint)
    os.replace(tmp_path, path)
  except BaseException as e:
    os.remove(tmp_path)
    _raise_failure(e, url, path, min(deadlines.stall_secs, deadlines.total_secs),
                   offline_hint)
  print('Downloaded %s, %d bytes, md5 %s' % (path, received, md5))


def _check_received(url, received, length, expected_bytes, digest, md5, mismatch_hint):
  """Raises DataError unless the download is whole: the bytes the server announced
  (length) and the official size (expected_bytes), when known, and the md5."""
  if length is not None and received != length:
    raise DataError('download of %s stopped after %d of %d bytes; run again to '
                    'retry.' % (url, received, length))
  if expected_bytes and received != expected_bytes:
    raise DataError('%s gave %d bytes; the official file has %d. Check --data_url. %s'
                    % (url, received, expected_bytes, mismatch_hint))
  if digest != md5:
    raise DataError('%s has md5 %s; expected %s. The copy is damaged or different: '
                    'check --data_url. %s' % (url, digest, md5, mismatch_hint))


def _raise_failure(e, url, path, wait, offline_hint):
  """Raises what a failed download of url says, its temporary file already removed: a
  DataError for the network (no byte for `wait` s, no answer, an error), e itself for
  anything else (a DataError of the checks, Ctrl-C or SIGTERM, naming the download)."""
  name, directory = os.path.basename(path), os.path.dirname(path)
  if isinstance(e, socket.timeout):  # before urllib's URLError: it may wrap one too
    raise DataError('download of %s stalled: no byte came for %d s (--download_stall_secs); '
                    'the partial file is removed. Run again to retry, raise '
                    '--download_stall_secs on a slow link, or point --data_url at another '
                    'copy.' % (url, wait)) from None
  if isinstance(e, (urllib.error.URLError, OSError, http.client.HTTPException)):
    if isinstance(getattr(e, 'reason', None), socket.timeout):
      raise DataError('cannot download %s: no answer within %d s (--download_stall_secs). '
                      'Check the network, point --data_url at another copy, or put %s in '
                      '%s yourself. %s' % (url, wait, name, directory, offline_hint)) from None
    raise DataError('cannot download %s: %s. Check the network, point --data_url at '
                    'another copy, or put %s in %s yourself. %s'
                    % (url, getattr(e, 'reason', e), name, directory, offline_hint)) from e
  if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM as signals.Interrupted
    e.during = 'the download of %s; the partial file is removed' % url
  raise e


def _stream(url, out, name, expected_bytes, limit, deadlines, mismatch_hint):
  """Copies url into the open file `out` within limit and deadlines, showing progress.

  Each read returns what has arrived (read1, not read, which waits for a whole
  chunk), so the deadline is checked, and progress shown, however slowly bytes come.

  Returns:
    (bytes received, their md5, the Content-Length or None).

  Raises:
    DataError: a malformed Content-Length, more bytes than the limit, past the deadline.
    socket.timeout: no byte for deadlines.stall_secs (the socket's timeout).
  """
  digest, received, start = hashlib.md5(), 0, time.monotonic()
  with urllib.request.urlopen(url, timeout=min(deadlines.stall_secs,
                                               deadlines.total_secs)) as response:
    length = _content_length(url, response.headers.get('Content-Length'))
    if length is not None and length > limit.bytes:
      raise DataError('%s announces %d bytes (Content-Length), more than the %d expected '
                      '(%s); nothing was downloaded. Check --data_url. %s'
                      % (url, length, limit.bytes, limit.why, mismatch_hint))
    progress = _Progress(name, length or expected_bytes)
    try:
      for chunk in iter(lambda: response.read1(1 << 16), b''):
        received += len(chunk)
        if received > limit.bytes:
          raise DataError('%s sent more than %d bytes, the most expected (%s), and was '
                          'still sending; the partial file is removed. Check --data_url. %s'
                          % (url, limit.bytes, limit.why, mismatch_hint))
        out.write(chunk)
        digest.update(chunk)
        elapsed = time.monotonic() - start
        if elapsed > deadlines.total_secs:
          raise DataError('download of %s took more than %d s (--download_timeout_secs), '
                          '%.1f MB received; the partial file is removed. Raise '
                          '--download_timeout_secs on a slow link, or point --data_url at a '
                          'nearer copy.' % (url, deadlines.total_secs, received / 1e6))
        progress.show(received, elapsed)
    finally:  # the line ends whatever stopped it: the next line starts on its own
      progress.done()
  return received, digest.hexdigest(), length


def _content_length(url, header):
  """The Content-Length header as an int, None without one; DataError when malformed."""
  if header is None:
    return None
  if not header.strip().isdigit():
    raise DataError('%s sent Content-Length %r, not a number of bytes: the server is '
                    'broken or not serving a file. Point --data_url at another copy.'
                    % (url, header))
  return int(header)


class _Progress:
  """`\r>> Downloading name 12.3% (20.9 of 170.1 MB), 31 s`, or without a size
  `(20.9 MB), 31 s`: at the start, at each 0.1% (0.1 MB) and every PROGRESS_SECS."""

  def __init__(self, name, total):
    self._name, self._total = name, total
    self._mark, self._when = None, 0.0
    self.show(0, 0.0)

  def show(self, received, elapsed):
    mark = int(1000 * received / self._total) if self._total else int(received / 1e5)
    if mark == self._mark and elapsed - self._when < PROGRESS_SECS:
      return
    self._mark, self._when = mark, elapsed
    size = ('%.1f%% (%.1f of %.1f MB)' % (mark / 10.0, received / 1e6, self._total / 1e6)
            if self._total else '(%.1f MB)' % (received / 1e6))
    sys.stdout.write('\r>> Downloading %s %s, %d s' % (self._name, size, elapsed))
    sys.stdout.flush()

  def done(self):
    sys.stdout.write('\n')
    sys.stdout.flush()


def make_data_dir(data_dir):
  """Creates data_dir if missing; returns True when it did (for remove_if_empty)."""
  created = not os.path.isdir(data_dir)
  try:
    os.makedirs(data_dir, exist_ok=True)
  except OSError as e:
    raise DataError('cannot create --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (data_dir, errors.not_created(e, data_dir))) from None
  return created


def remove_if_empty(data_dir, created):
  """After a failed download: no empty directory left behind that this run created."""
  if created and os.path.isdir(data_dir) and not os.listdir(data_dir):
    os.rmdir(data_dir)


# ---- What killed runs leave behind -----------------------------------------------

def remove_killed_downloads(data_dir, patterns):
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
  check_regular(path)  # a FIFO would block TensorFlow's reader forever
  size, offset, index = storage.size(path), 0, 0
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
  No Python runs in the pipeline: a tf.data generator slows every later session
  of the process (docs/trainer.md).

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


# ---- The trainers' input ---------------------------------------------------------

Epoch = collections.namedtuple('Epoch', [
    'count',   # int: training records in one epoch
    'source',  # str: where the count came from, for start-up
])

def examples_per_epoch(settings, data):
  """One epoch of the schedule: the training records actually read, counted.

  The official sets give the tutorial's 50,000 and the book's 60,000; a sample or
  a copy of your own counts its own records. Synthetic input takes the official
  count, as there is no epoch to count.
  """
  if settings.synthetic:
    return Epoch(data.model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
                 '%s/model.py\'s count: the input is synthetic' % data.model.__name__)
  count, files = data.input.train_records(settings.data_dir)
  return Epoch(count, 'the records in %s' % files)

def first_batch(run):
  """The global batch a seeded input starts at: one per step run so far, applied or
  skipped (an fp16 step whose gradients overflowed consumed its batch too)."""
  return run.start_step + mixed_precision.checkpoint_skipped_steps(run.checkpoint)

def input_pipeline(data_dir, num_gpus, batch_size, data_input, synthetic=False, seed=None,
                   start_step=0):
  """The one input pipeline that every tower draws from, on the CPU.

  With a seed, each step reads one global batch, fixed by (seed, global step)
  alone, and cuts it into the towers' batches in tower order: the same images,
  distorted the same way, whatever the number of towers, and a resumed run reads
  on from start_step exactly. (Towers dequeuing their own batches would race
  for them.) Without a seed, each tower dequeues its own batch, shuffled and
  distorted afresh on every run.

  Args:
    data_input: the data set's input module (DATASETS[...].input).

  Returns:
    (next_batch: callable giving the next tower's (images float32 [batch_size,
     24, 24, 3] or [batch_size, 784], labels int32 [batch_size]), called once per
     tower; the op that starts the pipeline, to run once in the session).
  """
  with tf.device('/cpu:0'):
    if seed is not None and not synthetic:
      dataset, load_records = data_input.seeded_dataset(data_dir, batch_size * num_gpus,
                                                        seed, start_step)
      iterator = tf.compat.v1.data.make_initializable_iterator(closing_at_once(dataset))
      images, labels = iterator.get_next()
      towers = iter(list(zip(tf.split(images, num_gpus), tf.split(labels, num_gpus))))
      return lambda: next(towers), tf.group(load_records, iterator.initializer)
    dataset = train_dataset(data_input, data_dir, batch_size, synthetic)
    iterator = tf.compat.v1.data.make_initializable_iterator(closing_at_once(dataset))
    return towers_get_next(iterator), iterator.initializer


def towers_get_next(iterator):
  """iterator.get_next, for each tower to call once while the graph is built.

  Past 32 calls (--num_gpus=64) TensorFlow warns of get_next() called in a training
  loop, which this is not: each call is one tower's input op, built once.
  """
  def get_next():
    with warnings.catch_warnings():
      warnings.filterwarnings('ignore', message='An unusually high number of '
                              '`Iterator.get_next\\(\\)` calls', category=UserWarning)
      return iterator.get_next()
  return get_next


def train_dataset(data_input, data_dir, batch_size, synthetic):
  """Batches of shuffled, distorted training images, or synthetic ones (--synthetic)."""
  if synthetic:
    return data_input.synthetic_dataset(batch_size)
  return data_input.train_dataset(data_dir, batch_size)


def worker_batches(data_input, data_dir, batch_size, synthetic):
  """dist_train.py's input: a function that returns a worker's next batch's tensors."""
  dataset = train_dataset(data_input, data_dir, batch_size, synthetic)
  return towers_get_next(tf.compat.v1.data.make_one_shot_iterator(closing_at_once(dataset)))


def eval_batches(data_input, eval_data, data_dir, batch_size):
  """The evaluators' input: one pass over eval_data (data_input.eval_dataset).

  Returns:
    (images, labels: the next batch's tensors, raising OutOfRangeError after the
     last record; the number of records).
  """
  dataset, num_records = data_input.eval_dataset(eval_data, data_dir, batch_size)
  images, labels = tf.compat.v1.data.make_one_shot_iterator(
      closing_at_once(dataset)).get_next()
  return images, labels, num_records


def closing_at_once(dataset):
  """dataset without tf.data's autotuning thread, so that closing its session never waits.

  Closing a session deletes its iterators, and deleting one waits out that thread's
  pause between two tunings, which grows to a minute: a trainer then sat silent
  after its last checkpoint before it exited (17-20 s in 4 runs of 12, 43 s once
  under load), and distributed tasks stopped together hung there past the ps tasks' stay
  (tests/test_slurm.py's time-limit test shows it). Without the thread, AUTOTUNE
  parallel calls keep their starting value (the CPUs, at most 16) and prefetch
  still sizes its own buffer; on this project's sample data the trainer's speed
  did not change (docs/performance.md).
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
