"""Checkpoints: the one to resume (read whole), saving with rotation, failed writes.

    path, step, notes = checkpoint_to_resume(train_dir)  # also clears leftovers
    set_aside(train_dir)                    # --fresh: the run files moved aside
    saver = make_saver(var_list)            # relative paths; never deletes anything
    save_checkpoint(sess, saver, train_dir, step, keep)  # writes, rotates; one-line errors

Nothing here builds a model or reads flags. Errors are errors.TrainingError.
"""
import os
import re

import tensorflow as tf

from training import storage
from training.directory import entries, move_aside, read_bounded, remove, write_whole
from training.errors import TrainingError, one_line, os_error


CHECKPOINT_PREFIX = 'model.ckpt'  # files model.ckpt-<step>.{index,data-*}, as the tutorial
STATE_FILE = 'checkpoint'         # TensorFlow's name for the file naming the latest
RUN_FILES = [STATE_FILE, CHECKPOINT_PREFIX + '-*', 'events.out.tfevents.*', 'run-*.json']
CHECKPOINT_INDEX = re.compile(r'model\.ckpt-(\d+)\.index$')  # one file per checkpoint
STATE_FILE_MAX_BYTES = 1 << 20  # 'checkpoint' names a few paths; larger is not one


def checkpoint_step(path):
  """model.ckpt-1230 -> 1230; None for a name of another form."""
  tail = path.rsplit('-', 1)[-1]
  return int(tail) if tail.isdigit() else None


def _checkpoints_on_disk(train_dir):
  """Prefixes of this directory's model.ckpt-<step> checkpoints, newest first."""
  steps = [int(found.group(1)) for found in map(CHECKPOINT_INDEX.match, entries(train_dir))
           if found]
  return [os.path.join(train_dir, '%s-%d' % (CHECKPOINT_PREFIX, step))
          for step in sorted(steps, reverse=True)]


def saved(train_dir, step):
  """True when train_dir holds a checkpoint of this global step."""
  return storage.exists(os.path.join(train_dir, '%s-%d.index' % (CHECKPOINT_PREFIX, step)))


def read_whole(path):
  """Reads every tensor of checkpoint `path`; returns its global step.

  Raises:
    ValueError: with the first line of what went wrong (a truncated file, ...).
  """
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)  # reads every byte: a truncated file fails here
    return int(reader.get_tensor('global_step'))
  except Exception as e:  # OpError, IndexError ('Read less bytes'), ...: all unreadable
    raise ValueError(one_line(e)) from e


def read_state_file(train_dir):
  """The checkpoint paths a 'checkpoint' state file names, latest first, as written.

  Returns:
    list of str (possibly absolute, possibly relative), or None without a state file.

  Raises:
    TrainingError: the file is empty, binary or not a checkpoint state.
  """
  from google.protobuf import text_format  # TensorFlow's own parser of this file
  from tensorflow.python.checkpoint import checkpoint_management
  state_file = os.path.join(train_dir, STATE_FILE)
  if not storage.exists(state_file):
    return None
  fix = ('Fix it (its first line names the latest checkpoint: model_checkpoint_path: '
         '"%s-<step>"), or remove it; to train from step 0 instead, pass the trainer '
         '--fresh.' % CHECKPOINT_PREFIX)
  try:
    text = read_bounded(state_file, STATE_FILE_MAX_BYTES).decode('utf-8')
    state = text_format.Parse(text, checkpoint_management.CheckpointState())
  except (OSError, UnicodeDecodeError, text_format.ParseError) as e:
    raise TrainingError('%s cannot be read as a checkpoint state file (%s). %s'
                        % (state_file, e.strerror if isinstance(e, OSError) else one_line(e),
                           fix)) from None
  if not state.model_checkpoint_path:
    raise TrainingError('%s names no checkpoint (it is empty or has no '
                        'model_checkpoint_path). %s' % (state_file, fix))
  paths = [state.model_checkpoint_path]
  paths += [p for p in reversed(state.all_model_checkpoint_paths) if p not in paths]
  return paths


def in_this_dir(train_dir, path, notes):
  """Where a path from the state file is, looking in train_dir first.

  A state file written with absolute paths (older versions of this trainer, or
  TensorFlow's default) names the directory it was written in; a relative path with
  a directory in it names another directory as well. After the
  directory was moved or copied, its own file of that name is the one meant. (On an
  object store, paths are compared as written: no links there.)
  """
  if not (os.path.isabs(path) or storage.scheme(path)):
    if not os.path.dirname(path):
      return os.path.join(train_dir, path)
    path = os.path.join(train_dir, path)
    if storage.is_local(path):
      path = os.path.normpath(path)  # '../run1/model.ckpt-5' (normpath would cut gs://)
  local = os.path.join(train_dir, os.path.basename(path))
  if storage.same_place(os.path.dirname(path), train_dir):
    return local
  if storage.exists(local + '.index'):
    notes.append('%s names %s; using %s in this directory.'
                 % (os.path.join(train_dir, STATE_FILE), path, local))
    return local
  notes.append('%s names %s, outside this directory, and this directory has no file of '
               'that name: reading that one.' % (os.path.join(train_dir, STATE_FILE), path))
  return path


def checkpoint_to_resume(train_dir):
  """The checkpoint a rerun continues from, after checking it can be read whole.

  With a state file, the checkpoint it names (found in train_dir first, even when
  named by an absolute path). Without one (a run killed between a checkpoint's
  files and its state file), the newest checkpoint on disk that reads whole.

  Call it holding the lock (lock_train_dir): first it removes what killed runs
  left of their checkpoint writes (remove_leftovers).

  Returns:
    (path, global step, notes to print), or (None, 0, notes) for a directory with
    no checkpoint. (save_checkpoint's rotation reads the state file itself.)

  Raises:
    TrainingError: the state file or the checkpoint it names cannot be read, or
      no checkpoint on disk reads whole.
  """
  notes = remove_leftovers(train_dir)
  named = read_state_file(train_dir) if storage.isdir(train_dir) else None
  if named is None:
    path, step, more_notes = _newest_whole_checkpoint(train_dir)
    return path, step, notes + more_notes
  paths = [in_this_dir(train_dir, p, notes) for p in named]
  path = paths[0]
  try:
    step = read_whole(path)
  except ValueError as e:
    raise TrainingError(
        'checkpoint %s (named in %s) cannot be read: %s. Point "checkpoint" at an '
        'older %s-<step> in that directory, or pass --fresh to start from step 0.'
        % (path, os.path.join(train_dir, STATE_FILE), e, CHECKPOINT_PREFIX)) from None
  return path, step, notes


def _own_checkpoints(train_dir, paths):
  """Of the paths a state file names (latest first, as found by in_this_dir), those
  rotation may delete: this directory's own model.ckpt-<step> that exist, oldest first.

  A path outside train_dir (../victim/model.ckpt-1, /elsewhere/model.ckpt-1) is
  never among them.
  """
  here = os.path.dirname(os.path.join(train_dir, 'x'))
  return [p for p in reversed(paths) if os.path.dirname(p) == here and
          CHECKPOINT_INDEX.match(os.path.basename(p) + '.index') and
          storage.exists(p + '.index')]


def _rotation(train_dir):
  """The checkpoints save_checkpoint rotates, oldest first: the state file's own,
  or without a state file, this directory's checkpoints by step."""
  named = read_state_file(train_dir)
  if named is None:
    return list(reversed(_checkpoints_on_disk(train_dir)))
  return _own_checkpoints(train_dir, [in_this_dir(train_dir, p, []) for p in named])


def _newest_whole_checkpoint(train_dir):
  found = _checkpoints_on_disk(train_dir) if storage.isdir(train_dir) else []
  if not found:
    return None, 0, []
  skipped = []
  for path in found:
    try:
      step = read_whole(path)
    except ValueError as e:
      skipped.append('%s (%s)' % (os.path.basename(path), e))
      continue
    note = ('%s has no "%s" state file (a run stopped before writing it); resuming '
            'from the newest checkpoint that reads whole, %s.'
            % (train_dir, STATE_FILE, os.path.basename(path)))
    if skipped:
      note += ' Skipped, unreadable: %s.' % '; '.join(skipped)
    return path, step, [note]
  raise TrainingError(
      '%s holds checkpoints but none reads whole: %s. Pass --fresh to set them aside '
      'and start from step 0.' % (train_dir, '; '.join(skipped)))


def rotated_away(path, went_away):
  """Whether the checkpoint at path, which failed to read, has gone since it was found:
  a running trainer rotated it away, and the newest will do (said here). False for one
  gone before (went_away: a state file that nobody updates names it) or still there."""
  if storage.exists(path + '.index') or path == went_away:
    return False
  print('%s went away while being read (a trainer rotates its checkpoints); trying the '
        'newest.' % path, flush=True)
  return True


def restore_error(e):
  """What a failed restore says, on one line: TensorFlow's own cause (the variable it
  names, a checksum that does not match, bytes missing), without the stack of where
  the graph was built that a session's error carries before it; for damaged files,
  what to do."""
  text = str(e)
  # A session's error: 'Graph execution error: Detected at node ... defined at (the
  # stack) ... Node: 'save/RestoreV2'\n<the cause>\n\t [[{{node save/RestoreV2}}]]'.
  cause = re.search(r"^Node: '[^']*'\n(.*?)(?:\n\s*\[\[|\Z)", text, re.M | re.S)
  text = ' '.join((cause.group(1) if cause else text).split())
  named = re.search(r'(Key \S+ not found in checkpoint|[^.]*shape[^.]*\.)', text)
  said = named.group(1).rstrip('.') + '.' if named else text[:300].rstrip('.') + '.'
  if damaged(e):
    said += (' Its files are damaged or cut short: name an older %s-<step> of its '
             'directory in the directory\'s "%s" file, or train again.'
             % (CHECKPOINT_PREFIX, STATE_FILE))
  return said


def damaged(e):
  """Whether a restore's error says the checkpoint's files are damaged or cut short
  (not another model's, or a directory of some other run's)."""
  return isinstance(e, (tf.errors.DataLossError, tf.errors.OutOfRangeError))


def step_of(path):
  """The global step checkpoint `path` holds, read without a session.

  Raises:
    tf.errors.OpError: as a restore would; a file cut short is OutOfRangeError here
      too (a CheckpointReader raises IndexError for it).
  """
  try:
    return int(tf.train.load_checkpoint(path).get_tensor('global_step'))
  except IndexError as e:
    raise tf.errors.OutOfRangeError(None, None, str(e)) from None


def make_saver(var_list=None):
  """A Saver that writes checkpoints and deletes nothing: save_checkpoint rotates.

  The Saver's own rotation (max_to_keep) deletes through a glob of the
  directory's path, and a --train_dir such as runs/g[12] would lose the files
  of runs/g1 and runs/g2; max_to_keep=None turns it off.
  """
  return tf.compat.v1.train.Saver(var_list, max_to_keep=None, save_relative_paths=True)


def save_checkpoint(sess, saver, train_dir, step, keep):
  """Writes train_dir/model.ckpt-<step>, names it in the state file, rotates; returns its path.

  The state file then names this directory's newest `keep` checkpoints, by
  names relative to it (a directory written this way can be moved or copied and
  resumed from); the older ones are deleted, after the state file is written.
  Only this directory's own files named model.ckpt-<step>.{index,data-*,meta} are
  ever deleted: a path the state file names elsewhere is left alone.

  A write that fails (disk full, file-size limit, read-only directory) removes
  the files it had created, no other, and leaves the previous checkpoint and state
  file as they were.

  Args:
    sess: the session holding the variables.
    saver: from make_saver().
    train_dir: str.
    step: int, the global step, in the checkpoint's name.
    keep: int >= 1, how many checkpoints to keep.

  Raises:
    TrainingError: naming the path, the OS error and what to do.
  """
  if keep < 1:
    raise ValueError('keep must be at least 1, got %r' % (keep,))
  path = os.path.join(train_dir, '%s-%d' % (CHECKPOINT_PREFIX, step))
  before = _rotation(train_dir)
  kept = [p for p in before if p != path] + [path]
  existing = set(entries(train_dir))  # a failed write removes only what it wrote
  try:
    saver.save(sess, os.path.join(train_dir, CHECKPOINT_PREFIX), global_step=step,
               write_state=False)
    _write_state_file(train_dir, kept[-keep:])
  except (tf.errors.OpError, OSError) as e:
    for name in set(entries(train_dir)) - existing:
      if name.startswith(CHECKPOINT_PREFIX + '-%d.' % step) or name.startswith(
          CHECKPOINT_PREFIX + '-%d_temp' % step) or name.startswith(STATE_FILE + '.tmp'):
        remove(os.path.join(train_dir, name))
    previous = [p for p in before if p != path]
    untouched = ('the previous checkpoint, step %d, and the state file are untouched'
                 % checkpoint_step(previous[-1]) if previous else
                 'no checkpoint was written before')
    raise TrainingError(
        'cannot write checkpoint %s: %s. Free space or raise the file-size limit '
        '(ulimit -f) for %s, or point --train_dir at a writable disk; %s.'
        % (path, os_error(e, path), train_dir, untouched)) from None
  for old in kept[:-keep]:
    _remove_checkpoint(train_dir, checkpoint_step(old))
  return path


def _write_state_file(train_dir, kept):
  """train_dir/checkpoint naming `kept` (oldest first) by their names, the last as latest."""
  from google.protobuf import text_format
  from tensorflow.python.checkpoint import checkpoint_management
  names = [os.path.basename(p) for p in kept]
  state = checkpoint_management.CheckpointState(model_checkpoint_path=names[-1],
                                                all_model_checkpoint_paths=names)
  write_whole(os.path.join(train_dir, STATE_FILE), text_format.MessageToString(state))


def _remove_checkpoint(train_dir, step):
  """Deletes this directory's model.ckpt-<step>.{index,data-*,meta}, the index first:
  a kill midway leaves data without an index, which remove_leftovers recognises."""
  prefix = '%s-%d.' % (CHECKPOINT_PREFIX, step)
  names = [name for name in entries(train_dir) if name.startswith(prefix) and
           (name[len(prefix):] in ('index', 'meta') or name[len(prefix):].startswith('data-'))]
  for name in sorted(names, key=lambda name: not name.endswith('.index')):
    remove(os.path.join(train_dir, name))


# What killed runs leave in train_dir, matched against the names of its entries.
LEFTOVERS = re.compile(r'(model\.ckpt-\d+(\..*(tempstate|\.tmp)|_temp)|checkpoint\.tmp|'
                       r'run-.*\.json\.tmp)')


WITHOUT_INDEX = re.compile(r'(model\.ckpt-\d+)\.(data-.*|meta)$')  # leftovers if no .index


def remove_leftovers(train_dir):
  """Removes what killed runs left of checkpoint writes in train_dir itself.

  That is: temporary files of a save (model.ckpt-<step>.data-*tempstate*,
  model.ckpt-<step>_temp*, checkpoint.tmp*, run-*.json.tmp*), and the data or
  graph of a checkpoint whose .index is missing (a run killed while deleting it).
  Nothing outside train_dir, and no other name. Call it holding the lock.

  Returns:
    notes to print: one line naming what was removed, or none.
  """
  names = set(entries(train_dir))
  removed = sorted(name for name in names if LEFTOVERS.match(name) or (
      WITHOUT_INDEX.match(name) and
      WITHOUT_INDEX.match(name).group(1) + '.index' not in names))
  for name in removed:
    remove(os.path.join(train_dir, name))
  if not removed:
    return []
  return ['Removed what interrupted runs left in %s: %s.' % (train_dir, ', '.join(removed))]


def untouched_note(last_saved):
  """What a run that stops on an error leaves: its last checkpoint (step or None)."""
  if last_saved is not None:
    return 'the last checkpoint, step %d, is untouched.' % last_saved
  return 'no checkpoint was written.'


def all_variables_finite():
  """One op, True when every trainable variable is finite; build it before the graph
  is finalised, and pass it to save_if_finite()."""
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                        for v in tf.compat.v1.trainable_variables()])


def save_if_finite(sess, saver, train_dir, step, keep, all_finite, model_name, last_saved):
  """Saves model.ckpt-<step> (save_checkpoint) and says so, unless a variable is NaN or
  infinite: then TrainingError, and the last checkpoint (last_saved: its step, or None)
  stays the newest. Both trainers save through here. Returns step."""
  if not sess.run(all_finite):
    raise TrainingError(
        'a variable became NaN or infinite by step %d: the model diverged. Lower '
        'INITIAL_LEARNING_RATE (%s/model.py); %s' % (step, model_name,
                                                     untouched_note(last_saved)))
  print('Saved checkpoint %s' % save_checkpoint(sess, saver, train_dir, step, keep),
        flush=True)
  return step


def set_aside(train_dir):
  """--fresh: moves checkpoints, event files and run records into
  <train_dir>-replaced-<time>/, beside train_dir: out of the reach of TensorBoard's
  --logdir=train_dir, where the old model's curves would show as a run of the new one.
  Returns that directory, or None when there was nothing to move."""
  try:
    dest, found = move_aside(train_dir, RUN_FILES)
  except OSError as e:
    raise TrainingError('--fresh cannot move the files of %s aside: %s. Move them '
                        'yourself, or point --train_dir at an empty directory.'
                        % (train_dir, e.strerror or e)) from None
  if dest is None:
    return None
  how = '' if storage.is_local(train_dir) else ' (on object storage: %s)' % storage.RENAME_NOTE
  print('--fresh: moved %d files from %s to %s%s: %s. TensorBoard no longer shows them under '
        '%s; to see the old run beside the new: tensorboard --logdir_spec=new:%s,old:%s. '
        'Delete that directory once you no longer need them.'
        % (len(found), train_dir, dest, how, ', '.join(found), train_dir, train_dir, dest))
  return dest

