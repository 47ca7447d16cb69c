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

It only reads --train_dir. An --export_dir that exists is refused. --overwrite replaces
only an export this program wrote: it lists what it wrote in
DIR/assets.extra/export_model.json, and a directory without that record, or holding
anything the record does not list (a NOTES.txt, a 2/ beside it), is refused, naming what
is there. The export is written beside --export_dir and renamed into place, so a run that
fails, or is stopped by Ctrl-C or SIGTERM, leaves nothing behind. Takes a few seconds.
"""
import os
import sys

from training import machine, prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  prelude.start(sys.argv, hold_signals=True)  # first: Python 3.11+, --onednn, a signal
                                              # held till main(), TensorFlow imported quietly

import collections
import json
import shutil
import stat
import tempfile

from absl import app
from absl import flags
import tensorflow as tf

import cifar10
import cifar10_input
import mnist
import mnist_input
from training import checkpoints, directory, errors, evaluation, signals, storage

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
# What this program wrote, so that --overwrite removes that and nothing else.
RECORD_FILE = os.path.join('assets.extra', 'export_model.json')
RECORD_MAX_BYTES = 1 << 16  # a record lists a few files; a bigger one is not this program's
SHOWN_ENTRIES = 5           # a refusal names at most this many of a directory's entries

# ---- The data sets: the network, the preprocessing, the raw image -----------------
DataSet = collections.namedtuple('DataSet', [
    'model',        # the model package: inference(images), MOVING_AVERAGE_DECAY, CLASS_NAMES
    'input',        # the input module: eval_images(uint8 images), the eval's preprocessing
    'image_shape',  # one raw image, as the data set stores it
    'train_dir', 'export_dir',  # the flags' defaults
    'trainer',      # the command that trains it, for the no-checkpoint message
    'example',      # an image file it classifies, for the closing hint
])
DATASETS = {
    'cifar10': DataSet(cifar10, cifar10_input,
                       [cifar10_input.HEIGHT, cifar10_input.WIDTH, cifar10_input.DEPTH],
                       TRAIN_DIR, EXPORT_DIR, 'python multi_gpu_train.py', 'cat.png'),
    'mnist': DataSet(mnist, mnist_input, [mnist_input.IMAGE_SIZE, mnist_input.IMAGE_SIZE],
                     MNIST_TRAIN_DIR, MNIST_EXPORT_DIR,
                     'python multi_gpu_train.py --dataset=mnist', 'seven.png'),
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
  flags.DEFINE_boolean('overwrite', False, 'Replace --export_dir when it holds an export '
                       'this program wrote (listed in its %s), saying so. Anything else is '
                       'refused, naming what is there: a directory without that record '
                       '(another program\'s SavedModel, an export of an older version), or '
                       'one holding files the record does not list.' % RECORD_FILE)
  machine.define_flag(__name__)


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
  """What --overwrite is to remove of the export at export_dir: {path relative to it:
  'file' or 'dir'}, every entry there, each listed in its RECORD_FILE. None when
  export_dir does not exist.

  Raises:
    ExportError: it exists and may not be replaced; the message names what is there.
  """
  if not storage.is_local(export_dir):
    if storage.exists(export_dir):
      raise ExportError('--export_dir %s exists; nothing was written. An export on object '
                        'storage is not replaced (%s): remove it, or name another.'
                        % (export_dir, storage.RENAME_NOTE))
    return None
  if not os.path.lexists(export_dir):
    return None
  if os.path.islink(export_dir) or not os.path.isdir(export_dir):
    raise ExportError('--export_dir %s exists and is not a directory; nothing was written. '
                      'Name a directory that does not exist yet: the SavedModel is written '
                      'as that directory.' % export_dir)
  if not tf.saved_model.contains_saved_model(export_dir):
    raise ExportError('--export_dir %s exists and is not a SavedModel; nothing was written. '
                      'Name a directory that does not exist yet: the SavedModel is written '
                      'as that directory.' % export_dir)
  found = _entries(export_dir)
  listed = _read_record(export_dir, found)
  foreign = sorted(path for path, kind in found.items() if listed.get(path) != kind and
                   _outermost(path, found, listed))
  if foreign:
    raise ExportError('--export_dir %s holds %s, which export_model.py did not write; '
                      'nothing was written. --overwrite replaces only what this program '
                      'wrote: move them out of %s, or name another --export_dir.' % (
                          export_dir, _shown(foreign, found), export_dir))
  if not overwrite:
    raise ExportError('--export_dir %s holds a SavedModel already; nothing was written. '
                      'Pass --overwrite to replace it, or name another --export_dir.'
                      % export_dir)
  return found


def _entries(root):
  """{path relative to root: 'dir', 'file' or 'other' (a link, a FIFO...)} of everything
  under root; links are not followed."""
  found = {}
  if not storage.is_local(root):  # an object store has no links or FIFOs
    for top, subdirs, files in tf.io.gfile.walk(root):
      below = top.rstrip('/')[len(root.rstrip('/')):].strip('/')
      prefix = below + '/' if below else ''
      found.update({prefix + name.rstrip('/'): 'dir' for name in subdirs})
      found.update({prefix + name: 'file' for name in files})
    return found

  def visit(directory, prefix):
    with os.scandir(directory) as listing:
      for entry in listing:
        path = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
          found[path] = 'dir'
          visit(entry.path, path + '/')
        else:
          found[path] = 'file' if entry.is_file(follow_symlinks=False) else 'other'
  try:
    visit(root, '')
  except OSError as e:
    raise ExportError('cannot read --export_dir %s: %s; nothing was written. Name another '
                      '--export_dir.' % (root, e.strerror or e)) from None
  return found


def _read_record(export_dir, found):
  """{path: 'file' or 'dir'} that RECORD_FILE lists: what this program wrote there.

  Read only if it is a regular file of at most RECORD_MAX_BYTES (not a FIFO, which a
  read would wait on forever, nor a link): directory.read_bounded.

  Raises:
    ExportError: no record, or not one this program wrote; naming what export_dir holds.
  """
  path = os.path.join(export_dir, RECORD_FILE)
  try:
    data = directory.read_bounded(path, RECORD_MAX_BYTES, follow_links=False)
  except FileNotFoundError:
    why_not = 'it has no %s' % RECORD_FILE
  except OSError as e:  # a link, a FIFO, a device, too large: directory.read_bounded says
    why_not = 'its %s cannot be read: %s' % (RECORD_FILE, e.strerror)
  else:
    why_not, listed = _parse_record(data)
    if why_not is None:
      return listed
  top = [path for path in found if '/' not in path]
  raise ExportError(
      '--export_dir %s is not an export of export_model.py (%s; it holds %s); nothing was '
      'written. --overwrite replaces only what this program wrote: delete %s yourself if '
      'it is an older export you no longer need, or name another --export_dir.'
      % (export_dir, why_not, _shown(sorted(top), found), export_dir))


def _parse_record(data):
  """(None, {path: 'file' or 'dir'}) of a record's bytes, or (why not, None)."""
  try:
    record = directory.parse_json(data.decode('utf-8'))
    files, directories = record['files'], record['directories']
    if record['written_by'] != 'export_model.py':
      raise ValueError
    if not all(isinstance(p, str) for p in files + directories):
      raise ValueError
  except (ValueError, KeyError, TypeError):  # UnicodeDecodeError, JSONDecodeError too
    return 'its %s is not a record of export_model.py' % RECORD_FILE, None
  listed = dict.fromkeys(directories, 'dir')
  listed.update(dict.fromkeys(files, 'file'))
  return None, listed


def _outermost(path, found, listed):
  """False when a directory above path is itself foreign: the refusal names that one."""
  parts = path.split('/')
  return not any(listed.get('/'.join(parts[:i])) != found['/'.join(parts[:i])]
                 for i in range(1, len(parts)))


def _shown(paths, found):
  """The first SHOWN_ENTRIES of paths, a directory with a slash, for a one-line message."""
  names = [p + '/' if found[p] == 'dir' else p for p in paths]
  more = ' and %d more' % (len(names) - SHOWN_ENTRIES) if len(names) > SHOWN_ENTRIES else ''
  return ', '.join(names[:SHOWN_ENTRIES]) + more


def newest_checkpoint(train_dir, data, went_away=None):
  """The checkpoint the evaluation would score, its global step, and {name: shape} of
  what it holds. One that a running trainer rotates away while it is read (not
  went_away, which already did) is said, and the newest read instead.

  Raises:
    ExportError: no checkpoint, or one that cannot be read.
  """
  while True:
    try:
      path = evaluation.latest_checkpoint(train_dir)
    except errors.EvalError as e:
      raise ExportError(str(e)) from None
    if path is None:
      raise ExportError('no checkpoint in %s: nothing to export. Train first (%s '
                        '--train_dir=%s), or point --train_dir at the trainer\'s --train_dir.'
                        % (train_dir, data.trainer, train_dir))
    try:
      found = tf.train.load_checkpoint(path).get_variable_to_shape_map()
      return path, checkpoints.step_of(path), found
    except Exception as e:  # OpError, ValueError: missing, truncated, not a checkpoint
      if not checkpoints.rotated_away(path, went_away):
        raise ExportError('cannot read checkpoint %s: %s' % (
            path, checkpoints.restore_error(e))) from None
      went_away = path


def check_holds_network(path, data, to_restore, found):
  """Raises ExportError unless the checkpoint at path, holding found ({name: shape}),
  has every variable of to_restore (variables_to_restore of data's network, built)."""
  wrong = evaluation.mismatch(to_restore, found)
  if wrong:
    held = evaluation.network_held(found, DATASETS, other_than=data.model)
    raise ExportError('%s does not hold the %s network (%s). %s' % (
        path, data.model.__name__, wrong,
        'It holds the %s network: pass --dataset=%s.' % (held, held) if held else
        'Point --train_dir at a directory the trainer (multi_gpu_train.py, dist_train.py) '
        'wrote.'))


def write(sess, signature, export_dir, replaced, class_names, checkpoint, record):
  """Writes the session's graph and variables as a SavedModel at export_dir.

  Written into a temporary directory beside export_dir, then renamed into place: a
  failure, Ctrl-C or SIGTERM leaves export_dir as it was and removes what was written.

  Args:
    replaced: check_export_dir's entries of the export to replace, or None.
    checkpoint: the path it is written from, as the user gave it (printed).
    record: {name: value} for RECORD_FILE; the listing of what is written is added.
  """
  print('Writing %s from %s.' % (export_dir, checkpoint), flush=True)
  if not storage.is_local(export_dir):
    _write_to_store(sess, signature, export_dir, class_names, record)
    return
  parent = os.path.dirname(os.path.abspath(export_dir))
  created = _first_missing(parent)
  staging, done = None, False
  try:
    with signals.held():  # a signal waits until staging is named, for finally to remove
      staging = _make_staging(parent, os.path.basename(export_dir))
    staged = os.path.join(staging, 'model')
    _write_staged(sess, signature, staged, class_names, record)
    with signals.held():  # the swap and the removal of the old export, never cut in two
      _put_in_place(staged, export_dir, replaced, staging)
      done = True
      _remove_staging(staging, replaced)
    # In place: the export is done. A signal from here on (the session closing, the
    # lines that say so) changes nothing; raised there, it was said to have removed it.
    signals.ignore()
  except signals.Interrupted as e:
    e.finished = done  # it came while the export was moved into place: that came first
    raise
  except (OSError, tf.errors.OpError) as e:
    raise ExportError('cannot write the SavedModel %s: %s. Free some space, or name an '
                      '--export_dir you can write to.' % (export_dir, errors.os_error(
                          e, staged))) from None
  finally:
    if not done:
      with signals.held(reraise=False):  # the program is stopping already
        if staging:
          _remove_staging(staging, None)
        _remove_created(parent, created)


def _write_to_store(sess, signature, export_dir, class_names, record):
  """write() on an object store (gs://): straight into export_dir, which did not exist
  (check_export_dir), since a rename there is a copy and a delete, no more whole than
  this. Its RECORD_FILE is written last; a failure, Ctrl-C or SIGTERM removes export_dir,
  which holds only what this run wrote."""
  done = False
  try:
    _write_staged(sess, signature, export_dir, class_names, record)
    done = True
    signals.ignore()  # written whole: a signal from here on changes nothing (as write())
  except (OSError, tf.errors.OpError) as e:
    raise ExportError('cannot write the SavedModel %s: %s. Name an --export_dir you can '
                      'write to.' % (export_dir, errors.os_error(e, export_dir))) from None
  finally:
    if not done:
      with signals.held(reraise=False):  # the program is stopping already
        storage.remove(export_dir)


def _make_staging(parent, name):
  """A new directory beside the export, hidden: .NAME.export-XXXXXXXX."""
  try:
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix='.%s.export-' % name, dir=parent)
  except OSError as e:
    raise ExportError('cannot write into %s: %s. Name an --export_dir you can write to.'
                      % (parent, e.strerror)) from None


def _write_staged(sess, signature, staged, class_names, record):
  """The SavedModel, its class names, and last its RECORD_FILE listing all of it."""
  builder = tf.compat.v1.saved_model.Builder(staged)
  builder.add_meta_graph_and_variables(
      sess, [tf.saved_model.SERVING], strip_default_attrs=True,
      signature_def_map={SIGNATURE_KEY: tf.compat.v1.saved_model.predict_signature_def(
          inputs={INPUT_KEY: signature.images},
          outputs={'classes': signature.classes,
                   'probabilities': signature.probabilities})})
  builder.save()
  storage.makedirs(os.path.dirname(os.path.join(staged, CLASS_NAMES_FILE)))
  storage.write(os.path.join(staged, CLASS_NAMES_FILE),
                ''.join(name + '\n' for name in class_names))
  written = _entries(staged)
  written[RECORD_FILE.replace(os.sep, '/')] = 'file'
  storage.write(os.path.join(staged, RECORD_FILE), json.dumps(dict(
      record, files=sorted(p for p, kind in written.items() if kind == 'file'),
      directories=sorted(p for p, kind in written.items() if kind == 'dir')), indent=1) + '\n')


def _put_in_place(staged, export_dir, replaced, staging):
  """Renames staged to export_dir; an export there is first renamed into staging."""
  if replaced is None:
    os.rename(staged, export_dir)  # fails if export_dir appeared meanwhile: never merged
    return
  print('--overwrite: replacing the export in %s.' % export_dir, flush=True)
  old = os.path.join(staging, 'replaced')
  os.rename(export_dir, old)
  try:
    os.rename(staged, export_dir)
  except BaseException:
    os.rename(old, export_dir)  # the old export back in its place
    raise


def _remove_staging(staging, replaced):
  """Removes the staging directory: the model written there (this run's), and of the
  export replaced only the entries check_export_dir found listed in its record.

  Whatever else is there (put into the old export after it was checked) is kept, and a
  line on stderr names where.
  """
  shutil.rmtree(os.path.join(staging, 'model'), ignore_errors=True)  # this run wrote it all
  old = os.path.join(staging, 'replaced')
  for path in sorted(replaced or {}, reverse=True):  # a directory after what it holds
    full = os.path.join(old, path)
    try:
      if replaced[path] == 'dir':
        os.rmdir(full)
      elif stat.S_ISREG(os.lstat(full).st_mode):
        os.remove(full)
    except OSError:  # gone, or a directory that holds more than was written: kept
      pass
  for kept in (old, staging):
    try:
      os.rmdir(kept)
    except FileNotFoundError:
      pass
    except OSError as e:
      print('Kept %s: %s. It holds what export_model.py did not write or could not remove; '
            'look through it, then delete it.' % (kept, e.strerror),
            file=sys.stderr, flush=True)
      return


def _first_missing(path):
  """The outermost directory of path that does not exist yet (to remove on failure), or None."""
  missing = None
  while not os.path.exists(path):
    missing, path = path, os.path.dirname(path)
  return missing


def _remove_created(parent, created):
  """Removes the directories this run created above the export (created down to parent),
  each only if empty: one that holds anything is someone's."""
  if created is None:
    return
  path = parent
  while True:
    try:
      os.rmdir(path)
    except OSError:
      return
    if path == created:
      return
    path = os.path.dirname(path)


def export(train_dir, export_dir, dataset, overwrite=False):
  """Writes train_dir's newest checkpoint, with its moving averages, as a SavedModel.

  Args:
    dataset: a key of DATASETS.
    overwrite: replace an export this program wrote at export_dir (check_export_dir).

  Returns:
    (the checkpoint's path, its global step).

  Raises:
    ExportError: nothing was written; the message says why and what to do.
  """
  data = DATASETS[dataset]
  try:
    storage.check(train_dir, '--train_dir')
    storage.check(export_dir, '--export_dir')
  except errors.TrainingError as e:
    raise ExportError(str(e)) from None
  replaced = check_export_dir(export_dir, overwrite)
  went_away = None  # a checkpoint a running trainer rotated away meanwhile: the newest
  while True:
    path, step, found = newest_checkpoint(train_dir, data, went_away)
    if export_checkpoint(path, step, found, data, export_dir, replaced, went_away):
      return path, step
    went_away = path


def export_checkpoint(path, step, found, data, export_dir, replaced, went_away):
  """export()'s work on one checkpoint (found: {name: shape} of what it holds); False
  when it was rotated away before it could be restored (checkpoints.rotated_away)."""
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    signature = build(data)
    to_restore = variables_to_restore(data.model)
    check_holds_network(path, data, to_restore, found)
    saver = tf.compat.v1.train.Saver(to_restore)
    try:
      saver.restore(sess, path)
    except (tf.errors.OpError, ValueError) as e:
      if checkpoints.rotated_away(path, went_away):
        return False
      raise ExportError('cannot restore %s: %s' % (path, checkpoints.restore_error(e)))
    write(sess, signature, export_dir, replaced, data.model.CLASS_NAMES, path,
          {'written_by': 'export_model.py', 'dataset': data.model.__name__,
           'checkpoint': storage.abspath(path), 'global_step': step})
  return True


def main(argv):
  with errors.one_line_errors():
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
  data = DATASETS[FLAGS.dataset]
  for name in ('train_dir', 'export_dir'):
    if FLAGS[name].value == '':  # not the default: the user meant a directory
      sys.exit('error: --%s is empty; name the directory to %s, or leave the flag out for '
               'the default %s.' % (name, 'read the checkpoint from' if name == 'train_dir'
                                    else 'write the SavedModel as', getattr(data, name)))
  train_dir = FLAGS.train_dir or data.train_dir
  export_dir = FLAGS.export_dir or data.export_dir
  exporting = False  # one try from the handler on: a signal anywhere after it is said
  try:
    signals.raise_on_signals()  # SIGTERM too stops it where it is, removing what it wrote
    tf.compat.v1.disable_eager_execution()
    # ERROR: the v1 builder warns that it is v1 at every signature; writing v1 is the point.
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    exporting = True
    path, step = export(train_dir, export_dir, FLAGS.dataset, FLAGS.overwrite)
  except ExportError as e:
    sys.exit('error: %s' % e)
  except signals.Interrupted as e:  # write() has removed what it wrote, unless in place
    if not exporting:  # heard while TensorFlow loaded (held till now), or before export()
      print('Stopped by %s before anything was written.' % e.name, file=sys.stderr,
            flush=True)
    elif e.finished:
      print('Stopped by %s once %s was written whole.' % (e.name, export_dir),
            file=sys.stderr, flush=True)
    else:
      print('Stopped by %s; the partial export is removed: %s is as it was.'
            % (e.name, export_dir), file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  # write() ignores signals from the swap on: these lines are never cut, nor denied after.
  say_written(export_dir, path, step, data)


def say_written(export_dir, path, step, data):
  """The lines after a whole export: what it is, its signature, how to use it."""
  shape = ', '.join(['N'] + [str(size) for size in data.image_shape])
  print('Wrote %s: a SavedModel of %s, moving averages (global step %d).'
        % (export_dir, path, step))
  print('Signature %s: %s uint8 [%s] -> classes int64 [N], probabilities float32 [N, %d]; '
        'class names in %s.' % (SIGNATURE_KEY, INPUT_KEY, shape, data.model.NUM_CLASSES,
                                os.path.join(export_dir, CLASS_NAMES_FILE)))
  print('Classify image files with it: python classify.py --model_dir=%s %s'
        % (export_dir, data.example))


if __name__ == '__main__':
  define_flags()
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
