"""The run record: what a run used (flags, constants, devices, data), as JSON in --train_dir."""
import collections
import datetime
import json
import math
import os
import re
import sys
import time

import tensorflow as tf

from training import machine, mixed_precision, storage
from training.directory import parse_json, read_bounded, write_whole
from training.errors import TrainingError, one_line

RECORD_NAME = re.compile(r'^run-\d{8}-\d{6}-step\d+\.json$')  # write_run_record's names
RECORD_MAX_BYTES = 1 << 20  # a record has a few KB; a larger file is not compared with
NOT_COMPARED = ('fresh',)   # flags that say what a run does, in lines of their own


def constants_of(module):
  """The module's UPPER_CASE constants of plain types: {name: value}; a dict too
  (DATASET_DEFAULTS), when JSON can hold it."""
  return {name: value for name, value in sorted(vars(module).items())
          if name.isupper() and (isinstance(value, (bool, int, float, str, list, tuple)) or
                                 isinstance(value, dict) and _is_json(value))}


def _is_json(value):
  try:
    json.dumps(value)
  except (TypeError, ValueError):
    return False
  return True


def write_run_record(train_dir, record):
  """Writes `record` (a dict) as train_dir/run-<date>-<time>-step<N>.json; returns the path."""
  path = os.path.join(train_dir, 'run-%s-step%d.json' % (time.strftime('%Y%m%d-%H%M%S'),
                                                         record.get('start_step', 0)))
  try:
    write_whole(path, json.dumps(record, indent=1) + '\n')
  except OSError as e:
    raise TrainingError('cannot write the run record %s: %s. Point --train_dir at a '
                        'directory you can write to, with free space and no file-size '
                        'limit (ulimit -f).' % (path, e.strerror or e)) from None
  return path


def describe(program_constants, flag_values, settings, devices, start_step, data,
             flags_given=()):
  """What this run used: flags, every constant of the program, model and reader.

  Constants are read when the run starts, so a constant edited between two runs
  shows in their records.

  Args:
    program_constants: {'multi_gpu_train.py': constants_of(its module)}, the caller's.
    flag_values: dict, the command line's flags; settings: a settings.Settings;
    devices: the towers' devices; data: the data_sets.DataSet.
    flags_given: names of the flags set on the command line: where one takes its
      default from a constant (--batch_size, BATCH_SIZE), the flag won.
  """
  constants = dict(program_constants)
  if settings.use_fp16:
    constants['training/mixed_precision.py'] = constants_of(mixed_precision)
  constants['%s/model.py' % data.model.__name__] = constants_of(data.model)
  constants['%s.py' % data.input.__name__] = constants_of(data.input)
  return collections.OrderedDict([
      ('command', ' '.join(sys.argv)),
      ('started', datetime.datetime.now().isoformat(timespec='seconds')),
      ('start_step', start_step),
      ('seed', settings.seed),
      ('flags', flag_values or {}),
      ('flags_given', sorted(flags_given)),
      ('constants', constants),
      ('tensorflow', tf.__version__),
      ('onednn', machine.record()),
      ('precision', '%s towers, float32 variables' % mixed_precision.compute_dtype(
          settings.use_fp16, settings.use_bf16).name),
      ('devices', devices),
      ('data', data_read(data.input, settings)),
  ])


def data_read(data_input, settings):
  """What the run reads, for its record: the directory and which copy, not only the
  official URL that the input module's constants name."""
  if settings.synthetic:
    return 'synthetic'
  source = collections.OrderedDict(data_dir=storage.abspath(settings.data_dir))
  if settings.data_md5:
    source['copy'] = 'your own archive, md5 %s (--data_md5)' % settings.data_md5
  else:
    source['url'] = settings.data_url or data_input.DATA_URL
  return source


def write_and_compare(train_dir, record, replaced=None):
  """Writes the run's record and says where; then, when an earlier run's record is
  there (or in `replaced`, where --fresh moved the run it replaces), what this run
  changed (an edited constant, another flag), in one line."""
  changed = changes_since(replaced or train_dir, record, named_whole=bool(replaced))
  print('Run record: %s' % write_run_record(train_dir, record))
  if changed:
    print(changed)


def changes_since(train_dir, record, named_whole=False):
  """'changed since run-<...>.json: NAME old -> new (file); --flag old -> new', naming
  what differs from the newest run record already in train_dir; None when nothing
  does, or there is no earlier record. A file of that name that is no record to read
  (not JSON, a FIFO, a device, too large, nested too deep) is not compared with, in a
  line that says why (directory.read_bounded).

  A constant whose flag was given on the command line (record['flags_given']) says
  so: 'BATCH_SIZE 128 -> 16 (multi_gpu_train.py), overridden by --batch_size=32'.
  named_whole: the record is named by its path (one --fresh moved), not its name.
  """
  previous = sorted(name for name in storage.listdir(train_dir) if RECORD_NAME.match(name))
  if not previous:
    return None
  path = os.path.join(train_dir, previous[-1])
  try:
    old = parse_json(read_bounded(path, RECORD_MAX_BYTES).decode('utf-8'))
  except (OSError, ValueError) as e:  # ValueError: not UTF-8, not JSON, nested too deep
    return 'not compared with %s: %s. Remove it if it is not a run record.' % (
        path, e.strerror if isinstance(e, OSError) else one_line(e))
  if not isinstance(old, dict):  # JSON, but not a run record
    return None
  new = json.loads(json.dumps(record))  # tuples as lists, as the file has them
  changes, edits = [], []
  old_constants = _as_dict(old.get('constants'))
  for source, constants in new.get('constants', {}).items():
    source_edits = _edited(_as_dict(old_constants.get(source)), constants)
    changes += ['%s %s -> %s (%s)%s' % (name, _shown(was), _shown(value), source,
                                        _overridden(name, new))
                for name, was, value in source_edits]
    edits += source_edits
  old_flags = _as_dict(old.get('flags'))
  for name, value in new.get('flags', {}).items():
    if name not in old_flags or name in NOT_COMPARED or not _differs(old_flags[name], value):
      continue
    if not (name not in new.get('flags_given', ()) and any(  # the default its constant gave
        _flag_of(constant, new) == name and not _differs(was, old_flags[name]) and
        not _differs(now, value) for constant, was, now in edits)):
      changes.append('--%s %s -> %s' % (name, _shown(old_flags[name]), _shown(value)))
  if not changes:
    return None
  return 'changed since %s: %s' % (path if named_whole else previous[-1], '; '.join(changes))


def _edited(old, new):
  """[(name, old value, new value)] of the constants edited between two runs, in the
  order of `new`; a dict's leaves one by one (DATASET_DEFAULTS['cifar10']['batch_size']),
  but not a leaf that only follows an edited constant: the dict is made of them."""
  edited = [(name, old.get(name, value), value) for name, value in new.items()
            if not isinstance(value, dict) and not isinstance(old.get(name), dict) and
            _differs(old.get(name, value), value)]
  named = [(was, value) for _, was, value in edited]
  for name, value in new.items():
    if isinstance(value, dict) or isinstance(old.get(name), dict):
      was_leaves, leaves = _leaves(old.get(name, value)), _leaves(value)
      for path in sorted(set(was_leaves) | set(leaves)):
        was, now = was_leaves.get(path, ABSENT), leaves.get(path, ABSENT)
        if _differs(was, now) and not any(not _differs(was, w) and not _differs(now, v)
                                          for w, v in named):
          edited.append((name + path, was, now))
  return edited


ABSENT = '(absent)'  # a dict's key that one of two runs does not have


def _leaves(value, path=''):
  """{path: value} of each leaf of a constant: {'': value} for a number or string,
  {"['cifar10']['batch_size']": 128, ...} for a dict."""
  if not isinstance(value, dict):
    return {path: value}
  leaves = {}
  for key, item in value.items():
    leaves.update(_leaves(item, '%s[%s]' % (path, _shown(key).replace('"', "'"))))
  return leaves


def _differs(was, value):
  """was != value, except that NaN equals NaN (nested in lists and dicts too): a NaN
  constant unchanged is not an edit."""
  if isinstance(was, float) and isinstance(value, float) and math.isnan(was):
    return not math.isnan(value)
  if isinstance(was, list) and isinstance(value, list):
    return len(was) != len(value) or any(map(_differs, was, value))
  if isinstance(was, dict) and isinstance(value, dict):
    return was.keys() != value.keys() or any(_differs(was[k], value[k]) for k in was)
  return was != value


def _overridden(constant, record):
  """', overridden by --batch_size=32' when the flag that takes its default from
  `constant` was given on the command line; else ''."""
  name = _flag_of(constant, record)
  if name is None or name not in record.get('flags_given', ()):
    return ''
  value = record['flags'][name]
  return ', overridden by --%s=%s' % (name, value if isinstance(value, str) else _shown(value))


def _flag_of(constant, record):
  """The flag of the record's run that takes its default from `constant` (BATCH_SIZE,
  or MNIST_BATCH_SIZE in an --dataset=mnist run: 'batch_size'); None if none does."""
  flag_values = _as_dict(record.get('flags'))
  name = constant.lower()
  prefix = '%s_' % flag_values.get('dataset')
  if name.startswith(prefix):
    name = name[len(prefix):]
  return name if name in flag_values else None


def _as_dict(value):
  """value if it is a dict, else an empty one: a hand-edited record changes nothing."""
  return value if isinstance(value, dict) else {}


def _shown(value):
  return json.dumps(value) if isinstance(value, str) or value is None else str(value)
