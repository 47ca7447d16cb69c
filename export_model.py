"""Writes a trained model as a SavedModel: the newest checkpoint's moving averages, with the
evaluation's preprocessing inside the graph.

    python export_model.py --train_dir=/tmp/cifar10_train --export_dir=/tmp/cifar10_model
    python export_model.py --dataset=mnist     # /tmp/mnist_train -> /tmp/mnist_model
    python classify.py --model_dir=/tmp/cifar10_model cat.png      # then use it

Its signature serving_default takes the data set's raw pixels and returns the classes:

    images         uint8 [N, 32, 32, 3] (CIFAR-10, RGB) or [N, 28, 28] (MNIST)
    classes        int64 [N], the most likely class: the argmax of the logits
    probabilities  float32 [N, 10], the softmax of the logits

Inside the graph: the evaluation reader's preprocessing (CIFAR-10: the central 24x24
crop, standardised per image; MNIST: the unscaled pixels as floats), then the network
with the moving-average (shadow) weights the evaluation programs restore. So on a test
set it scores the precision @ 1 that cifar10_eval.py (mnist_eval.py) prints for the same
checkpoint. Plain TensorFlow loads it, no project code needed:
tf.saved_model.load(DIR).signatures['serving_default'](images=...). The class names
travel with it, in DIR/assets.extra/class_names.txt: line i names class i.

It only reads --train_dir. An --export_dir that exists is refused, unless it holds a
SavedModel and --overwrite is given. The export is written beside --export_dir and
renamed into place, so a run that fails leaves nothing behind. Takes a few seconds.
"""
import os
import sys

from training import onednn, prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  prelude.start(sys.argv)  # first: Python 3.11+, --onednn, TensorFlow imported quietly

import collections
import shutil
import tempfile

from absl import app
from absl import flags
import tensorflow as tf

import cifar10
import cifar10_input
import mnist
import mnist_input
from training import checkpoints, errors, evaluation, placement

# ---- Where things are: edit, save, rerun -----------------------------------------
TRAIN_DIR = '/tmp/cifar10_train'      # the trainer's --train_dir
EXPORT_DIR = '/tmp/cifar10_model'     # the SavedModel: written as this directory
MNIST_TRAIN_DIR = '/tmp/mnist_train'  # the same two, --dataset=mnist
MNIST_EXPORT_DIR = '/tmp/mnist_model'

# ---- The SavedModel's interface: classify.py and TensorFlow Serving read these names ----
SIGNATURE_KEY = 'serving_default'     # the signature TensorFlow Serving and Keras call
INPUT_KEY = 'images'
CLASS_NAMES_FILE = os.path.join('assets.extra', 'class_names.txt')  # SavedModel's place for
                                                                    # files the graph never reads

# ---- The data sets: the network, the preprocessing, the raw image -----------------
DataSet = collections.namedtuple('DataSet', [
    'model',        # the model package: inference(images), MOVING_AVERAGE_DECAY, CLASS_NAMES
    'input',        # the input module: eval_images(uint8 images), the eval's preprocessing
    'image_shape',  # one raw image, as the data set stores it
    'train_dir', 'export_dir',  # the flags' defaults
    'trainer',      # the command that trains it, for the no-checkpoint message
])
DATASETS = {
    'cifar10': DataSet(cifar10, cifar10_input,
                       [cifar10_input.HEIGHT, cifar10_input.WIDTH, cifar10_input.DEPTH],
                       TRAIN_DIR, EXPORT_DIR, 'python multi_gpu_train.py'),
    'mnist': DataSet(mnist, mnist_input, [mnist_input.IMAGE_SIZE, mnist_input.IMAGE_SIZE],
                     MNIST_TRAIN_DIR, MNIST_EXPORT_DIR,
                     'python multi_gpu_train.py --dataset=mnist'),
}

FLAGS = flags.FLAGS


def define_flags():
  """This program's flags; called when it runs, so importing it defines none."""
  flags.DEFINE_enum('dataset', 'cifar10', list(DATASETS), 'The data set the checkpoint '
                    'was trained on (the trainer\'s --dataset).')
  flags.DEFINE_string('train_dir', None, 'The trainer\'s --train_dir; its newest checkpoint '
                      'is exported (default: %s; %s for mnist).' % (TRAIN_DIR, MNIST_TRAIN_DIR))
  flags.DEFINE_string('export_dir', None, 'The SavedModel is written as this directory, '
                      'which must not exist yet (default: %s; %s for mnist).'
                      % (EXPORT_DIR, MNIST_EXPORT_DIR))
  flags.DEFINE_boolean('overwrite', False, 'Replace --export_dir when it holds a SavedModel '
                       'already, saying so. Without it an existing --export_dir is refused; '
                       'a directory that is not a SavedModel is refused even with it.')
  onednn.define_flag(__name__)


class ExportError(Exception):
  """The SavedModel cannot be written; the message says why and what to do."""


# The serving graph's ends: what the signature names.
Signature = collections.namedtuple('Signature', [
    'images',         # uint8 [N] + image_shape, the placeholder
    'classes',        # int64 [N]
    'probabilities',  # float32 [N, 10]
])


def build(data):
  """The serving graph, in the current graph: raw pixels -> preprocessing -> network.

  Returns:
    a Signature.
  """
  images = tf.compat.v1.placeholder(tf.uint8, [None] + data.image_shape, name=INPUT_KEY)
  logits = data.model.inference(data.input.eval_images(images))
  classes = tf.argmax(logits, axis=1, output_type=tf.int64, name='classes')
  probabilities = tf.nn.softmax(logits, name='probabilities')
  return Signature(images, classes, probabilities)


def variables_to_restore(model):
  """{checkpoint name: variable}: each weight from its shadow copy, as the evaluation
  restores it (conv1/weights <- conv1/weights/ExponentialMovingAverage)."""
  ema = tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY)
  return ema.variables_to_restore()


def check_export_dir(export_dir, overwrite):
  """Returns True when an export is to be replaced; raises ExportError when it may not be."""
  if not os.path.lexists(export_dir):
    return False
  if not (os.path.isdir(export_dir) and tf.saved_model.contains_saved_model(export_dir)):
    raise ExportError('--export_dir %s exists and is not a SavedModel; nothing was written. '
                      'Name a directory that does not exist yet: the SavedModel is written '
                      'as that directory.' % export_dir)
  if not overwrite:
    raise ExportError('--export_dir %s holds a SavedModel already; nothing was written. '
                      'Pass --overwrite to replace it, or name another --export_dir.'
                      % export_dir)
  return True


def newest_checkpoint(train_dir, data):
  """The checkpoint the evaluation would score, its global step, and {name: shape} of
  what it holds.

  Raises:
    ExportError: no checkpoint, or one that cannot be read.
  """
  try:
    path = evaluation.latest_checkpoint(train_dir)
  except evaluation.EvalError as e:
    raise ExportError(str(e)) from None
  if path is None:
    raise ExportError('no checkpoint in %s: nothing to export. Train first (%s '
                      '--train_dir=%s), or point --train_dir at the trainer\'s --train_dir.'
                      % (train_dir, data.trainer, train_dir))
  try:
    reader = tf.train.load_checkpoint(path)
    found = reader.get_variable_to_shape_map()
    step = int(reader.get_tensor('global_step'))
  except Exception as e:  # OpError, ValueError: missing, truncated, not a checkpoint
    raise ExportError('cannot read checkpoint %s: %s' % (path, checkpoints.restore_error(e)))
  return path, step, found


def check_holds_network(path, data, to_restore, found):
  """Raises ExportError unless the checkpoint at path, holding found ({name: shape}),
  has every variable of to_restore (variables_to_restore of data's network, built)."""
  wrong = _mismatch(to_restore, found)
  if wrong:
    fits = [name for name, other in DATASETS.items()
            if other is not data and not _mismatch(_network_variables(other), found)]
    raise ExportError('%s does not hold the %s network (%s). %s' % (
        path, data.model.__name__, wrong,
        'It holds the %s network: pass --dataset=%s.' % (fits[0], fits[0]) if fits else
        'Point --train_dir at a directory the trainer (multi_gpu_train.py, dist_train.py) '
        'wrote.'))


def _network_variables(data):
  """variables_to_restore of data's network, built in a throwaway graph."""
  with tf.Graph().as_default():
    build(data)
    return variables_to_restore(data.model)


def _mismatch(to_restore, found):
  """The first moving average the checkpoint lacks or holds in another shape, in words;
  None when it holds them all. to_restore: {name: variable}; found: {name: shape} of
  the checkpoint."""
  for name, var in sorted(to_restore.items()):
    if name not in found:
      return 'it has no %s' % name
    if found[name] != var.shape.as_list():
      return '%s is %s there, %s in the network' % (name, found[name], var.shape.as_list())
  return None


def write(sess, signature, export_dir, replacing, class_names):
  """Writes the session's graph and variables as a SavedModel at export_dir.

  Written into a temporary directory beside export_dir, then renamed into place: a
  failure, or Ctrl-C, leaves export_dir as it was and removes what was written.
  """
  parent = os.path.dirname(os.path.abspath(export_dir))
  created = _first_missing(parent)
  try:
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix='.%s.export-' % os.path.basename(export_dir), dir=parent)
  except OSError as e:
    raise ExportError('cannot write into %s: %s. Name an --export_dir you can write to.'
                      % (parent, e.strerror)) from None
  done = False
  try:
    staged = os.path.join(staging, 'model')
    builder = tf.compat.v1.saved_model.Builder(staged)
    builder.add_meta_graph_and_variables(
        sess, [tf.saved_model.SERVING], strip_default_attrs=True,
        signature_def_map={SIGNATURE_KEY: tf.compat.v1.saved_model.predict_signature_def(
            inputs={INPUT_KEY: signature.images},
            outputs={'classes': signature.classes,
                     'probabilities': signature.probabilities})})
    builder.save()
    os.makedirs(os.path.dirname(os.path.join(staged, CLASS_NAMES_FILE)))
    with open(os.path.join(staged, CLASS_NAMES_FILE), 'w') as f:
      f.write(''.join(name + '\n' for name in class_names))
    if replacing:
      print('--overwrite: replacing the SavedModel in %s.' % export_dir)
      replaced = os.path.join(staging, 'replaced')
      os.rename(export_dir, replaced)
      try:
        os.rename(staged, export_dir)
      except BaseException:
        os.rename(replaced, export_dir)  # the old export back in its place
        raise
    else:
      os.rename(staged, export_dir)
    done = True
  except (OSError, tf.errors.OpError) as e:
    raise ExportError('cannot write the SavedModel %s: %s. Free some space, or name an '
                      '--export_dir you can write to.' % (export_dir, errors.os_error(
                          e, staged))) from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)
    if created and not done:
      shutil.rmtree(created, ignore_errors=True)


def _first_missing(path):
  """The outermost directory of path that does not exist yet (to remove on failure), or None."""
  missing = None
  while not os.path.exists(path):
    missing, path = path, os.path.dirname(path)
  return missing


def export(train_dir, export_dir, dataset, overwrite=False):
  """Writes train_dir's newest checkpoint, with its moving averages, as a SavedModel.

  Args:
    dataset: a key of DATASETS.
    overwrite: replace an export already at export_dir (never another directory).

  Returns:
    (the checkpoint's path, its global step).

  Raises:
    ExportError: nothing was written; the message says why and what to do.
  """
  data = DATASETS[dataset]
  replacing = check_export_dir(export_dir, overwrite)
  path, step, found = newest_checkpoint(train_dir, data)
  with tf.Graph().as_default():
    signature = build(data)
    to_restore = variables_to_restore(data.model)
    check_holds_network(path, data, to_restore, found)
    saver = tf.compat.v1.train.Saver(to_restore)
    with tf.compat.v1.Session() as sess:
      try:
        saver.restore(sess, path)
      except (tf.errors.OpError, ValueError) as e:
        raise ExportError('cannot restore %s: %s' % (path, checkpoints.restore_error(e)))
      write(sess, signature, export_dir, replacing, data.model.CLASS_NAMES)
  return path, step


def main(argv):
  errors.refuse_arguments(argv)  # absl has already refused unknown flags
  data = DATASETS[FLAGS.dataset]
  train_dir = FLAGS.train_dir or data.train_dir
  export_dir = FLAGS.export_dir or data.export_dir
  tf.compat.v1.disable_eager_execution()
  # ERROR: the v1 builder warns that it is v1 at every signature; writing v1 is the point.
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  try:
    path, step = export(train_dir, export_dir, FLAGS.dataset, FLAGS.overwrite)
  except ExportError as e:
    sys.exit('error: %s' % e)
  except KeyboardInterrupt:  # write() has removed what it wrote
    print('Stopped by Ctrl-C; %s is as it was.' % export_dir, file=sys.stderr, flush=True)
    sys.exit(130)
  shape = ', '.join(['N'] + [str(size) for size in data.image_shape])
  print('Wrote %s: a SavedModel of %s, moving averages (global step %d).'
        % (export_dir, path, step))
  print('Signature %s: %s uint8 [%s] -> classes int64 [N], probabilities float32 [N, %d]; '
        'class names in %s.' % (SIGNATURE_KEY, INPUT_KEY, shape, data.model.NUM_CLASSES,
                                os.path.join(export_dir, CLASS_NAMES_FILE)))
  print('Classify image files with it: python classify.py --model_dir=%s cat.png'
        % export_dir)


if __name__ == '__main__':
  define_flags()
  placement.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
