"""What the programs write: checkpoints, event files, the data sets, trees and modes."""
import collections
import contextlib
import glob
import os
import shutil


# ---- Checkpoints and event files ---------------------------------------------------------

def checkpoint(path):
  """{variable name: value} of a checkpoint, or of the latest one in a directory."""
  import tensorflow as tf
  reader = tf.train.load_checkpoint(str(path))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def global_step(path):
  """The global step stored in a checkpoint, or in the latest one of a directory."""
  import tensorflow as tf
  return int(tf.train.load_checkpoint(str(path)).get_tensor('global_step'))


def copy_checkpoint(checkpoint_path, train_dir):
  """Copies one checkpoint into a new train_dir, as its only (latest) one."""
  os.makedirs(train_dir)
  for path in glob.glob(str(checkpoint_path) + '.*'):
    shutil.copy(path, train_dir)
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % os.path.basename(str(checkpoint_path)))


def event_files(directory):
  return sorted(glob.glob(os.path.join(str(directory), 'events.out.tfevents.*')))


def scalars_per_file(directory, tag):
  """[{step: value} of tag, one dict per event file in name order], as TensorBoard reads them."""
  from tensorboard.backend.event_processing import event_accumulator
  found = []
  for path in event_files(directory):
    events = event_accumulator.EventAccumulator(path, size_guidance={'scalars': 0})
    events.Reload()
    found.append({e.step: e.value for e in events.Scalars(tag)}
                 if tag in events.Tags()['scalars'] else {})
  return found


def scalars(directory, tag):
  """{step: value} of tag over every event file of the directory."""
  merged = {}
  for values in scalars_per_file(directory, tag):
    merged.update(values)
  return merged


def summary_tags(directory):
  """Every tag of every summary value in the directory's event files."""
  import tensorflow as tf
  return {value.tag for path in event_files(directory)
          for event in tf.compat.v1.train.summary_iterator(path)
          for value in event.summary.value}


def scalar_steps_per_file(directory, tag):
  """[[the step of every event of tag, in order, repeats kept], one list per event file].

  scalars_per_file's dicts keep one value per step; this shows a step written twice.
  """
  from tensorboard.backend.event_processing import event_accumulator
  found = []
  for path in event_files(directory):
    events = event_accumulator.EventAccumulator(path, size_guidance={'scalars': 0})
    events.Reload()
    found.append([e.step for e in events.Scalars(tag)]
                 if tag in events.Tags()['scalars'] else [])
  return found


# ---- Data sets, from the product's own sample writers -----------------------------------

class Sample(collections.namedtuple('Sample', ['dir', 'md5'])):
  """A data set from cifar10_input.write_sample: its directory and its archive's md5."""

  @property
  def flags(self):
    return ['--data_dir=%s' % self.dir, '--data_md5=%s' % self.md5]


def write_sample(path, records_per_file):
  """A CIFAR-10 sample in the real binary layout, in path; returns its Sample."""
  import cifar10_input  # imports TensorFlow: only once a test asks for data
  return Sample(str(path), cifar10_input.write_sample(str(path), records_per_file))


def cifar10_test_records(data_dir):
  """(uint8 [n, 32, 32, 3] RGB images, int labels [n]) of test_batch.bin, read by hand."""
  import numpy as np
  import cifar10_input
  raw = np.fromfile(os.path.join(cifar10_input.batches_dir(data_dir), 'test_batch.bin'),
                    np.uint8).reshape(-1, cifar10_input.RECORD_BYTES)
  return raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), raw[:, 0].astype(np.int64)


# ---- Files and their modes ---------------------------------------------------------------

def tree(root):
  """The paths of every file under root, relative to it, sorted."""
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(str(root)) for f in files)


@contextlib.contextmanager
def umask(mask):
  """Runs the block under this umask, then restores the one before."""
  before = os.umask(mask)
  try:
    yield
  finally:
    os.umask(before)


def modes(root):
  """{path relative to root: permission bits} of every file and directory under root."""
  found = {}
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(directory, name)
      found[os.path.relpath(path, root)] = os.stat(path).st_mode & 0o777
  return found


def write_start_checkpoint(train_dir):
  """Writes model.ckpt-0 of a fresh CIFAR-10 model, its initial weights seeded: the same
  values at every call, so runs made by separate fixtures start from one point."""
  import tensorflow as tf
  import cifar10
  import multi_gpu_train
  from training import checkpoints
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    batch = (tf.zeros([8, 24, 24, 3]), tf.zeros([8], tf.int32))
    multi_gpu_train.build(lambda: batch, ['/cpu:0'], 8, cifar10.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
                          summaries=False)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      checkpoints.save_checkpoint(sess, checkpoints.make_saver(), str(train_dir), 0, keep=1)


def other_checkout(tmp_path, path, edits):
  """A copy of the project (without .git and tests) at tmp_path/other_checkout, as a task
  started from another checkout runs it, whose file `path` has each (pattern,
  replacement) of edits made wherever it matches (re.M), at least once; returns the
  copy's root."""
  import re
  import shutil
  from helpers.processes import ROOT
  copy = tmp_path / 'other_checkout'
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns('.git', 'tests'))
  edited = copy / path
  text = edited.read_text()
  for pattern, replacement in edits:
    text, count = re.subn(pattern, replacement, text, flags=re.M)
    assert count, 'nothing matches in %s: %s' % (edited, pattern)
  edited.write_text(text)
  return copy
