"""classify.py: image files through an exported SavedModel, the top 3 classes of each.

Any size, PNG, JPEG, GIF or BMP, made the model's size and colours; a file it cannot read
or decode, a damaged model, is one line; copied alone, it prints no TensorFlow start-up
line. The models are tests/conftest.py's `exported` and `mnist_exported`: the tests that use them
carry @pytest.mark.xdist_group('export'), as tests/test_export_model.py's do, so that one
test process trains them once.
"""
import os
import re
import shutil
import struct
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import classify
import helpers


def _write_image(path, pixels):
  encode = tf.io.encode_png if str(path).endswith('.png') else tf.io.encode_jpeg
  tf.io.write_file(str(path), encode(pixels))


# A 1x1 GIF of one white pixel (TensorFlow writes no GIF), and a 24-bit BMP written out.
WHITE_GIF = bytes.fromhex('474946383961010001008000' '00ffffff000000'
                          '2c00000000010001000002024401003b')


def _bmp(pixels):
  """A 24-bit BMP of pixels (uint8 [height, width, 3], RGB): rows bottom-up, BGR."""
  height, width, _ = pixels.shape
  row = (width * 3 + 3) // 4 * 4
  data = b''.join(pixels[y, :, ::-1].tobytes().ljust(row, b'\0')
                  for y in range(height - 1, -1, -1))
  return (b'BM' + struct.pack('<IHHI', 54 + len(data), 0, 0, 54) +
          struct.pack('<IiiHHIIiiII', 40, width, height, 1, 24, 0, len(data), 2835, 2835, 0,
                      0) + data)


@pytest.mark.xdist_group('export')
def test_classify_prints_top_3_per_image_and_one_line_per_unreadable_file_exit_1(exported,
                                                                                  tmp_path):
  rng = np.random.default_rng(0)
  _write_image(tmp_path / 'wide.png', rng.integers(0, 256, (37, 53, 3), np.uint8))
  _write_image(tmp_path / 'small.jpg', rng.integers(0, 256, (19, 11, 3), np.uint8))
  (tmp_path / 'notes.png').write_text('not an image')
  done = helpers.run(['classify.py', '--model_dir=%s' % exported.export_dir, 'wide.png',
                      'missing.png', 'notes.png', 'small.jpg'], cwd=str(tmp_path))
  assert done.code == 1, done.log()
  assert done.errors == [
      'error: missing.png: cannot read it: No such file or directory',
      'error: notes.png: cannot decode it: Unknown image file format. One of JPEG, JPEG XL, '
      'PNG, GIF, BMP, WebP required.'], done.log()
  assert 'Traceback' not in done.err
  lines = done.out.splitlines()
  assert [line.split(': ')[0] for line in lines] == ['wide.png', 'small.jpg'], done.log()
  # The same lines as the SavedModel gives on the images read and resized here.
  model = classify.load(exported.export_dir)
  found, failed = classify.classify(model, [str(tmp_path / 'wide.png'),
                                            str(tmp_path / 'small.jpg')])
  assert failed == [] and [text for _, text in found] == [l.split(': ')[1] for l in lines]
  for line in lines:
    top = [pair.split(' ') for pair in line.split(': ')[1].split(', ')]
    names, probabilities = [n for n, _ in top], [float(p) for _, p in top]
    assert len(top) == 3 and len(set(names)) == 3 and set(names) <= set(cifar10.CLASS_NAMES)
    assert probabilities == sorted(probabilities, reverse=True), line


@pytest.mark.xdist_group('export')
def test_classify_image_of_model_size_is_classified_as_the_raw_record(exported, sample,
                                                                       tmp_path):
  images, _ = helpers.cifar10_test_records(sample.dir)
  _write_image(tmp_path / 'record0.png', images[0])
  model = classify.load(exported.export_dir)
  assert model.image_shape == [32, 32, 3] and tuple(model.names) == cifar10.CLASS_NAMES
  np.testing.assert_array_equal(classify.read_image(str(tmp_path / 'record0.png'), [32, 32, 3]),
                                images[0])  # same size: not resampled
  row = model.signature(images=tf.constant(images[:1]))['probabilities'].numpy()[0]
  best = np.argsort(-row)[:3]
  found, _ = classify.classify(model, [str(tmp_path / 'record0.png')])
  assert found[0][1] == ', '.join('%s %.2f' % (cifar10.CLASS_NAMES[i], row[i]) for i in best)


@pytest.mark.xdist_group('export')
def test_classify_mnist_model_reads_any_image_as_28x28_greyscale_digits(mnist_exported,
                                                                        tmp_path):
  _write_image(tmp_path / 'digit.png', np.full((50, 30, 3), 200, np.uint8))
  model = classify.load(mnist_exported.export_dir)
  assert model.image_shape == [28, 28] and model.names == [str(d) for d in range(10)]
  image = classify.read_image(str(tmp_path / 'digit.png'), model.image_shape)
  assert image.shape == (28, 28) and image.dtype == np.uint8 and (image == 200).all()
  found, failed = classify.classify(model, [str(tmp_path / 'digit.png')])
  assert failed == [] and len(found[0][1].split(', ')) == 3


@pytest.mark.parametrize('model_name, shape', [('mnist', [28, 28]), ('cifar10', [24, 24, 3])])
def test_classify_read_image_gif_and_bmp_for_either_model(tmp_path, model_name, shape):
  # Before, the MNIST model's greyscale read refused both: `channels must be 0 or 3 for
  # GIF, got 1`. Colour files are made grey for it, and grey ones colour for CIFAR-10.
  (tmp_path / 'white.gif').write_bytes(WHITE_GIF)
  (tmp_path / 'grey.bmp').write_bytes(_bmp(np.full((5, 3, 3), 200, np.uint8)))
  for name, value in (('white.gif', 255), ('grey.bmp', 200)):
    image = classify.read_image(str(tmp_path / name), shape)
    assert list(image.shape) == shape and image.dtype == np.uint8, (model_name, name)
    assert (np.abs(image.astype(int) - value) <= 1).all(), (model_name, name, image.ravel()[:4])


def test_classify_model_dir_not_a_saved_model_one_line_exit_1(tmp_path, monkeypatch,
                                                             capsys):
  # main() as the program runs it, its one flag given by hand (absl's parse is absl's).
  monkeypatch.setattr(classify, 'FLAGS', types.SimpleNamespace(model_dir=str(tmp_path)))
  with pytest.raises(SystemExit) as e:
    classify.main(['classify.py', 'cat.png'])
  assert e.value.code == (
      'error: %s is not a SavedModel (it has no saved_model.pb). Write one with python '
      'export_model.py --export_dir=%s' % (tmp_path, tmp_path))  # exit 1, on stderr
  with pytest.raises(SystemExit) as e:
    classify.main(['classify.py'])
  assert e.value.code.startswith('error: no image files given.')
  assert capsys.readouterr().out == ''


@pytest.mark.xdist_group('export')
def test_classify_copied_elsewhere_prints_no_tensorflow_start_up_line(exported, tmp_path):
  # Before: TensorFlow's 6 lines as it loads (oneDNN, cuda drivers, CPU instructions).
  shutil.copy(os.path.join(helpers.ROOT, 'classify.py'), tmp_path)
  image = tmp_path / 'cat.png'
  image.write_bytes(tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy())
  done = helpers.run([sys.executable, '-I', str(tmp_path / 'classify.py'),
                      '--model_dir=%s' % exported.export_dir, str(image)],
                     cwd=str(tmp_path), env=helpers.user_env(PYTHONPATH=None), fresh=True)
  assert done.code == 0 and done.out.startswith('%s: ' % image), done.log()
  assert done.err == '', done.log()


def test_classify_model_with_variables_cut_short_names_tensorflows_cause(exported, tmp_path):
  # Before: `cannot load the SavedModel ...: Graph execution error:`, the cause unsaid.
  model = tmp_path / 'model'
  shutil.copytree(exported.export_dir, model)
  data = model / 'variables' / 'variables.data-00000-of-00001'
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
  with pytest.raises(classify.ClassifyError) as e:
    classify.load(str(model))
  assert str(e.value) == (
      'cannot load the SavedModel %s: Read less bytes than requested. Its files are damaged '
      'or cut short: write it again with export_model.py.' % model)


def test_classify_class_names_file_unreadable_is_one_error_naming_it(exported, tmp_path):
  model_dir = str(tmp_path / 'model')
  shutil.copytree(exported.export_dir, model_dir)
  names_path = os.path.join(model_dir, classify.CLASS_NAMES_FILE)
  with open(names_path, 'wb') as f:
    f.write(b'\xff\xfe not text')
  with pytest.raises(classify.ClassifyError, match='^cannot read %s: ' % re.escape(names_path)):
    classify.load(model_dir)


@pytest.mark.parametrize('kind', helpers.HOSTILE_FILES)
def test_classify_read_image_hostile_file_one_line_without_waiting(tmp_path, kind):
  path = tmp_path / 'cat.png'
  helpers.make_hostile(path, kind)
  with pytest.raises(classify.ClassifyError) as e:
    helpers.returns_within(10, classify.read_image, str(path), [32, 32, 3],
                           unblock=helpers.unblock_fifo(path))
  assert str(e.value) == '%s: cannot read it: %s' % (path, {
      'fifo': 'not a regular file (a FIFO, a device or a directory)',
      'dev_zero': 'not a regular file (a FIFO, a device or a directory)',
      'sparse_3gb': 'more than %d bytes, the most this program reads'
                    % classify.MAX_IMAGE_BYTES}[kind])
