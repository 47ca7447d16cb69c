"""training/run_record.py: the record each run writes, and what changed since the last
run's. A disk that refuses it stops the run in one line; an earlier file that is not a
record is said in one line, never a traceback or a wait.
"""
import os
import re
import sys

import pytest

import helpers
import multi_gpu_train
from training import run_record


def test_write_run_record_over_file_size_limit_one_line_nothing_left(tmp_path):
  script = ('import signal, sys\nfrom training import errors, run_record\n'
            'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
            'try:\n'
            '  run_record.write_run_record(sys.argv[1], {"start_step": 3, "x": "x" * 999})\n'
            'except errors.TrainingError as e:\n'
            '  sys.exit("error: %s" % e)\n')
  limit = 100  # TensorFlow's start-up writes less
  done = helpers.run([sys.executable, '-c', script, str(tmp_path)], file_size_limit=limit)
  assert done.code == 1 and 'Traceback' not in done.err, done.log()
  line = done.err.strip().splitlines()[-1]
  assert re.match(r'error: cannot write the run record %s/run-\d{8}-\d{6}-step3\.json: File '
                  r'too large\. Point --train_dir at a directory you can write to'
                  % re.escape(str(tmp_path)), line), line
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('text', ['[1, 2]', '{"constants": [1], "flags": "x"}',
                                  '{"constants": {"cifar10/model.py": 3}}'])
def test_earlier_run_record_json_but_not_a_record_shows_no_change_and_no_traceback(
    tmp_path, text):
  (tmp_path / 'run-20261125-000000-step0.json').write_text(text)
  record = {'constants': {'cifar10/model.py': {'BATCH': 1}}, 'flags': {'max_steps': 2}}
  assert run_record.changes_since(str(tmp_path), record) is None


@pytest.mark.parametrize('kind', helpers.HOSTILE_FILES + ['nested_200000_deep'])
def test_changes_since_hostile_run_record_not_compared_in_one_line_without_waiting(tmp_path,
                                                                                  kind):
  name = 'run-20261125-000000-step0.json'
  if kind == 'nested_200000_deep':
    (tmp_path / name).write_text('[' * 200000 + ']' * 200000)
  else:
    helpers.make_hostile(tmp_path / name, kind)
  record = {'constants': {'cifar10/model.py': {'BATCH': 1}}, 'flags': {'max_steps': 2}}
  said = helpers.returns_within(10, run_record.changes_since, str(tmp_path), record,
                                unblock=helpers.unblock_fifo(tmp_path / name))
  why = {'fifo': 'not a regular file but a FIFO', 'dev_zero': 'not a regular file but a '
         'character device', 'sparse_3gb': '%d bytes, more than the %d expected' % (
             3 << 30, run_record.RECORD_MAX_BYTES),
         'nested_200000_deep': 'nested more than 100 levels deep'}[kind]
  assert said == 'not compared with %s: %s. Remove it if it is not a run record.' % (
      tmp_path / name, why)


@pytest.mark.parametrize('old, new, said', [
    (float('nan'), float('nan'), None),
    ([1.0, float('nan')], [1.0, float('nan')], None),
    (float('nan'), 0.1, 'X nan -> 0.1 (m.py)'),
    ({'cifar10': {'batch_size': 128}}, {'cifar10': {'batch_size': 128}}, None),
    ({'cifar10': {'batch_size': 128}}, {'cifar10': {'batch_size': 64}},
     "X['cifar10']['batch_size'] 128 -> 64 (m.py)"),  # the leaf edited, not the whole dict
], ids=['nan_same', 'nan_in_list_same', 'nan_edited', 'dict_same', 'dict_edited'])
def test_changes_since_nan_equal_to_itself_and_dict_edits_reported(tmp_path, old, new, said):
  run_record.write_run_record(str(tmp_path), {'constants': {'m.py': {'X': old}}})
  changed = run_record.changes_since(str(tmp_path), {'constants': {'m.py': {'X': new}}})
  assert changed == (said and 'changed since %s: %s' % (os.listdir(tmp_path)[0], said))


def test_constants_of_holds_a_dict_constant():
  assert run_record.constants_of(multi_gpu_train)['DATASET_DEFAULTS'] == (
      multi_gpu_train.DATASET_DEFAULTS)
