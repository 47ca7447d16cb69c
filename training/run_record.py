"""The run record: what a run used (flags, constants, devices, data), as JSON in --train_dir."""
import collections
import datetime
import json
import os
import sys
import time

import tensorflow as tf

from training import mixed_precision
from training import onednn

from training.directory import write_whole
from training.errors import TrainingError


def constants_of(module):
  """The module's UPPER_CASE constants of plain types: {name: value}."""
  return {name: value for name, value in sorted(vars(module).items())
          if name.isupper() and isinstance(value, (bool, int, float, str, list, tuple))}


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


def describe(program_constants, flag_values, settings, devices, start_step, data):
  """What this run used: flags, every constant of the program, model and reader.

  Constants are read when the run starts, so a constant edited between two runs
  shows in their records.

  Args:
    program_constants: {'multi_gpu_train.py': constants_of(its module)}, the caller's.
    flag_values: dict, the command line's flags; settings: a settings.Settings;
    devices: the towers' devices; data: the settings.DataSet.
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
      ('constants', constants),
      ('tensorflow', tf.__version__),
      ('onednn', onednn.record()),
      ('devices', devices),
      ('data', data_read(data.input, settings)),
  ])


def data_read(data_input, settings):
  """What the run reads, for its record: the directory and which copy, not only the
  official URL that the input module's constants name."""
  if settings.synthetic:
    return 'synthetic'
  source = collections.OrderedDict(data_dir=os.path.abspath(settings.data_dir))
  if settings.data_md5:
    source['copy'] = 'your own archive, md5 %s (--data_md5)' % settings.data_md5
  else:
    source['url'] = settings.data_url or data_input.DATA_URL
  return source
