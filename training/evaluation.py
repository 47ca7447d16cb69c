"""Precision @ 1 of a trainer's checkpoints: what cifar10_eval.py and mnist_eval.py share.

Each program defines its flags with define_flags(its defaults) and calls
main(options, model, data_input, networks, trainer_command): it hands in its data set,
and every data set (data_sets.DATASETS) for naming the network a checkpoint that does
not fit holds; training/ imports no top-level module. The graph is built from code;
the moving-average (shadow) values of the checkpoint are restored into it;
every record of the chosen split is scored exactly once. The checkpoint
directory is only read: never written, locked or deleted.
"""
import collections
import datetime
import fnmatch
import os
import shlex
import signal
import sys
import time

from absl import flags
import tensorflow as tf

from training import input_data, machine
from training import checkpoints, directory, errors, settings, signals, storage, summaries

MAX_EVAL_INTERVAL_SECS = 7 * 24 * 3600  # a week: longer is a typo (past 292 years,
                                        # Python's sleep overflows)


def define_flags(checkpoint_dir, eval_dir, data_dir, data_url, batch_size,
                 eval_interval_secs, num_test, num_train, archive_md5=True):
  """The evaluation programs' flags, with one program's defaults.

  The calling program shows them in its --helpshort with
  flags.adopt_module_key_flags(evaluation): absl lists only the main module's.

  Args:
    archive_md5: bool, whether the data set comes as one archive whose md5 a user's
      copy can name (--data_md5; CIFAR-10), or not (MNIST: no such flag).
  """
  flags.DEFINE_string('eval_dir', eval_dir, 'Where to write event files.')
  flags.DEFINE_enum('eval_data', 'test', ['test', 'train_eval'],
                    'test: the %s test images; train_eval: the %s training images.'
                    % (num_test, num_train))
  flags.DEFINE_string('checkpoint_dir', checkpoint_dir,
                      'Where the trainer writes checkpoints (its --train_dir).')
  flags.DEFINE_string('data_dir', data_dir, 'The data set\'s files.')
  flags.DEFINE_string('data_url', data_url, 'Where to download the data.')
  settings.define_download_flags()
  for name in ('download_timeout_secs', 'download_stall_secs'):
    flags.declare_key_flag(name)  # this module's key flags, which the program's --helpshort lists
  if archive_md5:
    flags.DEFINE_string('data_md5', None, 'md5 of the archive at --data_url, for a copy '
                        'of your own (default: the official archive\'s).')
  flags.DEFINE_integer('eval_interval_secs', eval_interval_secs,
                       'Seconds between evaluations.')
  flags.DEFINE_boolean('run_once', False, 'Evaluate the latest checkpoint once and exit.')
  flags.DEFINE_integer('batch_size', batch_size, 'Images per batch.')
  machine.define_flag(__name__)
  flags.DEFINE_boolean('use_moving_averages', True, 'Restore the moving averages of the '
                       'weights (as the tutorial and the book); false: the raw values.')


def latest_checkpoint(checkpoint_dir):
  """Path of the newest checkpoint, None when there is none yet.

  A state file naming absolute paths of another directory (this one was moved
  or copied) is read as the trainer reads it: the file of that name here first.

  Raises:
    errors.EvalError: a 'checkpoint' state file exists but cannot be parsed (TensorFlow
      would silently report no checkpoint and this program would wait forever).
  """
  try:
    named = checkpoints.read_state_file(checkpoint_dir)
  except errors.TrainingError as e:
    raise errors.EvalError(str(e)) from None
  if named is None:
    return None
  notes = []
  path = checkpoints.in_this_dir(checkpoint_dir, named[0], notes)
  for note in notes:
    print(note)
  return path


def evaluate(checkpoint_path, data_dir, eval_data, batch_size, use_moving_averages,
             model, data_input):
  """Scores one checkpoint on every record of eval_data, once each.

  Args:
    model, data_input: the data set's model package and input module.

  Returns:
    (precision @ 1: float, mean cross-entropy: float, records scored: int,
     the checkpoint's global step: int).
  """
  with tf.Graph().as_default():
    images, labels, num_records = input_data.eval_batches(data_input, eval_data, data_dir,
                                                         batch_size)
    logits = model.inference(images)
    correct = tf.reduce_sum(tf.cast(tf.compat.v1.nn.in_top_k(logits, labels, 1), tf.int64))
    cross_entropy = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    if use_moving_averages:
      # Maps each shadow name (conv1/weights/ExponentialMovingAverage) to the variable.
      ema = tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY)
      saver = tf.compat.v1.train.Saver(ema.variables_to_restore())
    else:
      saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
    step = checkpoints.step_of(checkpoint_path)

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
    raise errors.EvalError('scored %d records, expected %d' % (seen, num_records))
  return true_count / seen, total_loss / seen, seen, step


# What main() reads of the flags, for a program that has its own (dist_train.py's evaluator).
Options = collections.namedtuple('Options', [
    'checkpoint_dir', 'eval_dir', 'data_dir', 'data_url', 'data_md5', 'eval_interval_secs',
    'batch_size', 'eval_data', 'run_once', 'use_moving_averages', 'download_timeout_secs',
    'download_stall_secs'],
    defaults=('test', False, True, input_data.DOWNLOAD_TIMEOUT_SECS,
              input_data.DOWNLOAD_STALL_SECS))


def main(options, model, data_input, networks, trainer_command, last_step=None):
  """Evaluates once (--run_once) or whenever a new checkpoint appears.

  Args:
    options: the parsed flags of define_flags(), or an object with the same names.
    model, data_input: the data set's model package and input module.
    networks: {name: data_sets.DataSet} of every data set (data_sets.DATASETS): a
      checkpoint that does not restore is told which of their networks it holds.
    trainer_command: how to train for this directory, for the no-checkpoint message.
    last_step: int or None: return once a checkpoint at this global step or later
      has been scored (dist_train.py's evaluator: the training's --max_steps).
  """
  check_flags(options)
  # SIGTERM too raises, as Ctrl-C does: one line and its exit code, 143, where its
  # default killed the program without a word; and neither is raised inside
  # TensorFlow, where Python's own Ctrl-C could end in a traceback (raise_in_our_code).
  signals.raise_on_signals()
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
  print(machine.start_line())
  # A file-size limit then fails the event write, which SummaryWriter reports once and
  # the scoring goes on, instead of killing the program without a word (as the trainers).
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  writer = None
  try:
    data_input.prepare(options.data_dir, options.data_url, getattr(options, 'data_md5', None),
                       settings.deadlines(options))
    writer = _evaluate_new_checkpoints(options, model, data_input, networks, trainer_command,
                                       last_step)
  except KeyboardInterrupt as e:  # it only reads the checkpoints: nothing to save
    # Ctrl-C or SIGTERM, as signals.Interrupted
    print('Stopped by %s.' % getattr(e, 'name', 'Ctrl-C'), file=sys.stderr, flush=True)
    sys.exit(getattr(e, 'exit_code', 130))
  finally:
    if writer:
      writer.close()


def check_flags(options):
  """errors.EvalError, naming the flag, for a value the program cannot run with.

  main() calls it first, before anything is read, written or waited for: a bad
  --eval_dir would otherwise fail only after the first score was printed.

  Args:
    options: the parsed flags of define_flags(), or an Options.
  """
  if options.batch_size < 1:
    raise errors.EvalError('--batch_size must be at least 1, got %d; give the images per '
                           'batch (the last batch holds the rest)' % options.batch_size)
  if not 1 <= options.eval_interval_secs <= MAX_EVAL_INTERVAL_SECS:
    raise errors.EvalError(
        '--eval_interval_secs must be 1..%d (1 s to a week), got %d; give the seconds '
        'between looks for a new checkpoint' % (MAX_EVAL_INTERVAL_SECS,
                                                options.eval_interval_secs))
  for name, value in zip(('download_timeout_secs', 'download_stall_secs'),
                         settings.deadlines(options)):
    if value < 1:
      raise errors.EvalError('--%s must be at least 1, got %d' % (name, value))
  try:
    for flag in ('--checkpoint_dir', '--eval_dir', '--data_dir'):
      storage.check(getattr(options, flag[2:]), flag)
  except errors.TrainingError as e:
    raise errors.EvalError(str(e)) from None
  if (storage.exists(options.checkpoint_dir) and
      not storage.isdir(options.checkpoint_dir)):
    raise errors.EvalError('--checkpoint_dir=%s is a file, not a directory; point it at '
                           'the trainer\'s --train_dir' % options.checkpoint_dir)
  if storage.same_place(options.eval_dir, options.checkpoint_dir):
    raise errors.EvalError('--eval_dir is the trainer\'s --checkpoint_dir (%s); give this '
                           'program a directory of its own so it never writes among the '
                           'trainer\'s files.' % options.eval_dir)
  why = _why_not_writable(options.eval_dir)
  if why:
    raise errors.EvalError('--eval_dir=%s %s; give a directory this user can write to (it '
                           'is created if missing)' % (options.eval_dir, why))


def _why_not_writable(directory):
  """Why this user can neither write to directory nor create it; None if it can (on an
  object store, only a write tells: its error is said then)."""
  if not storage.is_local(directory):
    return None
  path = os.path.abspath(directory)
  existing = path
  while not os.path.lexists(existing):  # the nearest part of the path that exists
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return ('is not a directory' if existing == path else
            'cannot be created: %s is not a directory' % existing)
  if not os.access(existing, os.W_OK | os.X_OK):
    return ('is not writable by this user' if existing == path else
            'cannot be created: %s is not writable by this user' % existing)
  return None


def _data_flags(options):
  """' --data_dir=... --data_md5=...': the data flags of this command line (of Options:
  those set), for the no-checkpoint hint's training command, which then reads the same
  data, offline too."""
  given = []
  for name in ('data_dir', 'data_url', 'data_md5'):
    value = getattr(options, name, None)
    if isinstance(options, flags.FlagValues) and not (
        name in options and options[name].present):
      continue
    if value:
      given.append(' --%s=%s' % (name, shlex.quote(value)))
  return ''.join(given)


def _writer_for(eval_dir, step, writer, latest):
  """The event writer for a point at `step` (summaries.SummaryWriter: a failed write is
  a warning, once), and the latest step of eval_dir's points after it.

  A step below the latest already there is a new model's (the trainer's --fresh began
  again at 0): the old model's event files are moved beside eval_dir first, out of the
  reach of TensorBoard's --logdir=eval_dir, and where they went is said.
  """
  if writer is None:
    latest = _latest_step(eval_dir)
  if latest is not None and step < latest:
    if writer is not None:
      writer.close()
    try:
      dest, found = directory.move_aside(eval_dir, [summaries.EVENT_FILES])
    except OSError as e:
      raise errors.EvalError('cannot move the old model\'s points in --eval_dir=%s aside: '
                             '%s. Move its event files yourself, or give another --eval_dir.'
                             % (eval_dir, e.strerror or e)) from None
    print('%s held points up to global step %d, of a model since replaced: moved its %d '
          'event files to %s. To see them beside the new: tensorboard '
          '--logdir_spec=new:%s,old:%s' % (eval_dir, latest, len(found), dest, eval_dir, dest))
    writer = latest = None
  if writer is None:
    try:
      storage.makedirs(eval_dir)  # checked writable at start-up, where it can be
    except OSError as e:
      raise errors.EvalError('cannot create --eval_dir=%s: %s' % (eval_dir, e.strerror or e))
    writer = summaries.SummaryWriter(eval_dir)
  return writer, max(step, latest or step)


def _latest_step(eval_dir):
  """The highest global step of the points in eval_dir's event files; None for none.
  A file cut short counts for the points it holds whole."""
  latest = None
  for name in sorted(directory.entries(eval_dir)):
    if fnmatch.fnmatchcase(name, summaries.EVENT_FILES):
      try:
        for event in tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, name)):
          if event.HasField('summary'):
            latest = max(event.step, latest or event.step)
      except (tf.errors.OpError, OSError):
        pass
  return latest


def _elsewhere(e, path, model, networks):
  """What to do with a checkpoint that would not restore into the model: nothing more
  for a damaged one; the program for the network it holds, if one of networks; else
  the trainer's dir."""
  if checkpoints.damaged(e):
    return ''
  try:
    held = network_held(tf.train.load_checkpoint(path).get_variable_to_shape_map(),
                        networks, other_than=model)
  except (tf.errors.OpError, ValueError):  # gone or unreadable since: said as it was
    held = None
  if held:
    return ' It holds the %s network: evaluate it with %s_eval.py.' % (held, held)
  return ' Point --checkpoint_dir at the trainer\'s --train_dir.'


def network_held(found, networks, other_than=None):
  """The name of the data set ('cifar10', 'mnist') whose network a checkpoint holds,
  every moving average by name and shape; None when it holds none of networks.

  Args:
    found: {name: shape} of the checkpoint (its get_variable_to_shape_map()).
    networks: {name: a data set}, each with .model (the model package) and .input
      (the input module): data_sets.DATASETS, or export_model.DATASETS.
    other_than: the model package that did not fit, not tried again.
  """
  for name, data in sorted(networks.items()):
    if data.model is not other_than and not mismatch(
        network_variables(data.model, data.input), found):
      return name
  return None


def network_variables(model, data_input):
  """{checkpoint name: variable} of the model's moving averages, as the evaluation
  restores them, in a throwaway graph."""
  with tf.Graph().as_default():
    images, _ = tf.compat.v1.data.make_one_shot_iterator(
        data_input.synthetic_dataset(1)).get_next()
    model.inference(images)
    return tf.compat.v1.train.ExponentialMovingAverage(
        model.MOVING_AVERAGE_DECAY).variables_to_restore()


def mismatch(to_restore, found):
  """The first moving average the checkpoint lacks or holds in another shape, in words;
  None when it holds them all. to_restore: {name: variable}; found: {name: shape} of
  the checkpoint."""
  for name, var in sorted(to_restore.items()):
    if name not in found:
      return 'it has no %s' % name
    if found[name] != var.shape.as_list():
      return '%s is %s there, %s in the network' % (name, found[name], var.shape.as_list())
  return None


def _evaluate_new_checkpoints(options, model, data_input, networks, trainer_command,
                              last_step=None):
  """The loop: each new checkpoint scored once; returns the event writer, if any."""
  averages = 'moving averages' if options.use_moving_averages else 'raw weights'
  writer, last_path, waited, went_away, latest = None, None, False, None, None
  while True:
    path = latest_checkpoint(options.checkpoint_dir)
    if path is None and options.run_once:
      raise errors.EvalError('no checkpoint in %s yet. Train first (%s --train_dir=%s%s), or point '
                      '--checkpoint_dir at the trainer\'s --train_dir.'
                      % (options.checkpoint_dir, trainer_command, options.checkpoint_dir,
                         _data_flags(options)))
    if path is None and not waited:
      print('No checkpoint in %s yet; checking every %d s.'
            % (options.checkpoint_dir, options.eval_interval_secs))
      waited = True
    if path is not None and path != last_path:
      try:
        precision, loss, count, step = evaluate(
            path, options.data_dir, options.eval_data, options.batch_size,
            options.use_moving_averages, model, data_input)
      except (tf.errors.OpError, ValueError) as e:
        # The trainer deletes old checkpoints as new ones land, after naming the new
        # one in the state file: the newest will do.
        if not checkpoints.rotated_away(path, went_away):
          raise errors.EvalError('cannot restore %s into the %s model: %s%s' % (
              path, model.__name__, checkpoints.restore_error(e),
              _elsewhere(e, path, model, networks))) from None
        went_away = path
        continue
      print('%s: precision @ 1 = %.3f (global step %d, %d %s records, %s, '
            'cross-entropy %.6g)' % (datetime.datetime.now(), precision, step, count,
                                     options.eval_data, averages, loss))
      sys.stdout.flush()
      writer, latest = _writer_for(options.eval_dir, step, writer, latest)
      writer.add_summary(tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag='Precision @ 1', simple_value=precision),
          # The trainer's tag: TensorBoard draws the test set's beside the training one.
          tf.compat.v1.Summary.Value(tag='1_loss/cross_entropy', simple_value=loss)]), step)
      last_path = path
      if last_step is not None and step >= last_step:
        return writer
    if options.run_once:
      return writer
    time.sleep(options.eval_interval_secs)
