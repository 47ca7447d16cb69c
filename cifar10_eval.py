"""Evaluates the CIFAR-10 model: precision @ 1 of the latest checkpoint.

    python cifar10_eval.py --run_once                 # once, then exit
    python cifar10_eval.py                            # beside training: every 5 minutes

Builds the inference graph from code, restores the moving-average (shadow) values
of the trainer's latest checkpoint into it, and scores every record of the test
set (or, with --eval_data=train_eval, of the training set) exactly once.
The original tutorial reports precision @ 1 of about 0.86 after 100K steps on one
GPU, batch 128. Without the data set: python cifar10_input.py --write_sample=DIR.

It only reads --checkpoint_dir: it never writes, locks or deletes the trainer's
files. Results go to stdout and to TensorBoard event files in --eval_dir.
"""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's errors only; no INFO, WARNING

import datetime
import sys
import time

from absl import app
from absl import flags
import tensorflow as tf

import cifar10
import cifar10_input
import training_run

# ---- Evaluation knobs: edit, save, rerun --------------------------------------
EVAL_INTERVAL_SECS = 300              # seconds between evaluations beside a training job
BATCH_SIZE = 128                      # images per batch; the last batch holds the rest
CHECKPOINT_DIR = '/tmp/cifar10_train'  # the trainer's --train_dir
EVAL_DIR = '/tmp/cifar10_eval'        # event files of this program
DATA_DIR = '/tmp/cifar10_data'

FLAGS = flags.FLAGS
flags.DEFINE_string('eval_dir', EVAL_DIR, 'Where to write event files.')
flags.DEFINE_enum('eval_data', 'test', ['test', 'train_eval'],
                  'test: the 10,000 test images; train_eval: the 50,000 training images.')
flags.DEFINE_string('checkpoint_dir', CHECKPOINT_DIR, 'Where the trainer writes checkpoints.')
flags.DEFINE_string('data_dir', DATA_DIR, 'CIFAR-10 archive and extracted files.')
flags.DEFINE_string('data_url', cifar10_input.DATA_URL, 'Where to download the archive.')
flags.DEFINE_string('data_md5', cifar10_input.DATA_MD5, 'md5 of the archive at --data_url.')
flags.DEFINE_integer('eval_interval_secs', EVAL_INTERVAL_SECS, 'Seconds between evaluations.')
flags.DEFINE_boolean('run_once', False, 'Evaluate the latest checkpoint once and exit.')
flags.DEFINE_integer('batch_size', BATCH_SIZE, 'Images per batch.')
flags.DEFINE_boolean('use_moving_averages', True, 'Restore the moving averages of the '
                     'weights (as the tutorial); false: the raw trained values.')


class EvalError(Exception):
  """Evaluation cannot go on; the message says why and what to do."""


def latest_checkpoint(checkpoint_dir):
  """Path of the newest checkpoint, None when there is none yet.

  A state file naming absolute paths of another directory (this one was moved
  or copied) is read as the trainer reads it: the file of that name here first.

  Raises:
    EvalError: a 'checkpoint' state file exists but cannot be parsed (TensorFlow
      would silently report no checkpoint and this program would wait forever).
  """
  try:
    named = training_run.read_state_file(checkpoint_dir)
  except training_run.TrainingError as e:
    raise EvalError(str(e)) from None
  if named is None:
    return None
  notes = []
  path = training_run.in_this_dir(checkpoint_dir, named[0], notes)
  for note in notes:
    print(note)
  return path


def evaluate(checkpoint_path, data_dir, eval_data, batch_size, use_moving_averages):
  """Scores one checkpoint on every record of eval_data, once each.

  Returns:
    (precision @ 1: float, mean cross-entropy: float, records scored: int,
     the checkpoint's global step: int).
  """
  with tf.Graph().as_default():
    dataset, num_records = cifar10_input.eval_dataset(eval_data, data_dir, batch_size)
    images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    logits = cifar10.inference(images)
    correct = tf.reduce_sum(tf.cast(tf.compat.v1.nn.in_top_k(logits, labels, 1), tf.int64))
    cross_entropy = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    if use_moving_averages:
      # Maps each shadow name (conv1/weights/ExponentialMovingAverage) to the variable.
      ema = tf.compat.v1.train.ExponentialMovingAverage(cifar10.MOVING_AVERAGE_DECAY)
      saver = tf.compat.v1.train.Saver(ema.variables_to_restore())
    else:
      saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
    step = int(tf.train.load_checkpoint(checkpoint_path).get_tensor('global_step'))

    true_count, total_loss, seen = 0, 0.0, 0
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, checkpoint_path)
      while True:
        try:
          batch_correct, batch_loss, batch_labels = sess.run([correct, cross_entropy, labels])
        except tf.errors.OutOfRangeError:
          break
        true_count += batch_correct
        total_loss += batch_loss
        seen += len(batch_labels)
  if seen != num_records:
    raise EvalError('scored %d records, expected %d' % (seen, num_records))
  return true_count / seen, total_loss / seen, seen, step


def main(argv):
  del argv
  if FLAGS.batch_size < 1:
    sys.exit('error: --batch_size must be at least 1, got %d' % FLAGS.batch_size)
  if os.path.realpath(FLAGS.eval_dir) == os.path.realpath(FLAGS.checkpoint_dir):
    sys.exit('error: --eval_dir is the trainer\'s --checkpoint_dir (%s); give this '
             'program a directory of its own so it never writes among the trainer\'s '
             'files.' % FLAGS.eval_dir)
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
  averages = 'moving averages' if FLAGS.use_moving_averages else 'raw weights'
  writer, last_path, waited = None, None, False
  try:
    cifar10_input.maybe_download_and_extract(FLAGS.data_dir, FLAGS.data_url, FLAGS.data_md5)
    while True:
      path = latest_checkpoint(FLAGS.checkpoint_dir)
      if path is None and FLAGS.run_once:
        sys.exit('error: no checkpoint in %s yet. Train first (multi_gpu_train.py '
                 '--train_dir=%s), or point --checkpoint_dir at the trainer\'s '
                 '--train_dir.' % (FLAGS.checkpoint_dir, FLAGS.checkpoint_dir))
      if path is None and not waited:
        print('No checkpoint in %s yet; checking every %d s.'
              % (FLAGS.checkpoint_dir, FLAGS.eval_interval_secs))
        waited = True
      if path is not None and path != last_path:
        try:
          precision, loss, count, step = evaluate(path, FLAGS.data_dir, FLAGS.eval_data,
                                                  FLAGS.batch_size, FLAGS.use_moving_averages)
        except (tf.errors.OpError, ValueError) as e:
          if FLAGS.run_once or not isinstance(e, tf.errors.NotFoundError):
            raise EvalError('cannot restore %s into the CIFAR-10 model: %s Point '
                            '--checkpoint_dir at the trainer\'s --train_dir.'
                            % (path, training_run.restore_error(e))) from None
          # The trainer's Saver removes old checkpoints; the next one will do.
          print('%s went away while being read; trying again.' % path)
          continue
        print('%s: precision @ 1 = %.3f (global step %d, %d %s records, %s, '
              'cross-entropy %.6g)' % (datetime.datetime.now(), precision, step, count,
                                       FLAGS.eval_data, averages, loss))
        sys.stdout.flush()
        writer = writer or tf.compat.v1.summary.FileWriter(FLAGS.eval_dir)
        writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag='Precision @ 1', simple_value=precision),
            tf.compat.v1.Summary.Value(tag='cross_entropy', simple_value=loss)]), step)
        writer.flush()
        last_path = path
      if FLAGS.run_once:
        break
      time.sleep(FLAGS.eval_interval_secs)
  except (EvalError, cifar10_input.DataError) as e:
    sys.exit('error: %s' % e)
  finally:
    if writer:
      writer.close()


if __name__ == '__main__':
  training_run.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
