"""oneDNN on or off: which setting wins, what start-up prints and records, and --seed with it on
(tests/test_seed.py compares tower splits with it on and off).

The setting is read by TensorFlow once, at import, so every run with oneDNN on is a
subprocess: this test process has TensorFlow imported with whatever it was given.
"""
import json
import os

import numpy as np
import pytest

import helpers
from training import machine
AVX2_ONLY = {'fpu', 'sse4_2', 'avx', 'avx2', 'fma'}  # this project's AMD EPYC
TF_ONEDNN_LINE = 'oneDNN custom operations are on'   # TensorFlow's own INFO, at import


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
  """Each test decides anew: choose() keeps its first answer for the process."""
  monkeypatch.setattr(machine, '_chosen', None)


def test_decide_user_env_wins_over_flag_and_says_so():
  choice = machine.decide('on', {machine.ENV: '0'}, 'x86_64', AVX2_ONLY)
  assert choice == machine.Choice(False, 'environment', 'TF_ENABLE_ONEDNN_OPTS=0 set in the '
                                 'environment, which wins over --onednn=on')
  assert machine.decide('auto', {machine.ENV: '1'}, 'aarch64', set()).on is True


def test_decide_flag_without_env_is_the_flag():
  assert machine.decide('off', {}, 'x86_64', AVX2_ONLY) == machine.Choice(False, 'flag',
                                                                         '--onednn=off')
  assert machine.decide('on', {}, 'x86_64', set()).on is True


def test_decide_auto_avx2_without_vnni_is_on_as_measured():
  choice = machine.decide('auto', {}, 'x86_64', AVX2_ONLY)
  assert choice.on is True and choice.how == 'auto'
  assert choice.why == ('auto, measured %.1fx faster for the CIFAR-10 model on CPUs with AVX2 and '
                        'without AVX512_VNNI (python -m benchmarks)' % machine.MEASURED_SPEEDUP)


def test_decide_auto_vnni_or_amx_is_tensorflows_own_on():
  choice = machine.decide('auto', {}, 'x86_64', AVX2_ONLY | {'avx512_vnni', 'amx_tile'})
  assert choice == machine.Choice(True, 'auto', 'auto, TensorFlow\'s default on CPUs with '
                                 'AMX_TILE/AVX512_VNNI')


def test_decide_auto_without_avx2_or_not_x86_leaves_tensorflows_default():
  assert machine.decide('auto', {}, 'x86_64', {'sse4_2', 'avx'}).on is False
  choice = machine.decide('auto', {}, 'aarch64', {'asimd'})
  assert choice.on is None and 'TensorFlow\'s default on aarch64' in choice.why


def test_choose_with_seed_takes_the_same_choice_as_without():
  seeded = machine.choose(['prog', '--seed', '7'], {}, tensorflow_imported=False)
  assert seeded == machine.decide('auto', {}, machine.platform.machine(), machine.cpu_flags())


def test_decide_value_set_by_the_parent_program_is_not_the_users():
  # A --local_cluster task inherits what its launcher chose: it decides again, alike.
  parent = {machine.ENV: '1', machine.SET_HERE_ENV: '1'}
  assert machine.decide('off', parent, 'x86_64', AVX2_ONLY) == machine.Choice(
      False, 'flag', '--onednn=off')


def test_flag_value_both_forms_last_wins_bad_value_left_to_absl():
  assert machine.flag_value(['prog', '--onednn=off']) == 'off'
  assert machine.flag_value(['prog', '--onednn', 'on', '--num_gpus=2']) == 'on'
  assert machine.flag_value(['prog', '--onednn=on', '--onednn=off']) == 'off'
  assert machine.flag_value(['prog', '--onednn=maybe']) == 'auto'  # absl refuses it, by name
  assert machine.flag_value(['prog', '--', '--onednn=off']) == 'auto'
  assert machine.flag_value(['prog']) == 'auto'


def test_choose_before_import_sets_env_and_marks_it_ours():
  environ = {}
  choice = machine.choose(['prog', '--onednn=off'], environ, tensorflow_imported=False)
  assert environ == {machine.ENV: '0', machine.SET_HERE_ENV: '0'}
  assert machine.choose(['prog', '--onednn=on'], environ) is choice  # the first call decides


def test_choose_user_env_is_left_alone():
  environ = {machine.ENV: '1'}
  assert machine.choose(['prog', '--onednn=off'], environ, tensorflow_imported=False).on
  assert environ == {machine.ENV: '1'}


def test_choose_after_tensorflow_import_sets_nothing_and_says_so():
  environ = {machine.ENV: '0'}
  choice = machine.choose(['prog', '--onednn=on'], environ, tensorflow_imported=True)
  assert environ == {machine.ENV: '0'}
  assert choice == machine.Choice(False, 'imported',
                                 'TF_ENABLE_ONEDNN_OPTS=0 when TensorFlow was imported')


def test_start_line_and_record_name_setting_and_reason():
  choice = machine.Choice(True, 'flag', '--onednn=on')
  assert machine.start_line(choice) == 'oneDNN on: --onednn=on'
  assert machine.record(choice) == dict(on=True, how='flag', why='--onednn=on')
  assert machine.start_line(machine.Choice(None, 'auto', 'x')) == 'oneDNN as TensorFlow decides: x'


# ---- The programs, in subprocesses: TensorFlow reads the setting at import ----------

def _run(program, *args, env=None):
  """program, as a user runs it, with TF_ENABLE_ONEDNN_OPTS only as env gives it, and
  TF_CPP_MIN_LOG_LEVEL=0: TensorFlow's INFO notice then says what it read."""
  done = helpers.run([program] + list(args), env=helpers.user_env(**dict(
      {machine.ENV: None, machine.SET_HERE_ENV: None, 'TF_CPP_MIN_LOG_LEVEL': '0'},
      **(env or {}))), fresh=True)
  assert done.code == 0, done.log()
  return done


def _record(train_dir):
  (path,) = [p for p in os.listdir(train_dir) if p.startswith('run-')]
  with open(os.path.join(train_dir, path)) as f:
    return json.load(f)


@pytest.mark.slow
def test_trainer_startup_flag_env_and_default_reach_tensorflow_and_the_record(tmp_path):
  tiny = ['--synthetic', '--batch_size=4', '--max_steps=1', '--summary_steps=0']
  off = _run('multi_gpu_train.py', '--onednn=off', '--train_dir=%s' % (tmp_path / 'off'),
             *tiny)
  assert 'oneDNN off: --onednn=off\n' in off.out, off.log()
  assert TF_ONEDNN_LINE not in off.err  # TensorFlow read it at import
  assert _record(tmp_path / 'off')['onednn'] == dict(on=False, how='flag', why='--onednn=off')

  env = _run('multi_gpu_train.py', '--onednn=off', '--train_dir=%s' % (tmp_path / 'env'),
             *tiny, env={machine.ENV: '1'})
  assert ('oneDNN on: TF_ENABLE_ONEDNN_OPTS=1 set in the environment, which wins over '
          '--onednn=off\n') in env.out
  assert TF_ONEDNN_LINE in env.err, env.log()
  assert _record(tmp_path / 'env')['onednn']['how'] == 'environment'

  default = _run('multi_gpu_train.py', '--train_dir=%s' % (tmp_path / 'auto'), *tiny)
  expected = machine.decide('auto', {}, machine.platform.machine(), machine.cpu_flags())
  assert machine.start_line(expected) + '\n' in default.out, default.log()
  assert (TF_ONEDNN_LINE in default.err) == bool(expected.on)
  assert _record(tmp_path / 'auto')['onednn'] == machine.record(expected)

  seeded = _run('multi_gpu_train.py', '--seed=3', '--train_dir=%s' % (tmp_path / 'seed'),
                *tiny)
  assert machine.start_line(expected) + '\n' in seeded.out, seeded.log()  # --seed chooses alike
  assert (TF_ONEDNN_LINE in seeded.err) == bool(expected.on)


@pytest.mark.slow
@pytest.mark.kernels
def test_suite_process_runs_the_kernels_its_programs_run(tmp_path):
  # Tests compare runs in this process with the programs' runs (conftest.py): both
  # must run the same kernels. Asked of TensorFlow itself, not of our own record.
  # On CPUs with AVX2 and no AVX512_VNNI this process once ran without oneDNN while
  # the programs ran with it; .ci/run provokes that here (CIFAR10_ONEDNN_SET).
  from tensorflow.python.util import _pywrap_util_port
  here = _pywrap_util_port.IsMklEnabled()
  done = helpers.run(['multi_gpu_train.py', '--synthetic', '--batch_size=4', '--max_steps=1',
                      '--summary_steps=0', '--train_dir=%s' % tmp_path],
                     env=helpers.user_env(TF_CPP_MIN_LOG_LEVEL='0'), fresh=True)
  assert done.code == 0, done.log()
  assert (TF_ONEDNN_LINE in done.err) == here, (here, done.log())
  assert ('oneDNN %s: ' % ('on' if here else 'off')) in done.out, done.log()


# ---- --seed with oneDNN on: still repeats exactly ------------------------------------

LOSS_TAG = '1_loss/total_loss'


def _seeded(sample, train_dir, *extra, fresh=False):
  """multi_gpu_train.py seeded, with --onednn=on. fresh: TensorFlow's own notice at its
  import says oneDNN is on too; else forked from a server that imported TensorFlow so."""
  argv = ['multi_gpu_train.py', '--onednn=on', '--seed=7', '--summary_steps=1',
          '--log_frequency=1', '--num_gpus=2', '--batch_size=8',
          '--train_dir=%s' % train_dir] + sample.flags + list(extra)
  if fresh:
    done = _run(*argv)
    assert TF_ONEDNN_LINE in done.err, done.log()
  else:  # as _run's, the setting left to the flag: forked unless that changes the import's
    done = helpers.run(argv, env=helpers.user_env(**{machine.ENV: None,
                                                     machine.SET_HERE_ENV: None}))
    assert done.code == 0, done.log()
  assert 'oneDNN on: --onednn=on' in done.out, done.log()
  return done


@pytest.fixture(scope='module')
def seeded_runs(sample, tmp_path_factory):
  """Three seeded runs with oneDNN on, to step 8: two whole, one cut at step 3 and resumed.

  Returns {name: train dir} for 'a', 'b' and 'cut'.
  """
  root = tmp_path_factory.mktemp('seeded')
  _seeded(sample, root / 'a', '--max_steps=8', fresh=True)
  _seeded(sample, root / 'b', '--max_steps=8')
  _seeded(sample, root / 'cut', '--max_steps=3')
  assert 'Resuming from' in _seeded(sample, root / 'cut', '--max_steps=8').out
  return {name: root / name for name in ('a', 'b', 'cut')}


def _assert_identical(a, b):
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.xdist_group('onednn_seeded_runs')
def test_seeded_runs_with_onednn_on_twice_bit_identical(seeded_runs):
  a, b = seeded_runs['a'], seeded_runs['b']
  assert sorted(helpers.scalars(a, LOSS_TAG)) == list(range(9))  # 0..7, and the end
  assert helpers.scalars(a, LOSS_TAG) == helpers.scalars(b, LOSS_TAG)  # bit for bit
  _assert_identical(helpers.checkpoint(a), helpers.checkpoint(b))


@pytest.mark.slow
@pytest.mark.xdist_group('onednn_seeded_runs')
def test_seeded_run_with_onednn_on_resumed_equals_uninterrupted(seeded_runs):
  _assert_identical(helpers.checkpoint(seeded_runs['a']),
                    helpers.checkpoint(seeded_runs['cut']))
