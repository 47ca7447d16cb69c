"""benchmarks/: a --quick run end to end in a subprocess, and the parent's parts by hand."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, 'benchmarks')
BENCHMARK = os.path.join(BENCHMARKS, 'benchmark.py')
sys.path.insert(0, BENCHMARKS)

import dist_rows  # noqa: E402  the parent's modules import no TensorFlow
import targets  # noqa: E402

TIMEOUT_SECS = 600        # --quick takes about 90 s on 2 idle cores
FLOPS_PER_EXAMPLE = 105295104  # 3 x forward 36,941,568 - conv1's forward 5,529,600
DIST_LABELS = [label for label, _, _ in dist_rows.RUNS][:-1]  # --quick's
TRAINER_LINE = '2026-11-23 07:01:%s: step %d, loss = 4.40 (160.8 examples/sec; 0.100 sec/batch)'
WORKER_LINE = ('[worker%d] 2026-11-23 07:01:%s: step %d, loss = 4.40 (160.8 examples/sec; '
               '0.100 sec/batch) [worker %d, local step %d]')


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
  """One --quick run for the module's tests: (its JSON's table, its stdout)."""
  tmp_path = tmp_path_factory.mktemp('benchmark')
  json_path = tmp_path / 'benchmark.json'
  proc = subprocess.run([sys.executable, BENCHMARK, '--quick', '--json', str(json_path)],
                        capture_output=True, text=True, timeout=TIMEOUT_SECS,
                        cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return json.loads(json_path.read_text())['table'], proc.stdout


@pytest.mark.slow
def test_benchmark_quick_run_prints_table_dist_rows_and_targets(quick):
  table, stdout = quick
  assert 'ours/peer' in stdout and 'ours/fit' in stdout
  for label in DIST_LABELS:
    assert label in stdout
  assert 'Targets, each against what this run measured:' in stdout
  assert [t['name'] for t in table['targets']] == [
      'ours / custom-loop peer, every N', 'ours / model.fit peer, every N',
      'ours of matmul rate at N=1', 'real / synthetic input, every N',
      'seeded / unseeded real input at N=1',
      'dist_train.py 1 async worker / multi_gpu_train.py']
  for target in table['targets']:
    assert target['verdict'] == 'met' or target['verdict'].startswith('SHORT by '), target
  assert set(table['targets'][-1]['measured']) == {'async'}  # the target's; sync printed


@pytest.mark.slow
def test_benchmark_quick_run_measures_every_row_with_positive_numbers(quick):
  table, _ = quick
  assert table['flops_per_example']['total'] == FLOPS_PER_EXAMPLE
  assert [l['name'] for l in table['flops_per_example']['layers']] == [
      'conv1', 'conv2', 'local3', 'local4', 'softmax_linear']
  assert table['matmul']['by_setting']['false'] > 0 and table['matmul']['by_setting']['true'] > 0
  assert table['pipeline']['examples_per_sec'] > 0
  row = table['towers']['1']
  assert row['global_batch'] == 16
  every = [row['real'], row['seeded']] + [row[kind][on] for kind in ('synthetic', 'peer', 'fit')
                                          for on in ('false', 'true')]
  for stats in every:
    assert 0 < stats['min'] <= stats['examples_per_sec'] <= stats['max'], stats
    assert stats['peak_mb'] > 0 and stats['steps'] == 3, stats
  for key in ('real_over_synthetic', 'ours_over_peer', 'ours_over_fit', 'achieved_gflops',
              'fraction_of_matmul', 'seeded_over_unseeded', 'ours_over_peer_same_setting',
              'ours_over_fit_same_setting'):
    assert row[key] > 0, key
  assert table['mnist']['examples_per_sec'] > 0  # the book's network, 2 towers x 100
  assert table['dist'][DIST_LABELS[0]]['vs_multi_gpu_train'] == 1.0
  for label in DIST_LABELS:
    assert table['dist'][label]['examples_per_sec'] > 0, label


@pytest.mark.slow
def test_benchmark_quick_run_peers_are_the_same_model_and_fit_keeps_defaults(quick):
  table, _ = quick
  runs = {r['label']: r for r in table['runs']}
  # A fresh model's loss is ln(10) + the weight decay, in ours and in both peers, and
  # whichever kernels compute it.
  for setting in ('off', 'on'):
    ours = runs['ours N=1 synthetic oneDNN %s' % setting]
    assert ours['config']['onednn'] == (setting == 'on')
    assert ours['first_loss'] == pytest.approx(4.68, abs=0.05)
    for label in ('custom-loop peer N=1 synthetic oneDNN %s' % setting,
                  'model.fit peer N=1 synthetic oneDNN %s' % setting):
      assert runs[label]['first_loss'] == pytest.approx(ours['first_loss'], abs=0.05), label
  assert runs['model.fit peer N=1 synthetic oneDNN off']['jit_compile'] is False  # no GPU
  assert runs['ours MNIST N=2 synthetic']['first_loss'] > 10  # unscaled pixels, as the book
  # Two workers: both trained inside the window the rate comes from.
  assert sorted(runs['dist_train.py 2 workers, async']['loss_lines']) == ['worker0',
                                                                           'worker1']


def test_benchmark_parent_imports_no_tensorflow():
  code = ('import sys; sys.path.insert(0, %r); import benchmark, table, dist_rows, extras, '
          'knobs, runner, targets; assert "tensorflow" not in sys.modules, "imported"'
          % BENCHMARKS)
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr


def test_benchmark_bad_flag_exits_with_one_line_naming_it():
  proc = subprocess.run([sys.executable, BENCHMARK, '--towers=1,x'], capture_output=True,
                        text=True)
  assert proc.returncode == 1
  assert proc.stderr == "error: --towers must be comma-separated integers, got '1,x'\n"
  proc = subprocess.run([sys.executable, BENCHMARK, '--tower=1'], capture_output=True,
                        text=True)
  assert proc.stderr == ('error: unrecognized arguments: --tower=1 (--help lists the '
                         'flags)\n')


def test_steps_by_task_reads_worker_and_trainer_loss_lines():
  output = '\n'.join([
      WORKER_LINE % (0, '09.5', 3, 0, 2),
      '[worker1] worker 1: training from global step 0',
      WORKER_LINE % (1, '10.25', 4, 1, 1),
      TRAINER_LINE % ('11', 7),  # microseconds 0: datetime prints none
  ])
  tasks = dist_rows.steps_by_task(output)
  assert sorted(tasks) == ['local', 'worker0', 'worker1']
  assert [step for step, _ in tasks['worker0']] == [2]  # the local step, not the global
  assert tasks['worker1'][0][1] - tasks['worker0'][0][1] == pytest.approx(0.75)
  assert tasks['local'][0][0] == 7


def test_window_rate_two_workers_counts_only_while_both_train():
  # worker0 trains alone from t=0, worker1 joins; worker1 ends first at t=10.
  tasks = {'worker0': [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.0), (6, 6.0),
                       (7, 8.0), (8, 10.0), (9, 12.0)],
           'worker1': [(1, 3.5), (2, 4.0), (3, 6.0), (4, 8.0), (5, 10.0)]}
  # Opens at worker1's local step 2 (t=4), closes at its last line (t=10): worker0 does
  # steps 5..8 in 6 s, worker1 steps 2..5 in 6 s, 3 steps x 100 images each.
  rate, window = dist_rows.window_rate(tasks, 2, 100)
  assert window == 6.0
  assert rate == pytest.approx(2 * 3 * 100 / 6.0)


def test_window_rate_without_overlap_says_which_task():
  tasks = {'worker0': [(1, 0.0), (2, 1.0), (3, 2.0)], 'worker1': [(1, 2.5), (2, 3.0)]}
  assert dist_rows.window_rate(tasks, 1, 100) == (
      None, 'worker0 has 0 loss lines while all tasks train')


def test_targets_check_short_target_says_by_how_much(capsys):
  row = dict(ours_over_peer=1.50, ours_over_fit=1.5, fraction_of_matmul=0.75,
             real_over_synthetic=0.96, seeded_over_unseeded=1.0)
  dist = {'1 worker async': dict(workers=1, sync=False, vs_multi_gpu_train=0.9),
          '1 worker sync': dict(workers=1, sync=True, vs_multi_gpu_train=0.6),  # not a target
          '2 workers': dict(workers=2, sync=False, vs_multi_gpu_train=0.1)}
  results = targets.check({'1': row, '2': dict(row, ours_over_fit=1.7)}, dist)
  assert [r['verdict'] for r in results] == [
      'met', 'SHORT by 6.2% (N=1: 1.50)', 'met', 'met', 'met', 'met']
  assert 'N=1 1.50, N=2 1.70' in capsys.readouterr().out


@pytest.mark.slow
def test_benchmark_profile_lists_op_types_of_a_traced_step_both_settings(tmp_path):
  json_path = tmp_path / 'profile.json'
  proc = subprocess.run([sys.executable, BENCHMARK, '--profile', '--towers=1', '--batch_size=8',
                         '--warmup=1', '--json', str(json_path)], capture_output=True,
                        text=True, timeout=TIMEOUT_SECS, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  profile = json.loads(json_path.read_text())['profile']
  assert sorted(profile) == ['off', 'on']
  for setting, result in profile.items():
    assert len(result['durations']) == 3 and all(d > 0 for d in result['durations'])
    ops = result['ms_per_step']
    # Every step runs the convolutions' gradients, and the LRN's band as a matmul.
    assert any('Conv2DBackpropFilter' in op for op in ops), sorted(ops)
    assert any('MatMul' in op for op in ops) and all(ms >= 0 for ms in ops.values())
    assert 'oneDNN %s: traced step ' % setting in proc.stdout
  assert '_MklNative' in ' '.join(profile['on']['ms_per_step'])  # oneDNN's own kernels ran
  assert '_MklNative' not in ' '.join(profile['off']['ms_per_step'])


@pytest.mark.slow
def test_ps_round_trip_times_reads_and_sends_through_a_ps_task():
  proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, 'ps_round_trip.py'),
                         '--rounds=3'], capture_output=True, text=True, timeout=TIMEOUT_SECS)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert '10 variables, 4.3 MB; ms per sess.run, median of 3' in proc.stdout
  rows = dict(re.findall(r'^(read|send|both|step) +([\d.]+ +[\d.]+)$', proc.stdout, re.M))
  assert sorted(rows) == ['both', 'read', 'send', 'step']
  for kind, pair in rows.items():
    via_ps, local = map(float, pair.split())
    assert via_ps > 0 and local > 0, kind
    if kind != 'step':  # 4.3 MB through gRPC costs more than in memory (a step: noise)
      assert via_ps > local, kind
  assert re.search(r'^the ps costs [\d.]+ ms per step .*; a plain SGD step of 128 images '
                   r'-?[\d.]+ ms more', proc.stdout, re.M)
