"""benchmarks/: a --quick run end to end in a subprocess, and the parent's parts by hand."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

import helpers
from benchmarks import dist_rows, loss_lines, netlab, runner, targets  # no TensorFlow

BENCHMARK = [sys.executable, '-m', 'benchmarks']  # from the repository's root, helpers.run's cwd
TIMEOUT_SECS = 600        # --quick's run, with room for a loaded machine (docs/performance.md)
PARAMETERS = 1068298       # the model's trainable parameters: 4.27 MB in float32
FLOPS_PER_EXAMPLE = 105295104  # 3 x forward 36,941,568 - conv1's forward 5,529,600
QUICK_STEPS, QUICK_WARMUP = 3, 1   # benchmark.QUICK's
DIST_LABELS = [label for label, _, _ in dist_rows.RUNS[:dist_rows.QUICK_RUNS]]  # --quick's
# Runs that start from the same weights and batch compute the same first loss but for
# rounding; a wrong model is off by 1e-3 and more (what was measured: docs/performance.md).
SAME_LOSS = 1e-4
# bfloat16 rounds the activations to 8 bits; the weight decay, most of the loss, stays
# float32, so the losses stay close to float32's for the three steps of --quick.
BF16_SAME_LOSS = 2e-3
TRAINER_LINE = '2026-11-23 07:01:%s: step %d, loss = 4.40 (160.8 examples/sec; 0.100 sec/batch)'
WORKER_LINE = ('[worker%d] 2026-11-23 07:01:%s: step %d, loss = 4.40 (160.8 examples/sec; '
               '0.100 sec/batch) [worker %d, local step %d]')


@pytest.fixture(scope='session')
def quick(tmp_path_factory):
  """One --quick run for the whole pytest run (its tests may land in two processes, and
  a module fixture runs again when its process comes back to the module): (its JSON's
  table, its stdout)."""
  def run_quick(directory):
    json_path = directory / 'benchmark.json'
    run = helpers.run(BENCHMARK + ['--quick', '--json', str(json_path)], timeout=TIMEOUT_SECS)
    assert run.code == 0, run.log()  # the message names the whole log's file
    return [json.loads(json_path.read_text())['table'], run.out]
  return tuple(helpers.once_per_run(tmp_path_factory, 'benchmark_quick', run_quick))


def in_window(by_task, warmup):
  """(window seconds, {task: its (local step, time) lines inside}), worked out here from
  the JSON's loss lines: from the last task's first line past warm-up to the first
  task's last line."""
  opens = max(min(t for step, t in lines if step >= warmup) for lines in by_task.values())
  closes = min(lines[-1][1] for lines in by_task.values())
  return closes - opens, {task: [(step, t) for step, t in lines if opens <= t <= closes]
                          for task, lines in by_task.items()}


@pytest.mark.slow
@pytest.mark.xdist_group('benchmark_quick')
@pytest.mark.timeout(TIMEOUT_SECS + 60)  # the run's timeout first: it names the log
def test_benchmark_quick_run_prints_table_dist_rows_and_targets(quick):
  table, stdout = quick
  assert 'ours/peer' in stdout and 'ours/fit' in stdout
  for label in DIST_LABELS:
    assert label in stdout
  assert [t['name'] for t in table['targets']] == [
      'ours / custom-loop peer, every N', 'ours / model.fit peer, every N',
      'ours of matmul rate at N=1', 'ours of conv2 kernel rate, float32, every N',
      'real / synthetic input, every N', 'seeded / unseeded real input at N=1',
      'dist_train.py 1 worker / multi_gpu_train.py',
      'ours bfloat16 / ours float32, every N', 'ours bfloat16 / model.fit peer bfloat16, every N']
  # Each verdict follows from its goal and the value the table measured.
  row = table['towers']['1']
  dist = lambda label: table['dist'][label]['vs_multi_gpu_train']  # noqa: E731
  expected = [(targets.OURS_OVER_PEER, {'N=1': row['ours_over_peer']}),
              (targets.OURS_OVER_FIT, {'N=1': row['ours_over_fit']}),
              (targets.OF_MATMUL, {'N=1': row['fraction_of_matmul']}),
              (targets.OF_CONV2, {'N=1': row['of_conv2']['synthetic']}),
              (targets.REAL_OVER_SYNTHETIC, {'N=1': row['real_over_synthetic']}),
              (targets.SEEDED_OVER_UNSEEDED, {'N=1': row['seeded_over_unseeded']}),
              (targets.DIST_OVER_LOCAL, {
                  'async': dist('dist_train.py 1 worker, async'),
                  'sync': dist('dist_train.py 1 worker, --sync_replicas')})]
  if runner.BF16_UNITS:  # the bfloat16 rows, where this CPU has the units
    expected += [(targets.BF16_OVER_FLOAT32, {'N=1': row['bf16']['over_float32']['synthetic']}),
                 (targets.BF16_OVER_FIT, {'N=1': row['bf16']['ours_over_fit']})]
  else:
    assert row['bf16'] is None
    assert [t['measured'] for t in table['targets'][-2:]] == [{}] * 2
  for target, (goal, measured) in zip(table['targets'], expected):
    assert target['goal'] == goal and target['measured'] == measured, target
    # --quick's steps time start-up: no verdict (targets.check's own: the test below).
    assert target['verdict'] is None, target
    assert re.search('^  %s ' % re.escape(target['name']), stdout, re.M), target
  assert 'SHORT by' not in stdout and 'no verdict' in stdout, stdout


@pytest.mark.slow
@pytest.mark.xdist_group('benchmark_quick')
@pytest.mark.timeout(TIMEOUT_SECS + 60)  # the run's timeout first: it names the log
def test_benchmark_quick_run_measures_every_row_with_positive_numbers(quick):
  table, _ = quick
  assert table['flops_per_example']['total'] == FLOPS_PER_EXAMPLE
  assert [l['name'] for l in table['flops_per_example']['layers']] == [
      'conv1', 'conv2', 'local3', 'local4', 'softmax_linear']
  assert table['matmul']['by_setting']['false'] > 0 and table['matmul']['by_setting']['true'] > 0
  # conv2's kernels alone, in each precision the rows train in
  assert sorted(table['conv2']['gflops']) == ['bfloat16', 'float32'][not runner.BF16_UNITS:]
  assert all(rate > 0 for rate in table['conv2']['gflops'].values())
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
  if runner.BF16_UNITS:  # ours --use_bf16 and the peers under mixed_bfloat16, oneDNN on
    bf16 = row['bf16']
    for kind in ('synthetic', 'peer', 'fit'):
      assert 0 < bf16[kind]['min'] <= bf16[kind]['examples_per_sec'] <= bf16[kind]['max']


@pytest.mark.slow
@pytest.mark.xdist_group('benchmark_quick')
@pytest.mark.timeout(TIMEOUT_SECS + 60)  # the run's timeout first: it names the log
def test_benchmark_quick_run_ratios_are_of_the_rows_own_rates(quick):
  table, stdout = quick
  row = table['towers']['1']
  ours = row['synthetic_default']['examples_per_sec']
  assert row['real_over_synthetic'] == pytest.approx(row['real']['examples_per_sec'] / ours)
  assert row['ours_over_peer'] == pytest.approx(ours / row['peer_default']['examples_per_sec'])
  assert row['ours_over_fit'] == pytest.approx(ours / row['fit_default']['examples_per_sec'])
  assert row['seeded_over_unseeded'] == pytest.approx(row['seeded']['examples_per_sec'] /
                                                      row['real']['examples_per_sec'])
  assert row['achieved_gflops'] == pytest.approx(ours * FLOPS_PER_EXAMPLE / 1e9)
  assert row['fraction_of_matmul'] == pytest.approx(row['achieved_gflops'] /
                                                    table['matmul']['gflops'])
  conv2 = table['conv2']['gflops']
  for kind, stats in (('synthetic', row['synthetic_default']), ('peer', row['peer_default']),
                      ('fit', row['fit_default'])):  # each at its own default, as the targets
    assert row['of_conv2'][kind] == pytest.approx(
        stats['examples_per_sec'] * FLOPS_PER_EXAMPLE / 1e9 / conv2['float32']), kind
  assert re.search(r'^\s+1  %.0f%% / ' % (100 * row['of_conv2']['synthetic']), stdout, re.M)
  if runner.BF16_UNITS:  # each bfloat16 rate over its own float32 rate, and over the peer's
    bf16 = row['bf16']
    for kind in ('synthetic', 'peer', 'fit'):  # and over conv2's bfloat16 kernel rate
      assert bf16['of_conv2'][kind] == pytest.approx(
          bf16[kind]['examples_per_sec'] * FLOPS_PER_EXAMPLE / 1e9 / conv2['bfloat16']), kind
    for kind in ('synthetic', 'peer', 'fit'):
      assert bf16['over_float32'][kind] == pytest.approx(
          bf16[kind]['examples_per_sec'] / row[kind]['true']['examples_per_sec']), kind
    assert bf16['ours_over_peer'] == pytest.approx(bf16['synthetic']['examples_per_sec'] /
                                                   bf16['peer']['examples_per_sec'])


@pytest.mark.slow
@pytest.mark.xdist_group('benchmark_quick')
@pytest.mark.timeout(TIMEOUT_SECS + 60)  # the run's timeout first: it names the log
def test_benchmark_quick_run_dist_rates_come_from_the_loss_lines(quick):
  table, _ = quick
  baseline = table['dist'][DIST_LABELS[0]]['examples_per_sec']
  assert table['dist'][DIST_LABELS[0]]['vs_multi_gpu_train'] == 1.0
  runs = {r['label']: r for r in table['runs']}
  for label in DIST_LABELS:
    dist = table['dist'][label]
    assert dist['examples_per_sec'] > 0, label
    assert dist['vs_multi_gpu_train'] == pytest.approx(dist['examples_per_sec'] / baseline)
    # The rate is the loss lines': each task's local steps over its time in the window.
    run = runs[label]
    window_sec, inside = in_window(run['loss_lines'], QUICK_WARMUP)
    global_batch = table['towers']['1']['global_batch']  # 1 tower of 16, as a worker's
    rate = sum((lines[-1][0] - lines[0][0]) * global_batch / (lines[-1][1] - lines[0][1])
               for lines in inside.values())
    assert dist['examples_per_sec'] == pytest.approx(rate), label
    assert run['window_sec'] == pytest.approx(window_sec), label
    if dist['workers']:  # what the updates applied, and the bytes through 127.0.0.1
      assert dist['floor_bytes_per_update'] == (
          PARAMETERS * 4 * 2 * (dist['workers'] if dist['sync'] else 1)), dist
      assert dist['applied_examples_per_sec'] > 0, dist
      # Each update moves the variables and the gradients; the counter is read as loss
      # lines arrive, so a window of 3 steps may hold up to half a step more or less.
      assert dist['bytes_per_update'] >= 0.5 * dist['floor_bytes_per_update'], dist


@pytest.mark.slow
@pytest.mark.xdist_group('benchmark_quick')
@pytest.mark.timeout(TIMEOUT_SECS + 60)  # the run's timeout first: it names the log
def test_benchmark_quick_run_peers_are_the_same_model_and_fit_keeps_defaults(quick):
  table, _ = quick
  runs = {r['label']: r for r in table['runs']}
  # A fresh model's loss is ln(10) + the weight decay. Ours with oneDNN off starts from
  # its seeded initialisers; ours with it on and both peers from those same weights, on
  # the same batch: the same model computes the same first loss, whichever kernels.
  start = runs['ours N=1 synthetic oneDNN off']
  assert start['first_loss'] == pytest.approx(4.68, abs=0.05)
  for setting in ('off', 'on'):
    ours = runs['ours N=1 synthetic oneDNN %s' % setting]
    assert ours['config']['onednn'] == (setting == 'on')
    assert ours['first_loss'] == pytest.approx(4.68, abs=0.05)
    assert ours['first_loss'] == pytest.approx(start['first_loss'], abs=SAME_LOSS)
    peer = runs['custom-loop peer N=1 synthetic oneDNN %s' % setting]
    fit = runs['model.fit peer N=1 synthetic oneDNN %s' % setting]
    for run in (peer, fit):
      assert run['first_loss'] == pytest.approx(ours['first_loss'], abs=SAME_LOSS), run['label']
      # The Keras initialisers draw what the trainer's do: the same spread, the same biases.
      for layer, drawn in ours['initial_weights'].items():
        theirs = run['initial_weights'][layer]
        assert theirs['shape'] == drawn['shape'], (run['label'], layer)
        assert theirs['kernel_std'] == pytest.approx(drawn['kernel_std'], rel=0.1), (
            run['label'], layer)
        assert theirs['bias_mean'] == pytest.approx(drawn['bias_mean'], abs=1e-6), (
            run['label'], layer)
    # The same updates: SGD at the same rate on the same gradients. fit's loss is its
    # running mean over the epoch.
    assert peer['losses'] == pytest.approx(ours['losses'], abs=SAME_LOSS)
    assert fit['last_loss'] == pytest.approx(sum(ours['losses']) / len(ours['losses']),
                                             abs=SAME_LOSS)
  assert runs['model.fit peer N=1 synthetic oneDNN off']['jit_compile'] is False  # no GPU
  if runner.BF16_UNITS:  # bfloat16, from the same weights: ours and the peers alike
    ours = runs['ours N=1 synthetic --use_bf16 oneDNN on']
    assert ours['config']['use_bf16'] and ours['config']['onednn'] is True
    assert ours['first_loss'] == pytest.approx(start['first_loss'], abs=BF16_SAME_LOSS)
    peer = runs['custom-loop peer N=1 synthetic mixed_bfloat16 oneDNN on']
    fit = runs['model.fit peer N=1 synthetic mixed_bfloat16 oneDNN on']
    assert peer['config']['policy'] == fit['config']['policy'] == 'mixed_bfloat16'
    assert peer['losses'] == pytest.approx(ours['losses'], abs=BF16_SAME_LOSS)
    assert fit['first_loss'] == pytest.approx(ours['first_loss'], abs=BF16_SAME_LOSS)
  assert runs['ours MNIST N=2 synthetic']['first_loss'] > 10  # unscaled pixels, as the book
  # Two workers: both trained --steps steps inside the window the rate comes from.
  two = runs['dist_train.py 2 workers, async']
  assert sorted(two['loss_lines']) == ['worker0', 'worker1']
  assert two['stopped']  # on its lines, not at a --max_steps
  for task, lines in in_window(two['loss_lines'], QUICK_WARMUP)[1].items():
    assert lines and lines[-1][0] - lines[0][0] >= QUICK_STEPS, (task, two['loss_lines'])


def test_benchmark_parent_imports_no_tensorflow():
  code = ('import sys; import benchmarks.__main__, benchmarks.benchmark, benchmarks.table, '
          'benchmarks.dist_rows, benchmarks.op_profile, benchmarks.runner, benchmarks.targets; '
          'assert "tensorflow" not in sys.modules, "imported"')
  run = helpers.run([sys.executable, '-c', code], fresh=True)  # what it imports
  assert run.code == 0, run.log()


@pytest.mark.slow
def test_runner_workers_forked_from_one_parent_per_environment_fail_and_time_out_alone(
    monkeypatch):
  work = runner.Runner(total=5)
  try:
    first = work.run('matmul', dict(kind='matmul', size=64, runs=2, onednn=False))
    again = work.run('matmul again', dict(kind='matmul', size=64, runs=2, onednn=False))
    assert first['gflops'] > 0 and again['gflops'] > 0
    assert len(work.parents) == 1  # the same environment: one parent, two children
    work.run('matmul oneDNN on', dict(kind='matmul', size=64, runs=2, onednn=True))
    assert len(work.parents) == 2
    with pytest.raises(runner.BenchmarkError) as failed:  # a config without its size
      work.run('broken matmul', dict(kind='matmul', runs=2, onednn=False))
    message = str(failed.value)
    assert message.startswith('broken matmul failed (exit status 1).'), message
    assert "KeyError: 'size'" in message and 'python -m benchmarks.worker' in message
    monkeypatch.setattr(runner, 'WORKER_TIMEOUT_SECS', 1)
    with pytest.raises(runner.BenchmarkError, match='^long matmul ran longer than 1 s and '
                       'was stopped; lower --steps or --batch_size$'):
      work.run('long matmul', dict(kind='matmul', size=1024, runs=10 ** 6, onednn=False))
    # Each worker is a child of its parent, never the parent itself: it still serves. Under
    # the usual limit again: within 1 s, this run too timed out on a loaded machine.
    monkeypatch.undo()
    assert work.run('after', dict(kind='matmul', size=64, runs=2, onednn=False))['gflops'] > 0
    assert all(parent.process.poll() is None for parent in work.parents.values())
  finally:
    work.close()
  assert [parent.process.returncode for parent in work.parents.values()] == [0, 0]


def test_benchmark_bad_flag_exits_with_one_line_naming_it():
  run = helpers.run(BENCHMARK + ['--towers=1,x'])
  assert run.code == 1, run.log()
  assert run.err == "error: --towers must be comma-separated integers, got '1,x'\n"
  run = helpers.run(BENCHMARK + ['--tower=1'])
  assert run.err == ('error: unrecognized arguments: --tower=1 (--help lists the '
                     'flags)\n')


def test_steps_by_task_reads_worker_and_trainer_loss_lines():
  output = '\n'.join([
      WORKER_LINE % (0, '09.5', 3, 0, 2),
      '[worker1] worker 1: training from global step 0',
      WORKER_LINE % (1, '10.25', 4, 1, 1),
      TRAINER_LINE % ('11', 7),  # microseconds 0: datetime prints none
  ])
  tasks = loss_lines.steps_by_task(output)
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
  rate, window = loss_lines.window_rate(tasks, 2, 100)
  assert window == 6.0
  assert rate == pytest.approx(2 * 3 * 100 / 6.0)


def test_applied_rate_and_bytes_per_update_count_global_steps_inside_the_window():
  # (printed at, global step, loopback bytes sent when read): two async workers' lines.
  samples = [(0.5, 1, 0), (1.0, 2, 100), (1.5, 4, 300), (2.0, 3, 350), (2.5, 6, 700),
             (9.0, 7, 10 ** 6)]
  # In the window 1.0 .. 2.5: global steps 2 -> 6 (a line printed out of order counts
  # as no step back), 600 bytes and 1.5 s between its first and last lines.
  assert loss_lines.bytes_per_update(samples, 1.0, 2.5) == 600 / 4
  assert loss_lines.applied_rate(samples, 1.0, 2.5, 16) == 4 * 16 / 1.5
  assert loss_lines.bytes_per_update(samples, 1.0, 1.2) is None   # one line: no growth
  assert loss_lines.applied_rate(samples, 1.0, 1.2, 16) is None
  assert loss_lines.bytes_per_update([(1.0, 2, None), (2.0, 3, None)], 0, 3) is None  # no counter
  assert dist_rows.replicas_to_aggregate(2, dist_rows.BACKUP) == 1
  assert dist_rows.replicas_to_aggregate(2, dist_rows.SYNC) == 2
  assert dist_rows.replicas_to_aggregate(2, ()) == 1


def test_loopback_bytes_sent_grows_with_traffic_on_127_0_0_1():
  before = loss_lines.loopback_bytes_sent()
  with socket.create_server(('127.0.0.1', 0)) as server:
    with socket.create_connection(server.getsockname()) as client:
      peer, _ = server.accept()
      with peer:
        client.sendall(b'x' * 100000)
        received = 0
        while received < 100000:
          received += len(peer.recv(65536))
  assert loss_lines.loopback_bytes_sent() - before >= 100000


def test_window_rate_without_overlap_says_which_task():
  tasks = {'worker0': [(1, 0.0), (2, 1.0), (3, 2.0)], 'worker1': [(1, 2.5), (2, 3.0)]}
  assert loss_lines.window_rate(tasks, 1, 100) == (
      None, 'worker0 has 0 loss lines while all tasks train')


def test_window_full_waits_until_every_worker_trained_steps_together():
  # worker0 trains alone from t=0; worker1's first step ends at t=3.5 (its warm-up).
  tasks = {'worker0': [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.0), (6, 5.0)],
           'worker1': [(1, 3.5)]}
  assert not loss_lines.window_full({'worker0': tasks['worker0']}, 2, 1, 2)  # one task yet
  assert not loss_lines.window_full(tasks, 2, 1, 2)  # worker1 has not stepped since
  tasks['worker1'].append((2, 4.5))
  assert not loss_lines.window_full(tasks, 2, 1, 2)  # 1 step of worker1 in 3.5..4.5
  tasks['worker1'].append((3, 5.5))
  assert not loss_lines.window_full(tasks, 2, 1, 2)  # it closes at worker0's 5.0: 5->6
  tasks['worker0'].append((7, 6.0))
  assert not loss_lines.window_full(tasks, 2, 1, 2)  # at worker1's 5.5: worker0 still 5->6
  tasks['worker1'].append((4, 6.5))
  assert loss_lines.window_full(tasks, 2, 1, 2)      # 3.5..6.0: worker0 5->7, worker1 1->3
  assert loss_lines.window_full({'worker0': tasks['worker0']}, 1, 1, 6)  # 0.0..6.0: 1->7
  assert not loss_lines.window_full({'worker0': tasks['worker0']}, 1, 1, 7)


def test_targets_check_short_target_says_by_how_much(capsys):
  row = dict(ours_over_peer=1.50, ours_over_fit=1.5, fraction_of_matmul=0.75,
             of_conv2=dict(synthetic=0.8), real_over_synthetic=0.96, seeded_over_unseeded=1.0,
             bf16=dict(over_float32=dict(synthetic=1.2, peer=1.0, fit=1.0), ours_over_fit=1.25))
  dist = {'1 worker async': dict(workers=1, sync=False, vs_multi_gpu_train=0.9),
          '1 worker sync': dict(workers=1, sync=True, vs_multi_gpu_train=0.6),
          '2 workers': dict(workers=2, sync=False, vs_multi_gpu_train=0.1)}  # not a target
  results = targets.check({'1': row, '2': dict(row, ours_over_fit=1.7, bf16=None,
                                               of_conv2=dict(synthetic=0.9))}, dist)
  assert [r['verdict'] for r in results] == [
      'met', 'SHORT by 6.2% (N=1: 1.50)', 'met', 'SHORT by 5.9% (N=1: 80%)', 'met', 'met',
      'SHORT by 33.3% (sync: 0.60)', 'SHORT by 7.7% (N=1: 1.20)', 'met']
  assert results[6]['measured'] == {'async': 0.9, 'sync': 0.6}
  out = capsys.readouterr().out
  assert 'N=1 1.50, N=2 1.70' in out and 'N=1 80%, N=2 90%' in out, out
  assert results[8]['measured'] == {'N=1': 1.25}  # N=2 ran no bfloat16 row: not measured
  assert [r['verdict'] for r in targets.check({'1': dict(row, bf16=None)}, dist)[-2:]] == [
      'not measured'] * 2


def test_targets_check_quick_prints_measured_values_and_no_verdict(capsys):
  row = dict(ours_over_peer=0.5, ours_over_fit=0.5, fraction_of_matmul=0.1,
             of_conv2=dict(synthetic=0.1), real_over_synthetic=0.5, seeded_over_unseeded=0.5,
             bf16=None)
  dist = {'1 worker async': dict(workers=1, sync=False, vs_multi_gpu_train=0.3)}
  results = targets.check({'1': row}, dist, quick=True)
  out = capsys.readouterr().out
  assert [r['verdict'] for r in results] == [None] * 9
  assert results[0]['measured'] == {'N=1': 0.5} and 'N=1 0.50' in out
  assert 'SHORT' not in out and ' met' not in out and 'not measured' not in out, out
  assert 'no verdict' in out and 'run without --quick' in out, out


NET_ROW = re.compile(  # python -m benchmarks.net_rows's rows at 200mbit, 2 workers
    r'^200mbit +2 +(async ps|sync ps|all-reduce) +(\d+) +([\d.]+) +(\d+) +(\d+)%$', re.M)


@pytest.mark.parametrize('flag, said', [
    ('--rates=fast', "error: --rates: 'fast' is not unshaped or a rate such as 200mbit\n"),
    ('--workers=2,x', "error: argument --workers: '2,x' is not worker counts such as 2,4 "
                      "(--help lists the flags)\n")])
def test_net_rows_bad_flag_exits_with_one_line_naming_it(flag, said):
  run = helpers.run([sys.executable, '-m', 'benchmarks.net_rows', flag])
  assert run.code in (1, 2) and run.err == said and run.out == '', run.log()


@pytest.mark.slow
@pytest.mark.network
def test_net_rows_each_mode_on_shaped_links_its_rate_bytes_and_bound():
  why = netlab.available()
  if why:
    pytest.skip(why)
  run = helpers.run([sys.executable, '-m', 'benchmarks.net_rows', '--rates=200mbit',
                     '--workers=2', '--batch_size=8', '--warmup=1', '--steps=3',
                     '--repeats=1'], timeout=TIMEOUT_SECS)
  assert run.code == 0, run.log()
  rows = {mode: [float(n) for n in numbers]
          for mode, *numbers in NET_ROW.findall(run.out)}
  assert sorted(rows) == ['all-reduce', 'async ps', 'sync ps'], run.out
  megabytes = {mode: row[1] for mode, row in rows.items()}
  # A ps link carries each worker's 4.27 MB gradient in sync, one in async; all-reduce's
  # ring, at 2 workers, the same 4.27 MB through every link; gRPC's framing beside (each
  # counted where no update is under way at the window's edges: 4.29 MB in each of six
  # runs of this command, 2026-12-02, one beside two busy loops).
  assert 4.27 < megabytes['async ps'] < 4.4 and 4.27 < megabytes['all-reduce'] < 4.4, rows
  assert 1.95 < megabytes['sync ps'] / megabytes['async ps'] < 2.05, rows
  for mode, (ex_per_sec, megabytes_, bound, share) in rows.items():
    # The bound: 200 Mbit/s (25 MB/s) over the bytes, times the examples of an update.
    examples = 8 * (1 if mode == 'async ps' else 2)
    assert abs(bound - 25.0 / megabytes_ * examples) < 0.02 * bound + 1, rows
    assert 0 < ex_per_sec <= 1.1 * bound and 0 < share <= 110, rows
  assert '200mbit, 2 workers: all-reduce / sync ps = ' in run.out


@pytest.mark.slow
def test_benchmark_profile_lists_op_types_of_a_traced_step_each_setting(tmp_path):
  json_path = tmp_path / 'profile.json'
  run = helpers.run(BENCHMARK + ['--profile', '--towers=1', '--batch_size=8', '--warmup=1',
                                 '--json', str(json_path)], timeout=TIMEOUT_SECS)
  assert run.code == 0, run.log()
  profile = json.loads(json_path.read_text())['profile']
  # Two independent chains of elementwise ops take longer than one: they share the cores.
  chains = profile.pop('chains')
  assert 0 < chains['one_ms'] < chains['two_ms'], chains
  assert 'a chain of 8: %.2f ms alone, %.2f ms for two' % (chains['one_ms'], chains['two_ms']) \
      in run.out
  assert sorted(profile) == ['off', 'on'] + (['on, bfloat16'] if runner.BF16_UNITS else [])
  for setting, result in profile.items():
    assert len(result['durations']) == 3 and all(d > 0 for d in result['durations'])
    # The session's threads: at least one worked, none more than the wall time (+ a tick)
    shares = [share for _, share in result['threads']]
    assert shares == sorted(shares, reverse=True) and 0.05 < shares[0] < 1.1, result['threads']
    ops = result['ms_per_step']
    # Every step runs the convolutions' gradients, and the LRN's band as a matmul.
    assert any('Conv2DBackpropFilter' in op for op in ops), sorted(ops)
    assert any('MatMul' in op for op in ops) and all(ms >= 0 for ms in ops.values())
    assert 'oneDNN %s: traced step ' % setting in run.out
  assert '_MklNative' in ' '.join(profile['on']['ms_per_step'])  # oneDNN's own kernels ran
  assert '_MklNative' not in ' '.join(profile['off']['ms_per_step'])
  if runner.BF16_UNITS:  # every variable, and the LRN's input, cast to bfloat16 and back
    casts = {name: result['ms_per_step'].get('Cast', 0) for name, result in profile.items()}
    assert casts['on, bfloat16'] > casts['on'], casts


_ONCE = '''
import sys, time, types, pathlib
import helpers  # tests/helpers/: the cwd
base, count = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def setup(directory):
  with open(count, "a") as f:
    f.write("ran\\n")
  time.sleep(1)  # the other process asks meanwhile
  if sys.argv[3] == "fail":
    raise AssertionError("exited with 1; whole log: /x/001-benchmark.py.log")
  return {"table": 1}
factory = types.SimpleNamespace(getbasetemp=lambda: base)
try:
  print(helpers.once_per_run(factory, "shared", setup))
except AssertionError as e:
  print("failed:", e)
'''


@pytest.mark.parametrize('outcome', ['pass', 'fail'])
def test_once_per_run_two_xdist_processes_run_the_setup_once(tmp_path, outcome):
  count = tmp_path / 'count'
  tasks = [subprocess.Popen(  # each its worker's base directory, as xdist gives them
      [sys.executable, '-c', _ONCE, str(tmp_path / worker), str(count), outcome], text=True,
      stdout=subprocess.PIPE, cwd=os.path.join(helpers.ROOT, 'tests'),
      env=helpers.user_env(PYTEST_XDIST_WORKER=worker)) for worker in ('gw0', 'gw1')]
  outs = [task.communicate(timeout=120)[0].strip() for task in tasks]
  assert count.read_text() == 'ran\n', outs
  if outcome == 'pass':
    assert outs == ["{'table': 1}"] * 2
  else:  # both fail, each naming the log of the one run
    assert all(out.startswith('failed: ') and '/x/001-benchmark.py.log' in out
               for out in outs), outs
