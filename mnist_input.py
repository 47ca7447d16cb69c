"""MNIST bytes to tensors, as the book's chapter 12 reads them: TFRecord files, tf.data.

    maybe_download_and_convert(data_dir)          train.tfrecords, test.tfrecords, checked
    train_dataset(data_dir, batch_size)           shuffled, repeated, static-shaped batches
    eval_dataset(eval_data, data_dir, batch_size) every record once, in file order
    eval_images(images)                           uint8 images -> what the network reads
    python mnist_input.py --write_sample=DIR      a small learnable set in the same layout

One tf.train.Example per image, with the book's features: image_raw (bytes: 784
uint8 pixels, row-major), pixels (int64: 784) and label (int64: 0..9). Files of
that layout already in --data_dir are used as they are, whoever wrote them: that
is how to bring your own data. Pixels are cast to float32 without scaling (0..255),
as the book's reader did; its learning rate is tuned for that.
"""
import os

if __name__ == '__main__':  # --write_sample=DIR: first Python 3.11+, then TensorFlow quietly
  import sys
  from training import prelude
  prelude.check_python()
  prelude.answer_help(sys.argv)  # --help exits 0, --helpshort lists this program's flags
  prelude.import_tensorflow()

import gzip
import re
import struct
import sys

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from training import errors, input_data, machine, storage

# ---- The data set, as published ------------------------------------------------
DATA_URL = 'https://storage.googleapis.com/cvdf-datasets/mnist/'  # TensorFlow's copy
SOURCES = {  # name: (bytes, md5), the md5s as published with torchvision's MNIST
    'train-images-idx3-ubyte.gz': (9912422, 'f68b3c2dcbeaaa9fbdd348bbdeb94873'),
    'train-labels-idx1-ubyte.gz': (28881, 'd53e105ee54ea40749a09fcbcd1e9432'),
    't10k-images-idx3-ubyte.gz': (1648877, '9fb629c4189551a2d022fa330f9573f3'),
    't10k-labels-idx1-ubyte.gz': (4542, 'ec29112dd5afa0611ce80d1b7f02629c'),
}
SPLITS = {  # record file: (images IDX file, labels IDX file)
    'train.tfrecords': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test.tfrecords': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
TRAIN_FILE, TEST_FILE = 'train.tfrecords', 'test.tfrecords'
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049  # IDX headers: uint8 images [n, 28, 28], labels [n]
IMAGE_SIZE = 28
IMAGE_PIXELS = IMAGE_SIZE * IMAGE_SIZE  # 784
NUM_CLASSES = 10

# ---- Input pipeline knobs -------------------------------------------------------
SHUFFLE_BUFFER = 10000                # records (7.8 MB): a sixth of an epoch
SAMPLE_TRAIN_RECORDS = 20000          # --write_sample: 10 epochs in the book's 1,000 steps x 2 towers
SAMPLE_TEST_RECORDS = 1000

DataError = errors.DataError


# ---- Checking record files before a session -----------------------------------

def read_records(path):
  """Reads and checks every record of a TFRecord file in the book's layout.

  Returns:
    (images uint8 [n, 784], labels int64 [n]).

  Raises:
    DataError: as check_records.
  """
  images, labels = [], []
  for image, label in _checked(path):
    images.append(image)
    labels.append(label)
  return np.stack(images), np.array(labels, np.int64)


def train_files(data_dir):
  """The training file's path, in a list: what one epoch reads."""
  return [os.path.join(data_dir, TRAIN_FILE)]


def train_records(data_dir):
  """Records in train.tfrecords, and that name: one epoch of training (the book's 60,000
  with the official files; a sample or your own file counts its own)."""
  return sum(1 for _ in input_data.tfrecords(os.path.join(data_dir, TRAIN_FILE))), TRAIN_FILE


def check_records(path):
  """Checks every record of a TFRecord file in the book's layout, one at a time.

  Memory stays bounded however many records the file holds.

  Returns:
    the number of records: int.

  Raises:
    DataError: naming the file, the record index and the problem (a bad CRC, a
      file cut short, a record that does not parse, a wrong pixel count, a label
      outside 0..9).
  """
  return sum(1 for _ in _checked(path))


def _checked(path):
  """Yields (uint8 [784] image, label) of each record of `path`, checked."""
  if not storage.isfile(path):
    raise DataError('%s is missing. Run with the --data_dir that holds train.tfrecords '
                    'and test.tfrecords, or remove them both to download and convert '
                    'MNIST again.' % path)
  count = 0
  for count, record in enumerate(input_data.tfrecords(path), 1):
    try:
      yield _parse(record)
    except ValueError as e:  # the record does not hold what it should
      raise DataError('%s record %d: %s. Write records with image_raw (784 bytes), pixels '
                      '(784) and label (0..9), or remove the file to convert MNIST again.'
                      % (path, count - 1, e)) from None
  if not count:
    raise DataError('%s holds no records. Remove it to convert MNIST again.' % path)


def _parse(record):
  """One serialized tf.train.Example -> (uint8 [784], label); ValueError if it is not one."""
  try:
    example = tf.train.Example.FromString(record)
  except Exception:  # protobuf's DecodeError
    raise ValueError('not a tf.train.Example') from None
  feature = example.features.feature
  for name in ('image_raw', 'label'):
    if name not in feature:
      raise ValueError('no %r feature' % name)
  raw = feature['image_raw'].bytes_list.value
  if len(raw) != 1 or len(raw[0]) != IMAGE_PIXELS:
    raise ValueError('image_raw has %d bytes, expected %d pixels'
                     % (len(raw[0]) if raw else 0, IMAGE_PIXELS))
  label = feature['label'].int64_list.value
  if len(label) != 1 or not 0 <= label[0] < NUM_CLASSES:
    raise ValueError('label is %s, expected one of 0..%d'
                     % (list(label) if len(label) != 1 else label[0], NUM_CLASSES - 1))
  if 'pixels' in feature and list(feature['pixels'].int64_list.value) != [IMAGE_PIXELS]:
    raise ValueError('pixels is %s, expected %d'
                     % (list(feature['pixels'].int64_list.value), IMAGE_PIXELS))
  return np.frombuffer(raw[0], np.uint8), label[0]


# ---- Download and conversion ---------------------------------------------------

def maybe_download_and_convert(data_dir, data_url=None, data_md5=None, deadlines=None):
  """Makes sure data_dir holds train.tfrecords and test.tfrecords, and checks them.

  Record files already there are used as they are. Otherwise the four IDX files
  are downloaded (size and md5 checked) and converted; nothing the user has is
  overwritten.

  Args:
    data_dir: str.
    data_url: str, the base URL of the four .gz files (default: TensorFlow's copy).
    data_md5: must be None: MNIST has four files with their own published md5s.
    deadlines: input_data.Deadlines of each download (default: input_data's constants).

  Returns:
    dict record file name -> number of records.

  Raises:
    DataError: with what is wrong and what to do.
  """
  if data_md5:
    raise DataError('--data_md5 names the CIFAR-10 archive; MNIST\'s four files have '
                    'their own published md5s. Drop --data_md5.')
  data_url = data_url or DATA_URL
  if storage.is_local(data_dir) and os.path.isdir(data_dir):
    input_data.remove_killed_downloads(data_dir, [r'\.(?:%s)\.(\d+)\..*\.part$' % '|'.join(
        re.escape(n) for n in list(SOURCES) + list(SPLITS))])
  for record_file, sources in SPLITS.items():
    path = os.path.join(data_dir, record_file)
    if not storage.is_local(data_dir) and not storage.exists(path):
      raise DataError('%s is missing. On object storage MNIST is not downloaded or '
                      'converted: convert it into a local --data_dir, then copy %s to %s, '
                      'or write a sample there: python mnist_input.py --write_sample=%s'
                      % (path, ' and '.join(SPLITS), data_dir, data_dir))
    if not storage.exists(path):
      for source in sources:
        _fetch(data_url.rstrip('/') + '/' + source, data_dir, source,
               deadlines or input_data.Deadlines())
      _convert(data_dir, sources, path)
  counts = {f: check_records(os.path.join(data_dir, f)) for f in SPLITS}
  print('MNIST in %s: %s' % (data_dir, ', '.join('%s %d records' % item
                                                  for item in counts.items())))
  return counts


def _fetch(url, data_dir, source, deadlines):
  path = os.path.join(data_dir, source)
  size, md5 = SOURCES[source]
  if os.path.exists(path):
    if input_data.md5_of(path) != md5:
      raise DataError('%s is already there but its md5 is not the published %s. Remove it '
                      'to download it again.' % (path, md5))
    return
  created = input_data.make_data_dir(data_dir)
  try:
    input_data.download(url, path, md5, size, deadlines=deadlines, offline_hint=(
        'To try the program without the data set: python mnist_input.py '
        '--write_sample=/tmp/mnist_sample'))
  except BaseException:
    input_data.remove_if_empty(data_dir, created)
    raise


def read_idx(path, magic, shape):
  """The array in a gzipped IDX file, after checking its header.

  Args:
    path: str, a .gz IDX file.
    magic: IMAGES_MAGIC or LABELS_MAGIC.
    shape: the dimensions after the count: (28, 28) for images, () for labels.

  Returns:
    uint8 array [count] + shape.
  """
  with gzip.open(path, 'rb') as f:
    data = f.read()
  dims = len(shape) + 1
  header = 4 + 4 * dims
  if len(data) < header:
    raise DataError('%s is too short for an IDX header.' % path)
  found_magic, *sizes = struct.unpack('>%dI' % (1 + dims), data[:header])
  if found_magic != magic or tuple(sizes[1:]) != tuple(shape):
    raise DataError('%s has IDX magic %d and sizes %s; expected magic %d and %s. It is not '
                    'an MNIST %s file: remove it to download it again.' % (
                        path, found_magic, sizes, magic, ['count'] + list(shape),
                        'images' if magic == IMAGES_MAGIC else 'labels'))
  if len(data) != header + sizes[0] * int(np.prod(shape, dtype=np.int64)):
    raise DataError('%s holds %d bytes of data for %d items; it is cut short or padded: '
                    'remove it to download it again.' % (path, len(data) - header, sizes[0]))
  return np.frombuffer(data, np.uint8, offset=header).reshape((sizes[0],) + tuple(shape))


def _convert(data_dir, sources, path):
  """Writes the images and labels of two IDX files to `path` as TFRecords."""
  images = read_idx(os.path.join(data_dir, sources[0]), IMAGES_MAGIC,
                    (IMAGE_SIZE, IMAGE_SIZE))
  labels = read_idx(os.path.join(data_dir, sources[1]), LABELS_MAGIC, ())
  if len(images) != len(labels) or (labels >= NUM_CLASSES).any():
    raise DataError('%s and %s do not match: %d images, %d labels, labels up to %d. Remove '
                    'them to download them again.' % (sources[0], sources[1], len(images),
                                                       len(labels), labels.max()))
  write_records(path, images.reshape(-1, IMAGE_PIXELS), labels)
  print('Converted %s and %s to %s, %d records' % (sources[0], sources[1], path,
                                                   len(labels)))


def write_records(path, images, labels):
  """Writes uint8 [n, 784] images and their labels as the book's Examples.

  Written under a temporary name in the same directory, then renamed: a reader
  never sees half a file.
  """
  if not storage.is_local(path):  # an object appears whole when its upload completes
    _write_examples(path, images, labels)
    return
  fd, tmp_path = input_data.temp_file(os.path.dirname(path) or '.',
                                     '.%s.%d.' % (os.path.basename(path), os.getpid()))
  os.close(fd)
  try:
    _write_examples(tmp_path, images, labels)
    os.replace(tmp_path, path)
  except BaseException:
    os.remove(tmp_path)
    raise


def _write_examples(path, images, labels):
  """One tf.train.Example per image, with the book's features, as a TFRecord file."""
  with tf.io.TFRecordWriter(path) as writer:
    for image, label in zip(images, labels):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[image.astype(np.uint8).tobytes()])),
          'pixels': tf.train.Feature(int64_list=tf.train.Int64List(value=[IMAGE_PIXELS])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
      })).SerializeToString())


# ---- The pipelines -------------------------------------------------------------

def _parse_batch(serialized):
  """string [batch] Examples -> (float32 [batch, 784] pixels 0..255, int32 [batch])."""
  features = tf.io.parse_example(serialized, {
      'image_raw': tf.io.FixedLenFeature([], tf.string),
      'label': tf.io.FixedLenFeature([], tf.int64)})
  images = tf.io.decode_raw(features['image_raw'], tf.uint8)
  images.set_shape([serialized.shape[0], IMAGE_PIXELS])  # static when batches are whole
  return _to_float(images), tf.cast(features['label'], tf.int32)


def _to_float(images):
  """uint8 -> float32 with the same values, 0..255, as the book's reader."""
  return tf.cast(images, tf.float32)


def eval_images(images):
  """What the evaluation's reader does to the pixels, for export_model.py's SavedModel.

  Args:
    images: uint8 [batch, 28, 28] (or [batch, 784]).

  Returns:
    float32 [batch, 784], 0..255: the book's unscaled pixels.
  """
  return _to_float(tf.reshape(images, [-1, IMAGE_PIXELS]))


def train_dataset(data_dir, batch_size):
  """Endless, shuffled training batches: ONE pipeline that all towers draw from.

  Returns:
    tf.data.Dataset of (float32 [batch_size, 784], int32 [batch_size]).
  """
  path = os.path.join(data_dir, TRAIN_FILE)
  dataset = tf.data.TFRecordDataset([path]).shuffle(SHUFFLE_BUFFER).repeat()
  dataset = dataset.batch(batch_size, drop_remainder=True)
  dataset = dataset.map(_parse_batch, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE)


def seeded_dataset(data_dir, global_batch, seed, start_step=0):
  """Training batches fixed by (seed, global step) alone (input_data.seeded_dataset).

  The records are held in memory (47 MB for MNIST) so that any of them can be picked.

  Returns:
    (tf.data.Dataset of (float32 [global_batch, 784], int32 [global_batch]),
     the op that loads the records, to run once in the session).
  """
  path = os.path.join(data_dir, TRAIN_FILE)
  num_records = check_records(path)
  with tf.device('/cpu:0'):
    all_records = tf.data.TFRecordDataset([path]).batch(num_records).get_single_element()
    images, labels = _parse_batch(all_records)
    # One row per record, as CIFAR-10's: the label byte, then the pixels.
    rows = tf.concat([tf.cast(labels[:, None], tf.uint8), tf.cast(images, tf.uint8)], axis=1)
    records = input_data.records_variable(rows, name='seeded_records')

  def to_batch(raw, uniforms):
    del uniforms  # the book's reader does not distort
    return _to_float(raw[:, 1:]), tf.cast(raw[:, 0], tf.int32)

  dataset = input_data.seeded_dataset(records, num_records, global_batch, seed, start_step,
                                     num_uniforms=0, to_batch=to_batch)
  return dataset, records.initializer


def eval_dataset(eval_data, data_dir, batch_size):
  """Every record of the chosen split exactly once, in file order.

  Args:
    eval_data: 'test' (test.tfrecords) or 'train_eval' (train.tfrecords).

  Returns:
    (tf.data.Dataset of (float32 [<=batch_size, 784], int32 [<=batch_size]),
     number of records).
  """
  if eval_data not in ('test', 'train_eval'):
    raise DataError("eval_data must be 'test' or 'train_eval', got %r" % (eval_data,))
  path = os.path.join(data_dir, TEST_FILE if eval_data == 'test' else TRAIN_FILE)
  num_records = check_records(path)
  dataset = tf.data.TFRecordDataset([path]).batch(batch_size).map(_parse_batch)
  return dataset.prefetch(tf.data.AUTOTUNE), num_records


def synthetic_dataset(batch_size, seed=0):
  """Random pixels 0..255 and labels held in memory, for timing compute alone (one
  batch made once and repeated: input_data.repeated_batch)."""
  def make_batch():
    pixels = tf.random.stateless_uniform([batch_size, IMAGE_PIXELS], [seed, 0], minval=0,
                                         maxval=256, dtype=tf.int32)
    labels = tf.random.stateless_uniform([batch_size], [seed, 1], minval=0,
                                         maxval=NUM_CLASSES, dtype=tf.int32)
    return tf.cast(pixels, tf.float32), labels
  return input_data.repeated_batch(make_batch)


# ---- A small learnable sample, for trying the program offline ---------------------

# Class k is the digit k as a seven-segment display, but each image shows it shifted,
# at its own brightness, with noise, and a fixed share of the labels is wrong. The
# book's network on unscaled pixels is easily thrown by pixel noise (std 30 already
# cost 7 points of precision, measured): the shifts and neighbouring digits a segment
# apart make it learn over the book's 1,000 steps, never perfectly.
_SEGMENTS = {  # name: (rows, columns) of the bar in the 28x28 image
    'a': (slice(4, 7), slice(8, 21)), 'b': (slice(4, 15), slice(18, 21)),
    'c': (slice(13, 25), slice(18, 21)), 'd': (slice(22, 25), slice(8, 21)),
    'e': (slice(13, 25), slice(8, 11)), 'f': (slice(4, 15), slice(8, 11)),
    'g': (slice(13, 16), slice(8, 21))}
_DIGIT_SEGMENTS = ['abcdef', 'bc', 'abged', 'abgcd', 'fgbc', 'afgcd', 'afgedc', 'abc',
                   'abcdefg', 'abcdfg']
SAMPLE_NOISE = 10.0                   # std of the per-pixel noise, in pixel values 0..255
SAMPLE_MAX_SHIFT = 2                  # pixels; each image's digit moves by up to this each way
SAMPLE_LABEL_NOISE = 0.02             # share of records per file whose label is another class's


def _templates():
  """float32 [10, 28, 28]: 1 where digit k's segments are lit, else 0."""
  templates = np.zeros((NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE), np.float32)
  for digit, segments in enumerate(_DIGIT_SEGMENTS):
    for segment in segments:
      templates[(digit,) + _SEGMENTS[segment]] = 1
  return templates


def make_digits(labels, rng):
  """uint8 [n, 784] images that show their label: the digit as a seven-segment display.

  Each image moves its digit by up to SAMPLE_MAX_SHIFT pixels each way, lights it at
  its own strength and adds a little noise: a pattern a fully connected network learns
  gradually, with neighbours such as 7 and 1, or 8 and 9, a segment apart.
  """
  labels = np.asarray(labels)
  n = len(labels)
  images = _templates()[labels % NUM_CLASSES]
  shifts = rng.integers(-SAMPLE_MAX_SHIFT, SAMPLE_MAX_SHIFT + 1, (n, 2))
  for i, (dy, dx) in enumerate(shifts):  # the digit box stays inside the 28x28 image
    images[i] = np.roll(images[i], (dy, dx), axis=(0, 1))
  images *= rng.uniform(120, 230, (n, 1, 1))
  images += rng.uniform(0, 40, (n, 1, 1)) + rng.normal(0, SAMPLE_NOISE, images.shape)
  return np.clip(images, 0, 255).astype(np.uint8).reshape(-1, IMAGE_PIXELS)


def _mislabel(labels, rng):
  """A copy of labels with round(SAMPLE_LABEL_NOISE * n) of them another class's."""
  labels = np.array(labels)
  wrong = rng.choice(len(labels), int(round(SAMPLE_LABEL_NOISE * len(labels))), replace=False)
  labels[wrong] = (labels[wrong] + rng.integers(1, NUM_CLASSES, len(wrong))) % NUM_CLASSES
  return labels


def write_sample(data_dir, train_records=SAMPLE_TRAIN_RECORDS,
                 test_records=SAMPLE_TEST_RECORDS, seed=0):
  """Writes data_dir/train.tfrecords and test.tfrecords of learnable digits.

  Raises:
    DataError: data_dir already holds one of them (nothing is overwritten).
  """
  for name in SPLITS:
    if storage.exists(os.path.join(data_dir, name)):
      raise DataError('%s already exists; nothing was written. Choose another directory '
                      'for the sample, or remove it.' % os.path.join(data_dir, name))
  storage.makedirs(data_dir)  # a local path or a URL (gs://)
  rng = np.random.default_rng(seed)
  for name, count in ((TRAIN_FILE, train_records), (TEST_FILE, test_records)):
    labels = rng.integers(0, NUM_CLASSES, count)
    images = make_digits(labels, rng)
    write_records(os.path.join(data_dir, name), images, _mislabel(labels, rng))


def define_flags(flag_values=flags.FLAGS):
  """--write_sample's flags; called when this file runs as a program."""
  flags.DEFINE_string('write_sample', None, 'directory to write train.tfrecords and '
                      'test.tfrecords into', flag_values=flag_values)
  flags.DEFINE_integer('train_records', SAMPLE_TRAIN_RECORDS, 'records in train.tfrecords',
                       flag_values=flag_values)
  flags.DEFINE_integer('test_records', SAMPLE_TEST_RECORDS, 'records in test.tfrecords',
                       flag_values=flag_values)


def main(argv, flag_values=flags.FLAGS):
  """python mnist_input.py --write_sample=DIR: a sample data set, and how to train on it."""
  with errors.one_line_errors():
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
  if flag_values.write_sample is None:
    sys.exit('error: --write_sample=DIR is required: the directory to write the sample into.')
  for name in ('train_records', 'test_records'):
    if flag_values[name].value < 1:
      sys.exit('error: --%s must be at least 1, got %d' % (name, flag_values[name].value))
  try:
    storage.check(flag_values.write_sample, '--write_sample')
    write_sample(flag_values.write_sample, flag_values.train_records, flag_values.test_records)
  except (DataError, errors.TrainingError, OSError) as e:
    sys.exit('error: %s' % e)
  except tf.errors.OpError as e:  # on an object store: a bucket not writable, ...
    sys.exit('error: cannot write the sample into %s: %s'
             % (flag_values.write_sample, errors.one_line(e)))
  data_dir = storage.abspath(flag_values.write_sample)
  print('Wrote a learnable MNIST sample to %s: %s %d records, %s %d records.'
        % (data_dir, TRAIN_FILE, flag_values.train_records, TEST_FILE,
           flag_values.test_records))
  print('Train on it, then evaluate:\n'
        '  python multi_gpu_train.py --dataset=mnist --num_gpus=2 --data_dir=%s '
        '--train_dir=%s_train\n'
        '  python mnist_eval.py --run_once --data_dir=%s --checkpoint_dir=%s_train '
        '--eval_dir=%s_eval\n'
        'Or train on 1 ps task and 2 workers on this machine, then evaluate into an event '
        'folder of its own:\n'
        '  python dist_train.py --dataset=mnist --local_cluster=1,2 --data_dir=%s '
        '--train_dir=%s_dist_train\n'
        '  python mnist_eval.py --run_once --data_dir=%s --checkpoint_dir=%s_dist_train '
        '--eval_dir=%s_dist_eval'
        % ((data_dir,) * 10))



def check_train_files(data_dir):
  """Checks the training file again, record by record: after a TensorFlow error in the
  step loop, whether it was changed under the running trainer (DataError naming it)."""
  check_records(os.path.join(data_dir, TRAIN_FILE))


# The names every data set's input module gives the trainers (data_sets.DATASETS).
prepare = maybe_download_and_convert


if __name__ == '__main__':
  define_flags()
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
