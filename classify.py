"""Classifies image files with a model export_model.py wrote: the 3 likeliest classes of each.

    python classify.py --model_dir=/tmp/cifar10_model cat.png truck.jpg
    cat.png: cat 0.71, dog 0.18, frog 0.05
    truck.jpg: truck 0.64, automobile 0.30, ship 0.02

A PNG or JPEG of any size (or whatever else tf.io.decode_image reads: GIF, BMP) is
resized to the model's input, which the SavedModel's signature gives: 32x32 RGB for
CIFAR-10, 28x28 greyscale for MNIST (whose digits are white on black). The class names
come with the SavedModel too (assets.extra/class_names.txt; class numbers without it),
so this program needs TensorFlow and nothing else of this project: copy it beside the
model to use it elsewhere.

A file that cannot be read or decoded gets one `error:` line on stderr, and the others
are still classified; the exit status is 0 only when every file was.
"""
import os

# 3: none of TensorFlow's C++ log. This program says what went wrong itself; what the log
# would add is the "failed call to cuInit" line of every machine without a GPU driver.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections
import errno
import re
import stat
import sys

try:  # in this project: TensorFlow's start-up notices kept to the log level, once
  from training import prelude
  if __name__ == '__main__':
    prelude.answer_help(sys.argv)  # --help exits 0, --helpshort lists --model_dir alone
  prelude.import_tensorflow()
except ImportError:  # copied beside a model elsewhere, without prelude's filter: the
  import tempfile     # notices TensorFlow prints as it loads, before it reads the level,
  with tempfile.TemporaryFile() as _held:  # are held in a file, shown if it fails to load
    _stderr = os.dup(2)
    os.dup2(_held.fileno(), 2)
    try:
      import tensorflow  # noqa: F401
    except BaseException as _error:
      os.dup2(_stderr, 2)
      _held.seek(0)
      os.write(2, _held.read())
      if isinstance(_error, ImportError):  # one line, as prelude.cannot_import says it
        sys.exit('error: %s cannot import tensorflow (%s). Install it into this Python: '
                 '%s -m pip install tensorflow' % (sys.executable, _error, sys.executable))
      raise
    finally:
      os.dup2(_stderr, 2)
      os.close(_stderr)

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

TOP_K = 3                             # classes printed per file, likeliest first
MAX_IMAGE_BYTES = 64 << 20            # an image file larger than this is refused, not read
MAX_NAMES_BYTES = 1 << 20             # the class names file, likewise
# export_model.py's names: its signature, its input, and its file of class names.
SIGNATURE_KEY = 'serving_default'
INPUT_KEY = 'images'
CLASS_NAMES_FILE = os.path.join('assets.extra', 'class_names.txt')  # line i names class i

FLAGS = flags.FLAGS


def define_flags():
  """This program's flags; called when it runs, so importing it defines none."""
  flags.DEFINE_string('model_dir', None, 'A SavedModel written by export_model.py (its '
                      '--export_dir). Required.')


class ClassifyError(Exception):
  """A model or a file cannot be used; the message names it and says why."""


Model = collections.namedtuple('Model', [
    'signature',    # the serving_default function: images= -> classes, probabilities
    'image_shape',  # one input image: [height, width, channels] or [height, width]
    'names',        # the class names, by class number
])


def load(model_dir):
  """The SavedModel at model_dir, checked to be one export_model.py writes.

  Raises:
    ClassifyError: not a SavedModel, or not of that shape.
  """
  try:
    is_model = tf.saved_model.contains_saved_model(model_dir)
  except tf.errors.UnimplementedError:  # s3:// in TensorFlow 2.21
    raise ClassifyError('--model_dir=%s: TensorFlow %s has no file system for %s (the '
                        'tensorflow-io package adds s3:// and others).'
                        % (model_dir, tf.__version__, model_dir.split('/')[0] + '//')) from None
  if not is_model:
    raise ClassifyError('%s is not a SavedModel (it has no saved_model.pb). Write one with '
                        'python export_model.py --export_dir=%s' % (model_dir, model_dir))
  try:
    signatures = tf.saved_model.load(model_dir).signatures
  except Exception as e:  # a damaged file: OpError, DecodeError, ValueError, ...
    raise ClassifyError('cannot load the SavedModel %s: %s. Its files are damaged or cut '
                        'short: write it again with export_model.py.'
                        % (model_dir, _first_line(e).rstrip('.')))
  if SIGNATURE_KEY not in signatures:
    raise ClassifyError('the SavedModel %s has no signature %s (it has: %s); export_model.py '
                        'writes one.' % (model_dir, SIGNATURE_KEY, ', '.join(signatures)))
  signature = signatures[SIGNATURE_KEY]
  spec = signature.structured_input_signature[1].get(INPUT_KEY)
  outputs = signature.structured_outputs
  if (spec is None or spec.dtype != tf.uint8 or spec.shape.rank not in (3, 4) or
      not spec.shape[1:].is_fully_defined() or 'probabilities' not in outputs):
    raise ClassifyError('the SavedModel %s takes %s and returns %s; this program reads '
                        'export_model.py\'s: %s uint8 [N, height, width(, channels)] -> '
                        'probabilities.' % (model_dir, signature.structured_input_signature[1],
                                            sorted(outputs), INPUT_KEY))
  num_classes = outputs['probabilities'].shape[-1]
  names = [str(i) for i in range(num_classes)]
  names_path = os.path.join(model_dir, CLASS_NAMES_FILE)
  if tf.io.gfile.exists(names_path):  # a local path or a URL (gs://)
    try:
      names = read_bounded(names_path, MAX_NAMES_BYTES).decode('utf-8').splitlines()
    except (OSError, UnicodeDecodeError) as e:
      raise ClassifyError('cannot read %s: %s' % (
          names_path, e.strerror if isinstance(e, OSError) else e)) from None
  if len(names) != num_classes:
    raise ClassifyError('%s names %d classes; the model has %d.'
                        % (names_path, len(names), num_classes))
  return Model(signature, spec.shape.as_list()[1:], names)


def read_image(path, image_shape):
  """An image file of any size, as the model takes it.

  Args:
    image_shape: [height, width, channels] (3: RGB, 1: greyscale) or [height, width].

  Returns:
    uint8 numpy array of image_shape.

  Raises:
    ClassifyError: naming the file and why it cannot be read.
  """
  channels = image_shape[2] if len(image_shape) == 3 else 1
  try:  # never a FIFO's endless wait, nor /dev/zero's endless bytes
    contents = read_bounded(path, MAX_IMAGE_BYTES)
  except OSError as e:
    raise ClassifyError('%s: cannot read it: %s' % (path, e.strerror)) from None
  try:  # as the file has it: GIF and BMP decode to colour only
    image = tf.io.decode_image(contents, channels=0,
                               expand_animations=False)  # a GIF's first frame
  except tf.errors.OpError as e:
    raise ClassifyError('%s: cannot decode it: %s' % (path, _first_line(e))) from None
  image = _with_channels(image, channels)
  image = tf.image.resize(image, image_shape[:2], antialias=True)  # float32, any size
  image = tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.uint8)
  return tf.reshape(image, image_shape).numpy()


def _with_channels(image, channels):
  """A decoded image (1 to 4 channels) with `channels` (1 or 3): alpha dropped, colour
  made grey or grey made colour as the model takes it."""
  if image.shape[-1] in (2, 4):  # grey or colour, then alpha
    image = image[..., :image.shape[-1] - 1]
  if channels == 1 and image.shape[-1] == 3:
    return tf.image.rgb_to_grayscale(image)
  if channels == 3 and image.shape[-1] == 1:
    return tf.image.grayscale_to_rgb(image)
  return image


def classify(model, paths):
  """The TOP_K likeliest classes of each readable file.

  Returns:
    ([(path, 'cat 0.71, dog 0.18, frog 0.05')] in the order of paths,
     [a message for each file that could not be read]).
  """
  images, read, failed = [], [], []
  for path in paths:
    try:
      images.append(read_image(path, model.image_shape))
      read.append(path)
    except ClassifyError as e:
      failed.append(str(e))
  if not images:
    return [], failed
  probabilities = model.signature(images=tf.constant(np.stack(images)))['probabilities']
  found = []
  for path, row in zip(read, probabilities.numpy()):
    best = np.argsort(-row, kind='stable')[:TOP_K]
    found.append((path, ', '.join('%s %.2f' % (model.names[i], row[i]) for i in best)))
  return found, failed


def read_bounded(path, max_bytes):
  """The bytes of the regular file at path, at most max_bytes; never a wait.

  training/directory.py's read_bounded, which every other program uses, kept to its
  core here: this program needs no project code (see the docstring). A FIFO would
  wait for a writer forever and /dev/zero never ends: both are refused before a read.

  A URL (gs://bucket/cat.png) is read through TensorFlow's file system, its size first.

  Raises:
    OSError: its strerror says what is wrong.
  """
  if '://' in path:
    try:
      if tf.io.gfile.stat(path).length > max_bytes:
        raise OSError(errno.EFBIG, 'more than %d bytes, the most this program reads'
                      % max_bytes)
      with tf.io.gfile.GFile(path, 'rb') as f:
        return f.read()
    except tf.errors.OpError as e:
      raise OSError(errno.EIO, _first_line(e)) from None
  with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), 'rb') as f:
    info = os.fstat(f.fileno())
    if not stat.S_ISREG(info.st_mode):
      raise OSError(errno.EINVAL, 'not a regular file (a FIFO, a device or a directory)')
    data = f.read(max_bytes + 1)
  if len(data) > max_bytes:
    raise OSError(errno.EFBIG, 'more than %d bytes, the most this program reads' % max_bytes)
  return data


def _first_line(e):
  """What an error says, in its first line that says something: without eager
  TensorFlow's {{function_node ...}} and [Op:...], nor a function's `Graph execution
  error:` heading and the stack it gives before the cause."""
  text = str(getattr(e, 'message', None) or e).strip()
  text = re.sub(r'\s*\[Op:.*$', '', re.sub(r'\{\{[^}]*\}\}\s*', '', text), flags=re.S)
  lines = [line.strip() for line in text.splitlines()
           if line.strip() and not line.startswith((' ', '\t')) and line.strip() not in
           ('Graph execution error:',) and not line.startswith('Detected at node')]
  return lines[0] if lines else type(e).__name__


def main(argv):
  paths = argv[1:]
  logging.set_verbosity(logging.WARNING)  # not the SavedModel loader's INFO lines
  if not FLAGS.model_dir:
    sys.exit('error: --model_dir is required: the --export_dir of export_model.py.')
  if not paths:
    sys.exit('error: no image files given. Name them after the flags: python classify.py '
             '--model_dir=%s cat.png dog.jpg' % FLAGS.model_dir)
  try:
    model = load(FLAGS.model_dir)
  except ClassifyError as e:
    sys.exit('error: %s' % e)
  found, failed = classify(model, paths)
  for message in failed:
    print('error: %s' % message, file=sys.stderr)
  for path, classes in found:
    print('%s: %s' % (path, classes))
  sys.exit(1 if failed else 0)


if __name__ == '__main__':
  define_flags()
  app.run(main)
