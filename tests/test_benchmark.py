"""Smoke test of benchmarks/benchmark.py: a --quick run end to end, in a subprocess."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(ROOT, 'benchmarks', 'benchmark.py')
TIMEOUT_SECS = 600        # --quick takes about 30 s on 2 idle cores
FLOPS_PER_EXAMPLE = 105295104  # 3 x forward 36,941,568 - conv1's forward 5,529,600


@pytest.mark.slow
def test_benchmark_quick_run_writes_positive_numbers(tmp_path):
  json_path = tmp_path / 'benchmark.json'
  proc = subprocess.run([sys.executable, BENCHMARK, '--quick', '--json', str(json_path)],
                        capture_output=True, text=True, timeout=TIMEOUT_SECS,
                        cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert 'ours/peer' in proc.stdout  # the table was printed
  table = json.loads(json_path.read_text())['table']

  assert table['flops_per_example']['total'] == FLOPS_PER_EXAMPLE
  assert [l['name'] for l in table['flops_per_example']['layers']] == [
      'conv1', 'conv2', 'local3', 'local4', 'softmax_linear']
  assert table['matmul']['gflops'] > 0
  assert table['pipeline']['examples_per_sec'] > 0

  row = table['towers']['1']
  assert row['global_batch'] == 16
  for kind in ('real', 'synthetic', 'peer'):
    stats = row[kind]
    assert 0 < stats['min'] <= stats['examples_per_sec'] <= stats['max'], (kind, stats)
    assert stats['peak_mb'] > 0 and stats['steps'] == 3, (kind, stats)
  for key in ('real_over_synthetic', 'ours_over_peer', 'achieved_gflops',
              'fraction_of_matmul'):
    assert row[key] > 0, key

  # The peer is the same model: a fresh one's loss is ln(10) + the same weight decay.
  first_loss = {r['label']: r['first_loss'] for r in table['runs'] if 'first_loss' in r}
  assert first_loss['peer N=1 synthetic'] == pytest.approx(
      first_loss['ours N=1 synthetic'], abs=0.05)
  assert first_loss['ours N=1 synthetic'] == pytest.approx(4.68, abs=0.05)
