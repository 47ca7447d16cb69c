"""multi_gpu_train.py run again in a train dir: what changed since the last run (an edited
constant, a flag, --fresh), said once on the line `changed since run-...json: ...`.
"""
import os
import re

import cifar10
import helpers
import multi_gpu_train


def test_rerun_with_an_edited_constant_and_flag_says_what_changed_once(tmp_path, capsys,
                                                                       monkeypatch):
  def run(max_steps, batch_size):
    multi_gpu_train.train(helpers.trainer_settings(str(tmp_path), '', synthetic=True,
                                                   batch_size=batch_size,
                                                   max_steps=max_steps, summary_steps=0),
                          flag_values={'batch_size': batch_size, 'max_steps': max_steps})
    return [line for line in capsys.readouterr().out.splitlines()
            if line.startswith('changed since')]

  assert run(1, 8) == []  # the first run: nothing to compare with
  monkeypatch.setattr(cifar10, 'INITIAL_LEARNING_RATE', 0.05)
  [changed] = run(2, 16)
  assert re.fullmatch(r'changed since run-\d{8}-\d{6}-step0\.json: INITIAL_LEARNING_RATE '
                      r'0\.1 -> 0\.05 \(cifar10/model\.py\); --batch_size 8 -> 16; '
                      r'--max_steps 1 -> 2', changed), changed
  assert run(3, 16) == ['changed since run-%s: --max_steps 2 -> 3' % sorted(
      n for n in os.listdir(tmp_path) if n.startswith('run-'))[-2][4:]]


def test_rerun_batch_size_edited_then_fresh_says_each_change_once_old_events_out_of_reach(
    tmp_path, capsys, monkeypatch):
  train_dir = tmp_path / 'train'

  def run(batch_size, max_steps, fresh=False):
    # As an edit of BATCH_SIZE at the top of the file makes it: DATASET_DEFAULTS follows.
    monkeypatch.setattr(multi_gpu_train, 'BATCH_SIZE', batch_size)
    monkeypatch.setitem(multi_gpu_train.DATASET_DEFAULTS, 'cifar10', dict(
        multi_gpu_train.DATASET_DEFAULTS['cifar10'], batch_size=batch_size))
    multi_gpu_train.train(helpers.trainer_settings(
        str(train_dir), '', synthetic=True, batch_size=batch_size, max_steps=max_steps,
        summary_steps=1, fresh=fresh), flag_values={'batch_size': batch_size,
                                                    'max_steps': max_steps, 'fresh': fresh})
    return capsys.readouterr().out.splitlines()

  run(16, 1)
  [changed] = [line for line in run(8, 2) if line.startswith('changed since')]
  assert re.fullmatch(r'changed since run-\d{8}-\d{6}-step0\.json: BATCH_SIZE 16 -> 8 '
                      r'\(multi_gpu_train\.py\); --max_steps 1 -> 2', changed), changed
  lines = run(4, 1, fresh=True)
  [moved] = [line for line in lines if line.startswith('--fresh: moved')]
  replaced = re.search(r' to (\S+-replaced-\d{8}-\d{6}): ', moved).group(1)
  assert os.path.dirname(replaced) == str(tmp_path), moved  # beside train_dir, not in it
  assert ('TensorBoard no longer shows them under %s; to see the old run beside the new: '
          'tensorboard --logdir_spec=new:%s,old:%s.' % (train_dir, train_dir, replaced)) in moved
  [changed] = [line for line in lines if line.startswith('changed since')]
  assert re.fullmatch(r'changed since %s/run-\d{8}-\d{6}-step1\.json: BATCH_SIZE 8 -> 4 '
                      r'\(multi_gpu_train\.py\); --max_steps 2 -> 1' % re.escape(replaced),
                      changed), changed
  assert [os.path.relpath(d, train_dir) for d, _, files in os.walk(train_dir)
          if any('tfevents' in f for f in files)] == ['.']  # TensorBoard's one run: the new
  assert len(helpers.event_files(str(train_dir))) == 1
  assert not [line for line in run(4, 1) if line.startswith('changed since')]  # nor --fresh


def test_rerun_constant_edited_and_its_flag_given_says_the_flag_overrides_it(tmp_path, capsys,
                                                                            monkeypatch):
  def run(batch_size, given):
    run.max_steps += 1
    multi_gpu_train.train(helpers.synthetic_settings(tmp_path, batch_size=batch_size,
                                                     max_steps=run.max_steps),
                          flag_values={'batch_size': batch_size}, flags_given=given)
    return [line for line in capsys.readouterr().out.splitlines()
            if line.startswith('changed since')]
  run.max_steps = 0

  assert run(32, ['batch_size']) == []
  monkeypatch.setattr(multi_gpu_train, 'BATCH_SIZE', 16)
  [changed] = run(32, ['batch_size'])
  assert changed.endswith(': BATCH_SIZE 128 -> 16 (multi_gpu_train.py), overridden by '
                          '--batch_size=32'), changed
  monkeypatch.setattr(multi_gpu_train, 'BATCH_SIZE', 8)  # the flag not given: no such note
  [changed] = run(8, [])
  assert changed.endswith(': BATCH_SIZE 16 -> 8 (multi_gpu_train.py); --batch_size 32 -> 8'), (
      changed)


def test_rerun_at_max_steps_with_an_edited_constant_says_nothing_to_do_and_what_changed(
    tmp_path, capsys, monkeypatch):
  multi_gpu_train.train(helpers.synthetic_settings(tmp_path, max_steps=1),
                        flag_values={'max_steps': 1})
  capsys.readouterr()
  monkeypatch.setattr(cifar10, 'INITIAL_LEARNING_RATE', 0.05)
  multi_gpu_train.train(helpers.synthetic_settings(tmp_path, max_steps=1),
                        flag_values={'max_steps': 1})
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and 'nothing to do' in lines[0], lines
  assert re.fullmatch(r'changed since run-\d{8}-\d{6}-step0\.json: INITIAL_LEARNING_RATE '
                      r'0\.1 -> 0\.05 \(cifar10/model\.py\)', lines[1]), lines
