"""CIFAR-10 bytes to tensors: download, verify, extract, read, distort, batch.

The binary CIFAR-10 files hold fixed-length records of 1 label byte followed by
3072 pixel bytes: the red plane (32x32, row-major), then green, then blue.

    maybe_download_and_extract(data_dir)        fetch + check the six .bin files
    distorted_inputs(data_dir, batch_size)       training batches, augmented
    inputs(eval_data, data_dir, batch_size)      evaluation batches, one pass
    eval_images(images)                          uint8 images -> what the network reads
    python cifar10_input.py --write_sample=DIR   a small learnable set in the same layout,
                                                 and PNG images of it to classify

Every path and size arrives as an argument; only the program (main) reads flags. Problems
with the files raise DataError with a message naming the file and the fix.
"""
import os

if __name__ == '__main__':  # --write_sample=DIR: first Python 3.11+, then TensorFlow quietly
  import sys
  from training import prelude
  prelude.check_python()
  prelude.answer_help(sys.argv)  # --help exits 0, --helpshort lists this program's flags
  prelude.import_tensorflow()

import collections
import gzip
import hashlib
import io
import posixpath
import re
import shutil
import struct
import sys
import tarfile
import tempfile
import time
import urllib.parse
import zlib

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from cifar10.model import CLASS_NAMES
from training import errors, input_data, machine, storage

# ---- The data set, as published ---------------------------------------------
DATA_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
DATA_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
DATA_BYTES = 170052171                # size of the official archive
OWN_COPY_MAX_BYTES = 2 * DATA_BYTES   # a download of a copy of your own (--data_md5) stops past this
BATCHES_DIR = 'cifar-10-batches-bin'  # the archive's top directory, under data_dir
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILES = ['test_batch.bin']
ARCHIVE_MEMBERS = ({BATCHES_DIR} |    # everything the archive may contain; nothing else
                   {posixpath.join(BATCHES_DIR, f) for f in
                    TRAIN_FILES + TEST_FILES + ['batches.meta.txt', 'readme.html']})

RECORDS_PER_FILE = 10000             # in each official file
NUM_CLASSES = 10                      # labels 0..9

LABEL_BYTES = 1
HEIGHT, WIDTH, DEPTH = 32, 32, 3
IMAGE_BYTES = HEIGHT * WIDTH * DEPTH  # 3072
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES  # 3073
CROP_SIZE = 24                        # pixels; the model's IMAGE_SIZE

# ---- Input pipeline knobs -------------------------------------------------------
SHUFFLE_BUFFER = 20000                # records (61 MB raw): 40% of an epoch, as the tutorial
SAMPLE_RECORDS_PER_FILE = 1000        # --write_sample: 6 files of 3 MB, learnable in minutes
SAMPLE_IMAGES_DIR = 'images'          # --write_sample: DIR/images/cat.png, ..., to classify
EXTRACT_PREFIX = '.extract-'          # + PID: a temporary directory being extracted into


DataError = errors.DataError  # the data set is missing, damaged or unsafe


def batches_dir(data_dir):
  """Where the .bin files live: data_dir/cifar-10-batches-bin."""
  return os.path.join(data_dir, BATCHES_DIR)


def train_files(data_dir):
  """The training files' paths: what one epoch reads."""
  return [os.path.join(batches_dir(data_dir), name) for name in TRAIN_FILES]


def train_records(data_dir):
  """Records in the five training files, and which files: one epoch of training.

  The official files hold 10,000 each (the tutorial's 50,000); a sample or a copy
  of your own counts what it holds, so the schedule's epochs are its own.
  """
  count = sum(storage.size(os.path.join(batches_dir(data_dir), name)) // RECORD_BYTES
              for name in TRAIN_FILES)
  return count, '%s .. %s' % (TRAIN_FILES[0], TRAIN_FILES[-1])


def check_data_files(paths, records_per_file=None):
  """Checks that each file exists and holds whole records with labels 0..9.

  Runs before any graph or session, so a bad file stops the run with a message
  instead of an OutOfRange error, a hang, or a label error many steps later.
  Reading the labels costs one byte in 3073: well under a second for 60,000.

  Args:
    paths: list of file paths.
    records_per_file: int, the exact count each file must hold (the official
      archive's 10000), or None to accept any non-zero count.

  Returns:
    int, the total number of records.

  Raises:
    DataError: naming the first bad file, what is wrong with it and what to do.
  """
  total = 0
  for path in paths:
    if not storage.isfile(path):
      raise DataError(
          '%s is missing. Run with the data directory that holds the extracted '
          'CIFAR-10 binary files (--data_dir), or remove %s so they are downloaded '
          'again.' % (path, os.path.dirname(path)))
    size = storage.size(path)
    if size == 0 or size % RECORD_BYTES:
      raise DataError(
          '%s has %d bytes; expected a non-zero multiple of %d (records of 1 label '
          'byte + 3072 pixel bytes; each official file is 10000 records, %d bytes). '
          'The file is truncated or not CIFAR-10 binary data: remove %s to download '
          'it again.' % (path, size, RECORD_BYTES, RECORDS_PER_FILE * RECORD_BYTES,
                         os.path.dirname(path)))
    count = size // RECORD_BYTES
    if records_per_file and count != records_per_file:
      raise DataError(
          '%s holds %d records; each file of the official archive holds %d. The file '
          'is cut short or not from that archive: remove %s to extract it again, or, '
          'for a copy of your own, pass its md5 as --data_md5.'
          % (path, count, records_per_file, os.path.dirname(path)))
    labels = (np.memmap(path, np.uint8, 'r', shape=(count, RECORD_BYTES)) if
              storage.is_local(path) else  # an object: read whole, as training will
              np.frombuffer(storage.read(path), np.uint8).reshape(count, RECORD_BYTES))[:, 0]
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if bad.size:
      raise DataError(
          '%s record %d has label %d; CIFAR-10 labels are 0..%d (%d of its %d records '
          'are out of range). The file is damaged or not CIFAR-10 binary data: remove '
          '%s to download it again.' % (path, bad[0], labels[bad[0]], NUM_CLASSES - 1,
                                        bad.size, count, os.path.dirname(path)))
    total += count
  return total


def check_train_files(data_dir):
  """Checks the five training files again (check_data_files): after a TensorFlow error
  in the step loop, whether one was cut or relabelled under the running trainer
  (DataError naming it)."""
  check_data_files([os.path.join(batches_dir(data_dir), f) for f in TRAIN_FILES])


def _extract(archive, data_dir, records_per_file=None):
  """Extracts the expected members of `archive` into data_dir, refusing anything else.

  Every member is checked before any byte is written: no absolute path, no `..`,
  no link, device or fifo, and only names in ARCHIVE_MEMBERS. Files are written
  into a temporary directory inside data_dir, which is renamed into place at the
  end, so a failure leaves no partial cifar-10-batches-bin behind. A damaged
  cifar-10-batches-bin already there is replaced only once the new one is whole.
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
      missing = sorted(posixpath.join(BATCHES_DIR, f) for f in TRAIN_FILES + TEST_FILES
                       if posixpath.join(BATCHES_DIR, f) not in
                       {posixpath.normpath(m.name) for m in members if m.isreg()})
      if missing:  # said here, naming the archive: not the temporary directory below
        raise DataError('%s has no %s: it is not a whole CIFAR-10 binary archive. Remove it '
                        'to download it again, or check --data_url.'
                        % (archive, ', '.join(missing)))
      tmp_dir = tempfile.mkdtemp(prefix='%s%d-' % (EXTRACT_PREFIX, os.getpid()),
                                 dir=data_dir)
      try:
        os.mkdir(os.path.join(tmp_dir, BATCHES_DIR))
        for member in members:
          if member.isreg():
            target = os.path.join(tmp_dir, posixpath.normpath(member.name))
            with tar.extractfile(member) as src, open(target, 'wb') as dst:
              shutil.copyfileobj(src, dst)
        check_data_files([os.path.join(tmp_dir, BATCHES_DIR, f)
                          for f in TRAIN_FILES + TEST_FILES], records_per_file)
        if os.path.isdir(batches_dir(data_dir)):  # damaged
          _set_aside_damaged(data_dir, tmp_dir)
        os.rename(os.path.join(tmp_dir, BATCHES_DIR), batches_dir(data_dir))
      finally:
        shutil.rmtree(tmp_dir)  # made above, holding only what was extracted into it
  except (tarfile.TarError, EOFError, OSError) as e:
    raise DataError('cannot extract %s: %s. Remove it to download it again.'
                    % (archive, e)) from e
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as signals.Interrupted
    e.during = ('the extraction of %s; its temporary directory is removed, the verified '
                'archive kept' % archive)
    raise


def _set_aside_damaged(data_dir, tmp_dir):
  """Moves a damaged cifar-10-batches-bin out of the way of the new one. Holding only
  the archive's files, it goes with tmp_dir; holding anything else (a user's notes),
  it is kept whole beside it, as cifar-10-batches-bin.damaged-<time>, and said so."""
  damaged = batches_dir(data_dir)
  foreign = sorted(set(os.listdir(damaged)) - {posixpath.basename(m) for m in ARCHIVE_MEMBERS})
  if not foreign:
    os.rename(damaged, os.path.join(tmp_dir, 'damaged'))
    return
  kept = '%s.damaged-%s' % (damaged, time.strftime('%Y%m%d-%H%M%S'))
  os.rename(damaged, kept)
  print('%s held files the archive does not (%s): kept whole as %s; the new copy takes '
        'its place' % (damaged, ', '.join(foreign[:3]) + (', ...' if len(foreign) > 3 else ''),
                       kept))


def maybe_download_and_extract(data_dir, data_url=None, data_md5=None, deadlines=None):
  """Makes sure data_dir/cifar-10-batches-bin holds six good .bin files.

  Nothing is downloaded when the extracted files are already there. A missing or
  damaged extracted file is extracted again when the archive beside it has the
  right md5 (saying so); otherwise the run stops with a message saying what to
  remove. With the official archive's md5 each file must hold 10000 records; with
  a copy of the user's own (another --data_md5), the counts are printed.

  Args:
    data_dir: str, directory for the archive and the extracted files.
    data_url: str, where to fetch the archive (default: the official copy).
    data_md5: str, the archive's md5 (default: the official archive's).
    deadlines: input_data.Deadlines of a download (default: input_data's constants).

  Returns:
    str, the directory holding the .bin files.

  Raises:
    DataError: with what is wrong and what to do.
  """
  if data_md5 and not re.fullmatch(r'[0-9a-fA-F]{32}', data_md5):
    raise DataError('--data_md5=%s is not an md5 (32 hex digits); nothing was read or '
                    'written. Give the md5 of your copy of the archive (md5sum prints it), '
                    'or drop --data_md5 for the official one.' % data_md5)
  data_url = data_url or DATA_URL
  data_md5 = (data_md5 or DATA_MD5).lower()
  official = data_md5 == DATA_MD5
  per_file = RECORDS_PER_FILE if official else None
  dest = batches_dir(data_dir)
  paths = [os.path.join(dest, f) for f in TRAIN_FILES + TEST_FILES]
  name = posixpath.basename(urllib.parse.urlparse(data_url).path) or 'cifar-10-binary.tar.gz'
  archive = os.path.join(data_dir, name)
  if storage.is_local(data_dir) and os.path.isdir(data_dir):
    _remove_killed_downloads(data_dir, name)
  if not storage.is_local(data_dir):
    verified = _check_in_store(paths, per_file, data_dir)
  elif os.path.isdir(dest):
    verified = _check_or_extract_again(paths, per_file, archive, data_md5, data_dir)
  else:
    _fetch(data_url, data_dir, archive, data_md5, DATA_BYTES if official else None,
           deadlines or input_data.Deadlines())
    _extract(archive, data_dir, per_file)
    print('Extracted %s' % dest)
    verified = True
  if not official:
    md5 = data_md5 if verified else _own_md5(archive, data_md5, dest)
    print('CIFAR-10 copy with md5 %s in %s: %s' % (md5, dest, ', '.join(
        '%s %d records' % (os.path.basename(p), storage.size(p) // RECORD_BYTES)
        for p in paths)))
  return dest


def _check_in_store(paths, per_file, data_dir):
  """Checks the extracted files of a --data_dir on an object store (gs://). The download
  and the extraction write to a local --data_dir only, so a file missing or damaged
  there stops the run saying how to put a copy in place. Returns False: no md5 checked."""
  try:
    check_data_files(paths, per_file)
  except DataError as e:
    raise DataError(
        '%s On an object store the data set is not downloaded or extracted: download it '
        'into a local --data_dir, then copy %s/ (and the archive) to %s (gsutil -m cp -r), '
        'or write a sample there: python cifar10_input.py --write_sample=%s'
        % (str(e).split('. ')[0] + '.', BATCHES_DIR, data_dir, data_dir)) from None
  return False


def _check_or_extract_again(paths, per_file, archive, data_md5, data_dir):
  """Checks the extracted files at paths; a missing or damaged one is extracted again
  when the archive beside them has md5 data_md5 (saying so), else DataError.

  Returns:
    bool, whether the archive's md5 was checked on the way (it was extracted again).
  """
  try:
    check_data_files(paths, per_file)
    return False
  except DataError as e:
    found = os.path.isfile(archive) and input_data.md5_of(archive)
    if not found:
      raise
    what = str(e).split('. ')[0] + '.'
    if found != data_md5:  # another copy: a sample's, or the user's own
      raise DataError(
          '%s The archive beside it, %s, has md5 %s, not %s: to use this copy, pass '
          '--data_md5=%s; for the expected archive instead, remove %s and %s.'
          % (what, archive, found, data_md5, found, archive, batches_dir(data_dir))) from None
    print('%s Extracting it again from the verified archive %s.' % (what, archive))
    _extract(archive, data_dir, per_file)
    return True


def _own_md5(archive, data_md5, dest):
  """--data_md5 of a copy of the user's own whose extracted files were already there,
  checked against the archive beside them: the md5 to print, with 'not checked (no
  archive beside it)', or a DataError when the archive has another."""
  found = storage.isfile(archive) and input_data.md5_of(archive)
  if not found:
    return '%s, not checked (no archive beside it)' % data_md5
  if found != data_md5:
    raise DataError('--data_md5=%s is not the md5 of %s, which has md5 %s: pass '
                    '--data_md5=%s to use the copy in %s, or remove %s and %s to fetch the '
                    'archive of md5 %s.' % (data_md5, archive, found, found, dest, archive,
                                            dest, data_md5))
  return data_md5


def _fetch(data_url, data_dir, archive, data_md5, expected_bytes, deadlines):
  """Downloads the archive unless a copy with the right md5 is already there.

  data_dir is created only for the download, and removed again, when it was
  created here and is still empty, if the download fails.
  """
  if os.path.exists(archive):
    md5 = input_data.md5_of(archive)
    if md5 != data_md5:
      raise DataError('%s is already there but has md5 %s, expected %s. Remove it to '
                      'download it again, or pass --data_md5=%s if it is the copy you '
                      'want.' % (archive, md5, data_md5, md5))
    return
  created = input_data.make_data_dir(data_dir)
  try:
    input_data.download(
        data_url, archive, data_md5, expected_bytes, deadlines=deadlines,
        limit=None if expected_bytes else input_data.Limit(
            OWN_COPY_MAX_BYTES, 'a copy of your own: OWN_COPY_MAX_BYTES in cifar10_input.py, '
            'twice the official archive'),
        offline_hint='To try the program without the data set: python cifar10_input.py '
                     '--write_sample=/tmp/cifar10_sample',
        mismatch_hint='If you trust this copy, pass its md5 as --data_md5.')
  except BaseException:
    input_data.remove_if_empty(data_dir, created)
    raise


def _remove_killed_downloads(data_dir, name):
  """Temporary names of killed downloads and extractions (see training/input_data.py)."""
  input_data.remove_killed_downloads(data_dir, [
      re.escape(EXTRACT_PREFIX) + r'(\d+)-',
      re.escape('.%s.' % name) + r'(\d+)\..*\.part$'])


def decode_records(records):
  """Turns a batch of 3073-byte records into images and labels.

  Args:
    records: string tensor [batch] of RECORD_BYTES bytes each.

  Returns:
    images: uint8 [batch, 32, 32, 3], height x width x channel (RGB).
    labels: int32 [batch], 0..9.
  """
  return _split_records(tf.io.decode_raw(records, tf.uint8))


def _split_records(raw):
  """uint8 [batch, 3073] records -> (uint8 [batch, 32, 32, 3] HWC images, int32 labels).

  The three channel planes are stacked last rather than transposed: with oneDNN on, a
  Transpose of uint8 finds no oneDNN kernel, and TensorFlow says so in an error-looking
  line (`E... oneDNN supports DT_UINT8 only on platforms with AVX-512`, on CPUs with it
  too) before its own kernel does the work. Casting to float32 first does not avoid it:
  TensorFlow's graph optimizer moves the transpose back before the cast.
  """
  labels = tf.cast(raw[:, 0], tf.int32)
  depth_major = tf.reshape(raw[:, LABEL_BYTES:], [-1, DEPTH, HEIGHT, WIDTH])
  return tf.stack(tf.unstack(depth_major, axis=1), axis=-1), labels


def decode_record(value):
  """One record: uint8 image [32, 32, 3] and int32 label (see decode_records)."""
  images, labels = decode_records(tf.expand_dims(value, 0))
  return images[0], labels[0]


# Each image's random values for the tutorial's distortions, one row per image.
Draws = collections.namedtuple('Draws', [
    'corners',     # int32 [batch, 2]: the crop's top-left (y, x), each 0..8
    'flips',       # bool [batch]: mirror left-right
    'brightness',  # float32 [batch]: added to every pixel, -63..63
    'contrast',    # float32 [batch]: factor about each channel's mean, 0.2..1.8
])
MAX_CORNER = HEIGHT - CROP_SIZE       # 8
MAX_BRIGHTNESS_DELTA = 63.0           # tf.image.random_brightness's max_delta, as the tutorial
CONTRAST_RANGE = (0.2, 1.8)           # tf.image.random_contrast's lower and upper


def _random_draws(batch):
  """Fresh values from TensorFlow's random generators: the unseeded pipeline."""
  return Draws(
      tf.random.uniform([batch, 2], 0, MAX_CORNER + 1, tf.int32),
      tf.random.uniform([batch]) < 0.5,
      tf.random.uniform([batch], -MAX_BRIGHTNESS_DELTA, MAX_BRIGHTNESS_DELTA),
      tf.random.uniform([batch], *CONTRAST_RANGE))


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
  return _distort(tf.io.decode_raw(records, tf.uint8), _random_draws(records.shape[0]))


def _distort(raw, draws):
  """Crop, flip, brightness, contrast and standardisation of each image, as `draws` say.

  Args:
    raw: uint8 [batch, 3073] records (static batch size).
    draws: Draws for the batch.

  Returns:
    images: float32 [batch, 24, 24, 3], standardised per image.
    labels: int32 [batch].
  """
  batch = raw.shape[0]
  images, labels = _split_records(raw)
  images = tf.cast(images, tf.float32)
  # The 24x24 crop at each corner; 'nearest' at integer coordinates copies pixels exactly.
  corners = tf.cast(draws.corners, tf.float32)
  boxes = tf.concat([corners, corners + CROP_SIZE - 1], axis=1) / (HEIGHT - 1)
  images = tf.image.crop_and_resize(images, boxes, tf.range(batch), [CROP_SIZE, CROP_SIZE],
                                    method='nearest')
  per_image = lambda values: tf.reshape(values, [batch, 1, 1, 1])
  images = tf.where(per_image(draws.flips), tf.reverse(images, axis=[2]), images)
  # Brightness, then contrast about each channel's mean (tf.image.random_brightness
  # and random_contrast, per image).
  images += per_image(draws.brightness)
  mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
  images = (images - mean) * per_image(draws.contrast) + mean
  images = tf.image.per_image_standardization(images)
  images.set_shape([batch, CROP_SIZE, CROP_SIZE, DEPTH])
  return images, labels


def _center_batch(records):
  """Central 24x24 crops, standardised, and the labels, for any batch size."""
  images, labels = decode_records(records)
  return eval_images(images), labels


def eval_images(images):
  """The evaluation's preprocessing: the central 24x24 crop, standardised per image.

  The evaluation's reader and export_model.py's SavedModel both call it.

  Args:
    images: uint8 [batch, 32, 32, 3], height x width x channel (RGB).

  Returns:
    float32 [batch, 24, 24, 3].
  """
  offset = (HEIGHT - CROP_SIZE) // 2
  images = tf.cast(images[:, offset:offset + CROP_SIZE, offset:offset + CROP_SIZE, :],
                   tf.float32)
  return tf.image.per_image_standardization(images)


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


def seeded_dataset(data_dir, global_batch, seed, start_step=0):
  """Training batches that repeat exactly, whatever the towers, and resume exactly.

  Each sample's record, crop, flip, brightness and contrast are fixed by
  (seed, epoch, its position in the epoch) alone (input_data.seeded_dataset). So a
  global batch holds the same images distorted the same way however it is split
  into towers. The records are held in memory (150 MB for CIFAR-10) so that any
  of them can be picked.

  Args:
    data_dir: str, holds cifar-10-batches-bin/.
    global_batch: int, images per step over all towers; split them in order.
    seed: int >= 0.
    start_step: int, the global step the run starts from.

  Returns:
    (tf.data.Dataset of (float32 [global_batch, 24, 24, 3], int32 [global_batch]),
     the op that loads the records, to run once in the session).
  """
  paths = [os.path.join(batches_dir(data_dir), f) for f in TRAIN_FILES]
  num_records = check_data_files(paths)
  with tf.device('/cpu:0'):
    records = input_data.records_variable(tf.concat(
        [tf.reshape(tf.io.decode_raw(tf.io.read_file(p), tf.uint8), [-1, RECORD_BYTES])
         for p in paths], axis=0), name='seeded_records')
  dataset = input_data.seeded_dataset(records, num_records, global_batch, seed, start_step,
                                     num_uniforms=5, to_batch=_distort_seeded)
  return dataset, records.initializer


def _distort_seeded(raw, uniforms):
  """_distort() with its Draws made from five uniforms [0, 1) per image."""
  draws = Draws(
      tf.cast(uniforms[:, 0:2] * (MAX_CORNER + 1), tf.int32),
      uniforms[:, 2] < 0.5,
      (uniforms[:, 3] * 2 - 1) * MAX_BRIGHTNESS_DELTA,
      CONTRAST_RANGE[0] + uniforms[:, 4] * (CONTRAST_RANGE[1] - CONTRAST_RANGE[0]))
  return _distort(raw, draws)


def distorted_inputs(data_dir, batch_size):
  """One augmented training batch per evaluation of the returned tensors.

  Returns:
    images: float32 [batch_size, 24, 24, 3].
    labels: int32 [batch_size].
  """
  dataset = input_data.closing_at_once(distorted_dataset(data_dir, batch_size))
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
  dataset = input_data.closing_at_once(dataset)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def synthetic_dataset(batch_size, seed=0):
  """Random standardised images and labels held in memory, for timing compute alone.

  One batch is made once and repeated (input_data.repeated_batch): no files, no
  decoding. The same seed gives the same batch in every process.

  Returns:
    tf.data.Dataset of (float32 [batch_size, 24, 24, 3], int32 [batch_size]).
  """
  def make_batch():
    images = tf.random.stateless_normal([batch_size, CROP_SIZE, CROP_SIZE, DEPTH], [seed, 0])
    labels = tf.random.stateless_uniform([batch_size], [seed, 1], minval=0, maxval=10,
                                         dtype=tf.int32)
    return images, labels
  return input_data.repeated_batch(make_batch)


# ---- A small learnable sample in the real layout, for trying the program offline ----

# Class k is a colour in its own stripe layout (direction and width), but each image
# shows it shifted, faded and jittered in colour under heavy noise, and a fixed share
# of the labels is wrong: learnable over a few hundred steps, never perfectly.
_SAMPLE_COLOURS = np.array([[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200],
                            [245, 130, 48], [145, 30, 180], [70, 240, 240], [240, 50, 230],
                            [210, 245, 60], [250, 190, 190]], np.float32)
SAMPLE_NOISE = 55.0                   # std of the per-pixel noise, in pixel values 0..255
SAMPLE_COLOUR_JITTER = 30.0           # std of each image's shift of its class colour, per channel
SAMPLE_MAX_SHIFT = 8                  # pixels; each image's stripes move by up to this
SAMPLE_LABEL_NOISE = 0.04             # share of records per file whose label is another class's


def make_records(labels, rng, learnable=True):
  """Records in the binary layout: uint8 [n, 3073], the label byte then CHW pixels.

  Args:
    labels: ints 0..9 (any byte value is written as given).
    rng: numpy Generator.
    learnable: the pixels show the label (colour and stripes, shifted, faded and
      noisy); False: random pixels.
  """
  labels = np.asarray(labels, np.uint8)
  n = len(labels)
  if learnable:
    classes = labels.astype(np.int64) % NUM_CLASSES
    shift = rng.integers(-SAMPLE_MAX_SHIFT, SAMPLE_MAX_SHIFT + 1, n)
    rows, cols = np.arange(HEIGHT)[None, :, None], np.arange(WIDTH)[None, None, :]
    along = np.where((classes % 2 == 0)[:, None, None], rows, cols)  # stripe direction
    width = (3 + (classes // 2) % 3)[:, None, None]                   # 3, 4 or 5 pixels
    mask = (((along + shift[:, None, None]) // width) % 2)[..., None].astype(np.float32)
    colour = _SAMPLE_COLOURS[classes] + rng.normal(0, SAMPLE_COLOUR_JITTER, (n, DEPTH))
    strength = rng.uniform(0.5, 1.0, (n, 1, 1, 1))      # how far the stripes stand out
    background = rng.uniform(20, 100, (n, 1, 1, 1))
    pixels = background + strength * mask * (colour[:, None, None, :] - background)
    pixels += rng.normal(0, SAMPLE_NOISE, pixels.shape)
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
  else:
    pixels = rng.integers(0, 256, (n, HEIGHT, WIDTH, DEPTH), dtype=np.uint8)
  chw = pixels.transpose(0, 3, 1, 2).reshape(n, IMAGE_BYTES)
  return np.concatenate([labels[:, None], chw], axis=1)


def _mislabel(records, rng):
  """Gives round(SAMPLE_LABEL_NOISE * n) records of `records` another class's label."""
  n = len(records)
  wrong = rng.choice(n, int(round(SAMPLE_LABEL_NOISE * n)), replace=False)
  records[wrong, 0] = (records[wrong, 0] + rng.integers(1, NUM_CLASSES, len(wrong))) % NUM_CLASSES
  return records


def write_sample(data_dir, records_per_file=SAMPLE_RECORDS_PER_FILE, seed=0,
                 learnable=True):
  """Writes a small data set in the real layout: the archive and its extracted files.

  data_dir/cifar-10-binary.tar.gz holds data_batch_1..5.bin and test_batch.bin of
  records_per_file records each; they are also extracted into
  data_dir/cifar-10-batches-bin/, as maybe_download_and_extract() would. The same
  seed writes the same bytes, so the archive has the same md5 in every directory.
  data_dir/images/<class>.png (cat.png, ...) shows the first rightly labelled test
  record of each class, for classify.py.

  Returns:
    str, the archive's md5: train with --data_md5=<it> (a copy of your own).

  Raises:
    DataError: data_dir already holds a data set (nothing is overwritten).
  """
  archive = os.path.join(data_dir, 'cifar-10-binary.tar.gz')
  images_dir = os.path.join(data_dir, SAMPLE_IMAGES_DIR)
  for path in (archive, batches_dir(data_dir), images_dir):
    if storage.exists(path):
      raise DataError('%s already exists; nothing was written. Choose another directory '
                      'for the sample, or remove it.' % path)
  rng = np.random.default_rng(seed)
  members = []
  for name in TRAIN_FILES + TEST_FILES:
    labels = rng.integers(0, NUM_CLASSES, records_per_file)
    records = make_records(labels, rng, learnable)
    if learnable:
      records = _mislabel(records, rng)
    members.append((posixpath.join(BATCHES_DIR, name), records.tobytes()))
  images = _class_images(records, labels)  # of test_batch.bin, the last file
  packed = _tar_gz(members)
  storage.makedirs(batches_dir(data_dir))  # a local path or a URL (gs://)
  storage.write(archive, packed)
  for name, data in members:
    storage.write(os.path.join(data_dir, name), data)
  storage.makedirs(images_dir)
  for name, png in images.items():
    storage.write(os.path.join(images_dir, name + '.png'), png)
  return hashlib.md5(packed).hexdigest()


def _tar_gz(members):
  """bytes: a .tar.gz of members [(name, bytes)] that is the same for the same members:
  no time, owner or file name in it, the members in order of name."""
  packed = io.BytesIO()
  with gzip.GzipFile(filename='', mode='wb', fileobj=packed, mtime=0) as gz:
    with tarfile.open(fileobj=gz, mode='w') as tar:
      for name, data in sorted(members):
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        info.uid, info.gid, info.uname, info.gname = 0, 0, '', ''
        tar.addfile(info, io.BytesIO(data))
  return packed.getvalue()


def _class_images(records, labels):
  """{class name: PNG bytes} of the first record of each class whose label byte is its
  pattern's label (records: uint8 [n, 3073]; labels: the patterns' labels [n])."""
  images = {}
  for record, label in zip(records, labels):
    name = CLASS_NAMES[label]
    if record[0] == label and name not in images:
      pixels = record[LABEL_BYTES:].reshape(DEPTH, HEIGHT, WIDTH).transpose(1, 2, 0)
      images[name] = _png(pixels)
  return images


def _png(pixels):
  """bytes: an 8-bit RGB PNG of pixels, uint8 [height, width, 3], every row unfiltered."""
  def chunk(kind, data):
    crc = zlib.crc32(kind + data)
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', crc)
  height, width, _ = pixels.shape
  rows = b''.join(b'\0' + row.tobytes() for row in pixels)  # filter type 0 before each row
  return (b'\x89PNG\r\n\x1a\n' +
          chunk(b'IHDR', struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)) +
          chunk(b'IDAT', zlib.compress(rows, 9)) + chunk(b'IEND', b''))


def define_flags(flag_values=flags.FLAGS):
  """--write_sample's flags; called when this file runs as a program."""
  flags.DEFINE_string('write_sample', None, 'directory to write cifar-10-binary.tar.gz, '
                      'cifar-10-batches-bin/ and images/ into', flag_values=flag_values)
  flags.DEFINE_integer('records_per_file', SAMPLE_RECORDS_PER_FILE,
                       'records in each of the six files', flag_values=flag_values)


def main(argv, flag_values=flags.FLAGS):
  """python cifar10_input.py --write_sample=DIR: a sample data set, and how to train on it."""
  with errors.one_line_errors():
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
  if flag_values.write_sample is None:
    sys.exit('error: --write_sample=DIR is required: the directory to write the sample into.')
  if flag_values.records_per_file < 1:
    sys.exit('error: --records_per_file must be at least 1, got %d'
             % flag_values.records_per_file)
  try:
    storage.check(flag_values.write_sample, '--write_sample')
    md5 = write_sample(flag_values.write_sample, flag_values.records_per_file)
  except (DataError, errors.TrainingError) as e:
    sys.exit('error: %s' % e)
  except OSError as e:
    sys.exit('error: cannot write the sample into %s: %s' % (flag_values.write_sample,
                                                             e.strerror or e))
  data_dir = storage.abspath(flag_values.write_sample)
  print('Wrote a learnable sample, %d records per file, to %s (archive md5 %s).'
        % (flag_values.records_per_file, batches_dir(data_dir), md5))
  data = '--data_dir=%s --data_md5=%s' % (data_dir, md5)
  print('Train on it, then evaluate:\n'
        '  python multi_gpu_train.py --num_gpus=2 --batch_size=32 --max_steps=400 %s '
        '--train_dir=%s_train\n'
        '  python cifar10_eval.py --run_once %s --checkpoint_dir=%s_train --eval_dir=%s_eval\n'
        'Or train on 1 ps task and 2 workers on this machine, then evaluate into an event '
        'folder of its own:\n'
        '  python dist_train.py --local_cluster=1,2 --batch_size=32 --max_steps=400 %s '
        '--train_dir=%s_dist_train\n'
        '  python cifar10_eval.py --run_once %s --checkpoint_dir=%s_dist_train '
        '--eval_dir=%s_dist_eval\n'
        'Then export the first model and classify the sample\'s test images, one per class:\n'
        '  python export_model.py --train_dir=%s_train --export_dir=%s_model\n'
        '  python classify.py --model_dir=%s_model %s/*.png'
        % (data, data_dir, data, data_dir, data_dir, data, data_dir, data, data_dir, data_dir,
           data_dir, data_dir, data_dir, os.path.join(data_dir, SAMPLE_IMAGES_DIR)))



# The names every data set's input module gives the trainers (data_sets.DATASETS).
prepare = maybe_download_and_extract
train_dataset = distorted_dataset


if __name__ == '__main__':
  define_flags()
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
