"""mnist_input: the IDX download and conversion, the record checks, the pipelines."""
import gzip
import hashlib
import os
import struct
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

import helpers
import mnist_input


def _idx(magic, array):
  """Gzipped IDX bytes: big-endian magic, sizes, then the uint8 data."""
  header = struct.pack('>%dI' % (1 + array.ndim), magic, *array.shape)
  return gzip.compress(header + array.astype(np.uint8).tobytes())


def _serve_idx(directory, monkeypatch, num_train=30, num_test=10, damage=None):
  """Writes the four IDX files into directory and makes them the published ones."""
  rng = np.random.default_rng(0)
  sources = {}
  for images_name, labels_name, n in (
      ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', num_train),
      ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz', num_test)):
    labels = rng.integers(0, 10, n)
    sources[images_name] = _idx(mnist_input.IMAGES_MAGIC, mnist_input.make_digits(
        labels, rng).reshape(n, 28, 28))
    sources[labels_name] = _idx(mnist_input.LABELS_MAGIC, labels)
  published = {name: (len(data), hashlib.md5(data).hexdigest())
               for name, data in sources.items()}
  if damage == 'bad-md5':
    sources['train-labels-idx1-ubyte.gz'] = sources['train-labels-idx1-ubyte.gz'][::-1]
  elif damage == 'bad-magic':  # published as is: the header is what is wrong
    data = _idx(1234, np.zeros((num_train, 28, 28)))
    sources['train-images-idx3-ubyte.gz'] = data
    published['train-images-idx3-ubyte.gz'] = (len(data), hashlib.md5(data).hexdigest())
  elif damage == 'truncated':
    sources['t10k-images-idx3-ubyte.gz'] = sources['t10k-images-idx3-ubyte.gz'][:-10]
  for name, data in sources.items():
    (directory / name).write_bytes(data)
  monkeypatch.setattr(mnist_input, 'SOURCES', published)


def test_download_served_idx_files_converted_to_tfrecords(tmp_path, monkeypatch, capsys):
  served, data_dir = tmp_path / 'served', tmp_path / 'data'
  served.mkdir()
  _serve_idx(served, monkeypatch)
  with helpers.serve(served) as url:
    counts = mnist_input.maybe_download_and_convert(str(data_dir), url)
  assert counts == {'train.tfrecords': 30, 'test.tfrecords': 10}
  out = capsys.readouterr().out
  assert 'Converted train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz to' in out
  images, labels = mnist_input.read_records(str(data_dir / 'train.tfrecords'))
  with gzip.open(served / 'train-images-idx3-ubyte.gz') as f:
    np.testing.assert_array_equal(images, np.frombuffer(f.read()[16:], np.uint8)
                                  .reshape(30, 784))  # row-major, byte for byte
  with gzip.open(served / 'train-labels-idx1-ubyte.gz') as f:
    np.testing.assert_array_equal(labels, np.frombuffer(f.read()[8:], np.uint8))
  record = next(tf.compat.v1.io.tf_record_iterator(str(data_dir / 'test.tfrecords')))
  feature = tf.train.Example.FromString(record).features.feature  # the book's features
  assert feature['pixels'].int64_list.value == [784]
  assert len(feature['image_raw'].bytes_list.value[0]) == 784
  assert sorted(os.listdir(data_dir)) == sorted(list(mnist_input.SOURCES) +
                                                ['test.tfrecords', 'train.tfrecords'])


@pytest.mark.parametrize('mask, file_mode', [(0o022, 0o644), (0o002, 0o664)])
def test_downloaded_and_converted_files_get_the_umask_mode(tmp_path, monkeypatch, mask,
                                                           file_mode):
  served, data_dir = tmp_path / 'served', tmp_path / 'data'
  served.mkdir()
  _serve_idx(served, monkeypatch)
  with helpers.serve(served) as url, helpers.umask(mask):
    mnist_input.maybe_download_and_convert(str(data_dir), url)
  assert helpers.modes(data_dir) == {name: file_mode for name in list(mnist_input.SOURCES) +
                                      ['test.tfrecords', 'train.tfrecords']}


@pytest.mark.parametrize('mask, file_mode', [(0o022, 0o644), (0o002, 0o664)])
def test_write_sample_files_get_the_umask_mode(tmp_path, mask, file_mode):
  with helpers.umask(mask):
    mnist_input.write_sample(str(tmp_path / 'sample'), train_records=20, test_records=5)
  assert helpers.modes(tmp_path) == {'sample': 0o777 & ~mask,
                                      'sample/train.tfrecords': file_mode,
                                      'sample/test.tfrecords': file_mode}


@pytest.mark.parametrize('damage, says', [
    ('bad-md5', 'train-labels-idx1-ubyte.gz has md5 '),
    ('truncated', 't10k-images-idx3-ubyte.gz gave '),
    ('bad-magic', 'has IDX magic 1234 and sizes'),
])
def test_download_bad_idx_file_refused_no_record_file_written(tmp_path, monkeypatch, damage,
                                                              says):
  served, data_dir = tmp_path / 'served', tmp_path / 'data'
  served.mkdir()
  _serve_idx(served, monkeypatch, damage=damage)
  with helpers.serve(served) as url, pytest.raises(mnist_input.DataError, match=says):
    mnist_input.maybe_download_and_convert(str(data_dir), url)
  split = 'test.tfrecords' if damage == 'truncated' else 'train.tfrecords'
  written = helpers.tree(data_dir)
  assert split not in written and not [f for f in written if f.endswith('.part')], written


def _write(path, images, labels, pixels=784):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for image, label in zip(images, labels):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[np.asarray(image, np.uint8).tobytes()])),
          'pixels': tf.train.Feature(int64_list=tf.train.Int64List(value=[pixels])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
                   .SerializeToString())


@pytest.mark.parametrize('damage, says', [
    ('crc', 'record 2 cannot be read'),
    ('label', 'record 3: label is 12, expected one of 0..9'),
    ('pixels', 'record 1: image_raw has 783 bytes, expected 784 pixels'),
])
def test_read_records_bad_record_names_file_index_and_problem(tmp_path, damage, says):
  path = tmp_path / 'train.tfrecords'
  images = np.zeros((5, 784), np.uint8)
  labels = [1, 2, 3, 12 if damage == 'label' else 4, 5]
  if damage == 'pixels':
    images = [np.zeros(784), np.zeros(783), np.zeros(784)]
  _write(path, images, labels)
  if damage == 'crc':
    data = bytearray(path.read_bytes())
    record_size = len(data) // 5
    data[2 * record_size + 20] ^= 0xFF  # a byte inside record 2's payload
    path.write_bytes(bytes(data))
  with pytest.raises(mnist_input.DataError) as e:
    mnist_input.read_records(str(path))
  assert str(e.value).startswith(str(path)) and says in str(e.value), str(e.value)


def test_own_record_files_used_as_they_are_and_read_every_record_once(tmp_path):
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 10, 25)
  images = mnist_input.make_digits(labels, rng)
  _write(tmp_path / 'train.tfrecords', images, labels)
  _write(tmp_path / 'test.tfrecords', images[:7], labels[:7])
  assert mnist_input.maybe_download_and_convert(str(tmp_path), 'http://127.0.0.1:9/') == {
      'train.tfrecords': 25, 'test.tfrecords': 7}  # nothing fetched
  with tf.Graph().as_default():
    dataset, count = mnist_input.eval_dataset('train_eval', str(tmp_path), batch_size=10)
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    train = mnist_input.train_dataset(str(tmp_path), batch_size=8)
    train_batch = tf.compat.v1.data.make_one_shot_iterator(train).get_next()
    seen_images, seen_labels = [], []
    with tf.compat.v1.Session() as sess:
      try:
        while True:
          x, y = sess.run(batch)
          seen_images.append(x)
          seen_labels.extend(y)
      except tf.errors.OutOfRangeError:
        pass
      train_images, train_labels = sess.run(train_batch)
  assert count == 25 and seen_labels == list(labels)
  np.testing.assert_array_equal(np.concatenate(seen_images), images.astype(np.float32))
  assert train_batch[0].shape.as_list() == [8, 784]  # static, for the towers
  assert train_images.max() > 1  # pixels 0..255, unscaled, as the book's reader
  assert set(train_labels) <= set(labels)


def test_write_sample_refuses_to_overwrite(tmp_path):
  mnist_input.write_sample(str(tmp_path), train_records=20, test_records=5)
  before = (tmp_path / 'train.tfrecords').read_bytes()
  with pytest.raises(mnist_input.DataError, match='already exists; nothing was written'):
    mnist_input.write_sample(str(tmp_path), train_records=30, test_records=5)
  assert (tmp_path / 'train.tfrecords').read_bytes() == before


@pytest.mark.parametrize('cut', [4, 11, 12 + 100], ids=['in-length', 'in-length-crc',
                                                       'in-data'])
def test_check_records_file_cut_in_last_record_names_file_and_offset(tmp_path, cut):
  path = tmp_path / 'train.tfrecords'
  _write(path, np.zeros((50, 784), np.uint8), [3] * 50)
  data = path.read_bytes()
  record_bytes = len(data) // 50
  path.write_bytes(data[:49 * record_bytes + cut])  # record 49 cut `cut` bytes in
  with pytest.raises(mnist_input.DataError) as e:
    mnist_input.check_records(str(path))
  if cut < 12:  # TensorFlow's reader takes this for the end of the file
    assert str(e.value) == (
        '%s ends with %d bytes at byte offset %d that do not make a record (after record '
        '48): the file was cut short or has bytes appended. Remove it to write it again.'
        % (path, cut, 49 * record_bytes))
  else:
    assert str(e.value).startswith('%s record 49 cannot be read (at byte offset %d): '
                                   % (path, 49 * record_bytes)), str(e.value)


def test_check_records_counts_whole_file_in_bounded_memory(tmp_path):
  path = tmp_path / 'train.tfrecords'
  _write(path, np.zeros((20000, 784), np.uint8), [1] * 20000)  # 16 MB of records
  tracemalloc.start()
  try:
    assert mnist_input.check_records(str(path)) == 20000
    peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
  finally:
    tracemalloc.stop()
  assert peak_mb < 2, peak_mb  # holding every record took 16 MB and more


def test_write_sample_hint_each_training_evaluated_into_its_own_eval_dir(tmp_path, capsys):
  helpers.input_main(mnist_input, '--write_sample=%s' % (tmp_path / 'sample'),
                     '--train_records=20', '--test_records=5')
  helpers.assert_each_training_evaluated_into_its_own_eval_dir(capsys.readouterr().out,
                                                               'mnist_eval.py')
