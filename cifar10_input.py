"""CIFAR-10 bytes to tensors: download, verify, extract, read, distort, batch.

The binary CIFAR-10 files hold fixed-length records of 1 label byte followed by
3072 pixel bytes: the red plane (32x32, row-major), then green, then blue.

    maybe_download_and_extract(data_dir)        fetch + check the six .bin files
    distorted_inputs(data_dir, batch_size)       training batches, augmented
    inputs(eval_data, data_dir, batch_size)      evaluation batches, one pass

Every path and size arrives as an argument; nothing here reads flags. Problems
with the files raise DataError with a message naming the file and the fix.
"""
import hashlib
import http.client
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import tensorflow as tf

# ---- The data set, as published ---------------------------------------------
DATA_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
DATA_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
DATA_BYTES = 170052171                # size of the official archive
BATCHES_DIR = 'cifar-10-batches-bin'  # the archive's top directory, under data_dir
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILES = ['test_batch.bin']
ARCHIVE_MEMBERS = ({BATCHES_DIR} |    # everything the archive may contain; nothing else
                   {posixpath.join(BATCHES_DIR, f) for f in
                    TRAIN_FILES + TEST_FILES + ['batches.meta.txt', 'readme.html']})

LABEL_BYTES = 1
HEIGHT, WIDTH, DEPTH = 32, 32, 3
IMAGE_BYTES = HEIGHT * WIDTH * DEPTH  # 3072
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES  # 3073
CROP_SIZE = 24                        # pixels; the model's IMAGE_SIZE

# ---- Input pipeline knobs -------------------------------------------------------
SHUFFLE_BUFFER = 20000                # records (61 MB raw): 40% of an epoch, as the tutorial
DOWNLOAD_TIMEOUT_SECS = 60            # a read that stalls this long stops the download


class DataError(Exception):
  """The data set is missing, damaged or unsafe; the message says what to do."""


def batches_dir(data_dir):
  """Where the .bin files live: data_dir/cifar-10-batches-bin."""
  return os.path.join(data_dir, BATCHES_DIR)


def check_data_files(paths):
  """Checks that each file exists and holds a whole, non-zero number of records.

  Runs before any graph or session, so a bad file stops the run with a message
  instead of an OutOfRange error or a hang.

  Args:
    paths: list of file paths.

  Returns:
    int, the total number of records.

  Raises:
    DataError: naming the first bad file, its size and what to do.
  """
  total = 0
  for path in paths:
    if not os.path.isfile(path):
      raise DataError(
          '%s is missing. Run with the data directory that holds the extracted '
          'CIFAR-10 binary files (--data_dir), or remove %s so they are downloaded '
          'again.' % (path, os.path.dirname(path)))
    size = os.path.getsize(path)
    if size == 0 or size % RECORD_BYTES:
      raise DataError(
          '%s has %d bytes; expected a non-zero multiple of %d (records of 1 label '
          'byte + 3072 pixel bytes; each official file is 10000 records, %d bytes). '
          'The file is truncated or not CIFAR-10 binary data: remove %s to download '
          'it again.' % (path, size, RECORD_BYTES, 10000 * RECORD_BYTES,
                         os.path.dirname(path)))
    total += size // RECORD_BYTES
  return total


def _md5(path):
  digest = hashlib.md5()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _download(url, archive, md5, expected_bytes):
  """Streams url to a temporary file beside `archive`, verifies it, renames it.

  On any failure the temporary file is removed and `archive` is not created.
  """
  name = os.path.basename(archive)
  fd, tmp_path = tempfile.mkstemp(prefix='.%s.' % name, suffix='.part',
                                  dir=os.path.dirname(archive))
  try:
    digest = hashlib.md5()
    received = 0
    with os.fdopen(fd, 'wb') as out, \
        urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECS) as response:
      length = response.headers.get('Content-Length')
      total = int(length) if length else expected_bytes
      shown = -1
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
    if length and received != int(length):
      raise DataError('download of %s stopped after %d of %s bytes; run again to '
                      'retry.' % (url, received, length))
    if expected_bytes and received != expected_bytes:
      raise DataError('%s gave %d bytes; the official archive has %d. Check --data_url, '
                      'or pass the copy\'s --data_md5.' % (url, received, expected_bytes))
    if digest.hexdigest() != md5:
      raise DataError('%s has md5 %s; expected %s. The copy is damaged or different: '
                      'check --data_url, or pass --data_md5 if you trust this copy.'
                      % (url, digest.hexdigest(), md5))
    os.replace(tmp_path, archive)
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    os.remove(tmp_path)
    raise DataError('cannot download %s: %s. Check the network, point --data_url at '
                    'another copy, or put %s in %s yourself.'
                    % (url, getattr(e, 'reason', e), name, os.path.dirname(archive))) from e
  except BaseException:
    os.remove(tmp_path)
    raise
  print('Downloaded %s, %d bytes, md5 %s' % (archive, received, md5))


def _extract(archive, data_dir):
  """Extracts the expected members of `archive` into data_dir, refusing anything else.

  Every member is checked before any byte is written: no absolute path, no `..`,
  no link, device or fifo, and only names in ARCHIVE_MEMBERS. Files are written
  into a temporary directory inside data_dir, which is renamed into place at the
  end, so a failure leaves no partial cifar-10-batches-bin behind.
  """
  try:
    with tarfile.open(archive, 'r:*') as tar:
      members = tar.getmembers()
      for member in members:
        name = member.name
        if (name.startswith('/') or '..' in name.split('/') or
            posixpath.normpath(name) not in ARCHIVE_MEMBERS):
          raise DataError('%s holds an unexpected member %r; refusing to extract it. '
                          'Only %s/ and its CIFAR-10 files may be in the archive.'
                          % (archive, name, BATCHES_DIR))
        if not (member.isreg() or member.isdir()):
          raise DataError('%s holds %r, which is a link or special file; refusing to '
                          'extract it.' % (archive, name))
      tmp_dir = tempfile.mkdtemp(prefix='.extract-', dir=data_dir)
      try:
        os.mkdir(os.path.join(tmp_dir, BATCHES_DIR))
        for member in members:
          if member.isreg():
            target = os.path.join(tmp_dir, posixpath.normpath(member.name))
            with tar.extractfile(member) as src, open(target, 'wb') as dst:
              shutil.copyfileobj(src, dst)
        check_data_files([os.path.join(tmp_dir, BATCHES_DIR, f)
                          for f in TRAIN_FILES + TEST_FILES])
        os.rename(os.path.join(tmp_dir, BATCHES_DIR), batches_dir(data_dir))
      finally:
        shutil.rmtree(tmp_dir)
  except (tarfile.TarError, EOFError, OSError) as e:
    raise DataError('cannot extract %s: %s. Remove it to download it again.'
                    % (archive, e)) from e


def maybe_download_and_extract(data_dir, data_url=None, data_md5=None):
  """Makes sure data_dir/cifar-10-batches-bin holds six good .bin files.

  Nothing is downloaded when the extracted files are already there; nothing the
  user has is overwritten or deleted: a damaged file or archive stops with a
  message saying what to remove.

  Args:
    data_dir: str, directory for the archive and the extracted files.
    data_url: str, where to fetch the archive (default: the official copy).
    data_md5: str, the archive's md5 (default: the official archive's).

  Returns:
    str, the directory holding the .bin files.

  Raises:
    DataError: with what is wrong and what to do.
  """
  data_url = data_url or DATA_URL
  data_md5 = (data_md5 or DATA_MD5).lower()
  expected_bytes = DATA_BYTES if data_md5 == DATA_MD5 else None
  dest = batches_dir(data_dir)
  if os.path.isdir(dest):
    check_data_files([os.path.join(dest, f) for f in TRAIN_FILES + TEST_FILES])
    return dest
  os.makedirs(data_dir, exist_ok=True)
  name = posixpath.basename(urllib.parse.urlparse(data_url).path) or 'cifar-10-binary.tar.gz'
  archive = os.path.join(data_dir, name)
  if os.path.exists(archive):
    md5 = _md5(archive)
    if md5 != data_md5:
      raise DataError('%s is already there but has md5 %s, expected %s. Remove it to '
                      'download it again, or pass --data_md5=%s if it is the copy you '
                      'want.' % (archive, md5, data_md5, md5))
  else:
    _download(data_url, archive, data_md5, expected_bytes)
  _extract(archive, data_dir)
  print('Extracted %s' % dest)
  return dest


def decode_records(records):
  """Turns a batch of 3073-byte records into images and labels.

  Args:
    records: string tensor [batch] of RECORD_BYTES bytes each.

  Returns:
    images: uint8 [batch, 32, 32, 3], height x width x channel (RGB).
    labels: int32 [batch], 0..9.
  """
  raw = tf.io.decode_raw(records, tf.uint8)  # [batch, 3073]
  labels = tf.cast(raw[:, 0], tf.int32)
  depth_major = tf.reshape(raw[:, LABEL_BYTES:], [-1, DEPTH, HEIGHT, WIDTH])
  return tf.transpose(depth_major, [0, 2, 3, 1]), labels


def decode_record(value):
  """One record: uint8 image [32, 32, 3] and int32 label (see decode_records)."""
  images, labels = decode_records(tf.expand_dims(value, 0))
  return images[0], labels[0]


def _distort_batch(records):
  """The tutorial's distortions, each image drawing its own random values.

  Done on whole batches rather than image by image: the same distributions at
  about twice the images/sec, which leaves more of the cores to the towers.

  Args:
    records: string [batch] (static batch size).

  Returns:
    images: float32 [batch, 24, 24, 3], standardised per image.
    labels: int32 [batch].
  """
  batch = records.shape[0]
  images, labels = decode_records(records)
  images = tf.cast(images, tf.float32)
  # Random 24x24 crop: corner (y, x) uniform in 0..8; 'nearest' at integer
  # coordinates copies pixels exactly.
  corners = tf.cast(tf.random.uniform([batch, 2], 0, HEIGHT - CROP_SIZE + 1, tf.int32),
                    tf.float32)
  boxes = tf.concat([corners, corners + CROP_SIZE - 1], axis=1) / (HEIGHT - 1)
  images = tf.image.crop_and_resize(images, boxes, tf.range(batch), [CROP_SIZE, CROP_SIZE],
                                    method='nearest')
  flip = tf.random.uniform([batch, 1, 1, 1]) < 0.5
  images = tf.where(flip, tf.reverse(images, axis=[2]), images)
  # Brightness, then contrast about each channel's mean (tf.image.random_brightness
  # with max_delta 63 and random_contrast 0.2-1.8, per image).
  images += tf.random.uniform([batch, 1, 1, 1], -63.0, 63.0)
  mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
  images = (images - mean) * tf.random.uniform([batch, 1, 1, 1], 0.2, 1.8) + mean
  images = tf.image.per_image_standardization(images)
  images.set_shape([batch, CROP_SIZE, CROP_SIZE, DEPTH])
  return images, labels


def _center_batch(records):
  """Central 24x24 crops, standardised, and the labels, for any batch size."""
  images, labels = decode_records(records)
  offset = (HEIGHT - CROP_SIZE) // 2
  images = tf.cast(images[:, offset:offset + CROP_SIZE, offset:offset + CROP_SIZE, :],
                   tf.float32)
  return tf.image.per_image_standardization(images), labels


def distorted_dataset(data_dir, batch_size, distort=True):
  """Endless, shuffled training batches: ONE pipeline that all towers draw from.

  Raw records are shuffled (cheap: 3 KB each), batched, then decoded and
  distorted a batch at a time, several batches in parallel (as many as tf.data
  finds useful on this machine), and prefetched so the towers never wait on a
  half-built batch.

  Args:
    data_dir: str, holds cifar-10-batches-bin/ (see maybe_download_and_extract).
    batch_size: int, images per batch (per tower).
    distort: bool; False gives central crops, for tests and timing.

  Returns:
    tf.data.Dataset of (float32 [batch_size, 24, 24, 3], int32 [batch_size]).
  """
  paths = [os.path.join(batches_dir(data_dir), f) for f in TRAIN_FILES]
  check_data_files(paths)
  dataset = tf.data.FixedLengthRecordDataset(paths, RECORD_BYTES)
  dataset = dataset.shuffle(SHUFFLE_BUFFER).repeat()
  dataset = dataset.batch(batch_size, drop_remainder=True)
  dataset = dataset.map(_distort_batch if distort else _center_batch,
                        num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE)


def distorted_inputs(data_dir, batch_size):
  """One augmented training batch per evaluation of the returned tensors.

  Returns:
    images: float32 [batch_size, 24, 24, 3].
    labels: int32 [batch_size].
  """
  dataset = distorted_dataset(data_dir, batch_size)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def eval_dataset(eval_data, data_dir, batch_size):
  """Every record of the chosen split exactly once, in file order.

  Args:
    eval_data: 'test' (test_batch.bin) or 'train_eval' (the five training files).
    data_dir: str, holds cifar-10-batches-bin/.
    batch_size: int; the last batch holds the remainder, so no record is counted
      twice and none is left out.

  Returns:
    (tf.data.Dataset of (float32 [<=batch_size, 24, 24, 3], int32 [<=batch_size]),
     number of records).
  """
  if eval_data not in ('test', 'train_eval'):
    raise DataError("eval_data must be 'test' or 'train_eval', got %r" % (eval_data,))
  files = TEST_FILES if eval_data == 'test' else TRAIN_FILES
  paths = [os.path.join(batches_dir(data_dir), f) for f in files]
  num_records = check_data_files(paths)
  dataset = tf.data.FixedLengthRecordDataset(paths, RECORD_BYTES).batch(batch_size)
  dataset = dataset.map(_center_batch, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE), num_records


def inputs(eval_data, data_dir, batch_size):
  """Evaluation batches, one pass: central 24x24 crops, standardised.

  Returns:
    images: float32 [<=batch_size, 24, 24, 3]; the last batch may be smaller.
    labels: int32 [<=batch_size].
    The tensors raise tf.errors.OutOfRangeError after the last record.
  """
  dataset, _ = eval_dataset(eval_data, data_dir, batch_size)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def synthetic_dataset(batch_size, seed=0):
  """Random standardised images and labels held in memory, for timing compute alone.

  One batch is made once with numpy and repeated: no files, no decoding.

  Returns:
    tf.data.Dataset of (float32 [batch_size, 24, 24, 3], int32 [batch_size]).
  """
  rng = np.random.default_rng(seed)
  images = rng.standard_normal((batch_size, CROP_SIZE, CROP_SIZE, DEPTH), np.float32)
  labels = rng.integers(0, 10, batch_size, dtype=np.int32)
  return tf.data.Dataset.from_tensors((images, labels)).repeat()
