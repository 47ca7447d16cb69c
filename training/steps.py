"""What each step loop does beside sess.run, the same in both trainers.

    check_loss(loss, step, model_name, untouched)  # NaN: stop, naming step and fix
    check_skip(step, scale, new_scale)             # fp16: an overflowed step, said
    print_loss_line(step, loss, examples_per_sec, sec_per_batch)  # the tutorial's line
    crossed(previous, step, every)                 # "every N steps", when steps jump
    stopped(stop, step, start_step)                # after a signal: the line, the exit
    with stop_on_changed_data(check_files, save): loop(...)  # a data file cut mid-run
"""
import contextlib
import datetime
import sys

import numpy as np
import tensorflow as tf

from training import mixed_precision
from training.errors import DataError, Stopped, TrainingError


class _Never:
  requested = False

  @staticmethod
  def raising():
    return contextlib.nullcontext()  # nothing to raise: no signal is heard


NEVER = _Never()  # the stop signal of a run nobody can interrupt (tests)


def crossed(previous, step, every):
  """True when a multiple of `every` lies in (previous, step]: "every N steps" for a
  loop whose global step may move by more than one (async towers, other workers)."""
  return step // every != previous // every


def check_loss(loss_value, step, model_name, untouched, who=''):
  """Stops the run on a NaN or infinite loss, naming the step and what to try.

  untouched: a function returning what is left on disk, said last ('the last
  checkpoint, step 10, is untouched.'), called only then; who: ' on worker 1' in a
  distributed run.
  """
  if not np.isfinite(loss_value):
    raise TrainingError(
        'loss is %s at step %d%s: the model diverged. Lower INITIAL_LEARNING_RATE '
        '(%s/model.py) or --batch_size; %s' % (loss_value, step, who, model_name,
                                              untouched()))


def check_skip(step, scale, new_scale):
  """fp16: says that a step's gradients overflowed and were not applied; stops the run
  when they overflow even unscaled (scale 1), where no smaller scale can help."""
  print('%s: step %d skipped: gradients overflowed at loss scale %g; scale now %g' % (
      datetime.datetime.now(), step, scale, new_scale))
  sys.stdout.flush()
  if scale <= mixed_precision.MIN_LOSS_SCALE:
    raise TrainingError('the gradients overflow float16 even at loss scale %g at step %d: '
                        'the model diverged. Lower INITIAL_LEARNING_RATE, or train in '
                        'float32 (drop --use_fp16).' % (scale, step))


def print_loss_line(step, loss_value, examples_per_sec, sec_per_batch, tail=''):
  """The tutorial's line, its fields in its order; tail: dist_train.py's worker note."""
  print('%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)%s' % (
      datetime.datetime.now(), step, loss_value, examples_per_sec, sec_per_batch, tail))
  sys.stdout.flush()


def stopped(stop, step, start_step=None):
  """After the loop of a run stopped by a signal (stop.requested): says where, and
  raises Stopped with the signal's exit code. Nothing happens otherwise."""
  if not stop.requested:
    return
  print('Stopped by %s at step %d%s; rerun the same command to resume.' % (
      stop.name, step, ' before any step' if step == start_step else ''), flush=True)
  raise Stopped(stop.exit_code)


@contextlib.contextmanager
def stop_on_changed_data(check_files, save):
  """Around a step loop: a TensorFlow error from a data file changed under the running
  trainer (cut, relabelled, removed) stops the run in one line naming the file, once
  save() has saved the variables, which the failed step left as they were.

  TensorFlow's own error names the file only when it was cut, in a traceback of a
  hundred lines; a relabelled file fails inside the loss op instead. So after any
  TensorFlow error the files are checked again as at start-up; an error that is not
  theirs passes on unchanged.

  Args:
    check_files: callable raising DataError for a bad training file, or
      False (synthetic input, or records read once at start: nothing on disk to change).
    save: callable saving the variables; returns the words for what it saved.
  """
  try:
    yield
  except tf.errors.OpError:
    if not check_files:
      raise
    try:
      check_files()
    except DataError as bad:
      raise TrainingError('a data file changed during the run: %s %s' % (bad, save())) from None
    raise
