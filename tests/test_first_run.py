"""What a new user meets first: the sample data set, the help text, a clean start-up."""
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_SECS = 120


def _run(argv):
  done = subprocess.run([sys.executable] + argv, capture_output=True, text=True,
                        timeout=TIMEOUT_SECS, cwd=ROOT)
  return done.returncode, done.stdout, done.stderr


def test_write_sample_cli_writes_real_layout_and_its_commands_run(tmp_path):
  sample_dir = tmp_path / 'sample'
  code, out, err = _run(['cifar10_input.py', '--write_sample=%s' % sample_dir,
                         '--records_per_file=20'])
  assert code == 0, err
  names = sorted(os.listdir(sample_dir / 'cifar-10-batches-bin'))
  assert names == ['data_batch_%d.bin' % i for i in range(1, 6)] + ['test_batch.bin']
  for name in names:
    data = (sample_dir / 'cifar-10-batches-bin' / name).read_bytes()
    assert len(data) == 20 * 3073 and max(data[::3073]) <= 9  # 20 records, labels 0..9

  # The commands it prints run as printed (the trainer's steps cut to 2: the last
  # --max_steps given wins).
  train, evaluate, dist = [shlex.split(line.strip())[1:] for line in out.splitlines()
                           if line.startswith('  python ')]
  assert train[0] == 'multi_gpu_train.py' and evaluate[0] == 'cifar10_eval.py'
  code, out, err = _run(train + ['--max_steps=2', '--batch_size=8'])
  assert code == 0 and 'step 1, loss = ' in out and 'model.ckpt-2' in out, err
  code, out, err = _run(evaluate)
  assert code == 0 and 'precision @ 1 = ' in out and '20 test records' in out, err
  _assert_dist_line_parses(dist, train)

  # A second sample into the same directory overwrites nothing.
  before = {p: os.path.getmtime(p) for p in glob.glob(str(sample_dir / '**'),
                                                      recursive=True)}
  code, out, err = _run(['cifar10_input.py', '--write_sample=%s' % sample_dir])
  assert code == 1 and 'already exists; nothing was written' in err, err
  assert {p: os.path.getmtime(p) for p in before} == before


def test_mnist_write_sample_cli_commands_run(tmp_path):
  sample_dir = tmp_path / 'mnist'
  code, out, err = _run(['mnist_input.py', '--write_sample=%s' % sample_dir,
                         '--train_records=500', '--test_records=100'])
  assert code == 0, err
  assert sorted(os.listdir(sample_dir)) == ['test.tfrecords', 'train.tfrecords']
  train, evaluate, dist = [shlex.split(line.strip())[1:] for line in out.splitlines()
                           if line.startswith('  python ')]
  assert train[:2] == ['multi_gpu_train.py', '--dataset=mnist'] and evaluate[0] == 'mnist_eval.py'
  code, out, err = _run(train + ['--max_steps=100'])
  assert code == 0 and 'step 100, loss = ' in out, err
  code, out, err = _run(evaluate)
  assert code == 0 and 'precision @ 1 = ' in out and '100 test records' in out, err
  _assert_dist_line_parses(dist, train)


def _assert_dist_line_parses(dist, train):
  """The printed dist_train.py line: the same data, its own --train_dir, flags that parse.

  absl's --only_check_args parses every flag and exits before main, so no cluster
  (four TensorFlow processes) is started here.
  """
  assert dist[:1] == ['dist_train.py'] and '--local_cluster=1,2' in dist, dist
  assert [a for a in dist if a.startswith('--data')] == [a for a in train
                                                         if a.startswith('--data')]
  assert [a for a in dist if a.startswith('--train_dir=')] != [
      a for a in train if a.startswith('--train_dir=')]  # it would resume the other run
  code, out, err = _run(dist + ['--only_check_args'])
  assert code == 0, err
  code, out, err = _run(dist + ['--no_such_flag=1', '--only_check_args'])  # the check bites
  assert code == 1 and 'no_such_flag' in err, err


@pytest.mark.parametrize('script', ['multi_gpu_train.py', 'cifar10_eval.py', 'dist_train.py',
                                    'mnist_eval.py'])
def test_helpshort_shows_the_docstring_verbatim(script):
  with open(os.path.join(ROOT, script)) as f:
    as_written = f.read().split('"""')[1]  # the source text: a '\\' line end stays one
  _, out, _ = _run([script, '--helpshort'])  # absl's help exits 1
  assert as_written.strip() in out, out  # no '%' read as a format, no lost line breaks


def _project_flags(module):
  """Names of the absl flags the project's own modules define once `module` is imported."""
  code = ('import sys; sys.argv = ["x"]; import %s; from absl import flags; '
          'print(" ".join(f.name for m, fs in flags.FLAGS.flags_by_module_dict().items() '
          'if __import__("os").path.exists(m.split(".")[0] + ".py") for f in fs))' % module)
  code, out, err = _run(['-c', code])
  assert code == 0, err
  return set(out.split())


@pytest.mark.parametrize('script', ['cifar10_eval.py', 'mnist_eval.py', 'multi_gpu_train.py'])
def test_helpshort_lists_every_flag_the_program_accepts_and_no_other(script):
  accepted = _project_flags(script[:-3])
  _, out, _ = _run([script, '--helpshort'])
  listed = set(re.findall(r'^  --(?:\[no\])?(\w+)', out, re.M))
  assert accepted and listed == accepted, (sorted(accepted - listed), sorted(listed - accepted))


def test_mnist_eval_has_no_data_md5_flag():
  code, _, err = _run(['mnist_eval.py', '--data_md5=0123', '--run_once'])
  assert code == 1 and "Unknown command line flag 'data_md5'" in err, err


@pytest.mark.parametrize('script, options', [
    ('cifar10_input.py', {'write_sample': 'directory to write', 'records_per_file': 'records in'}),
    ('mnist_input.py', {'write_sample': 'directory to write', 'train_records': 'records in train',
                        'test_records': 'records in test'})])
def test_input_module_help_describes_every_option(script, options):
  code, out, err = _run([script, '--help'])
  assert code == 0, err
  described = dict(re.findall(r'^  --(\w+)[^\n]*?(?:\n +|  +)(\w[^\n]*)', out, re.M))
  assert set(re.findall(r'^  --(\w+)', out, re.M)) == set(options), out
  for name, words in options.items():
    assert described.get(name, '').startswith(words), (name, out)


@pytest.mark.skipif(bool(glob.glob('/dev/nvidia[0-9]*')), reason='this machine has a GPU '
                    'driver: the line is a real error here, and is shown')
def test_start_up_without_gpu_driver_prints_no_error_line(tmp_path):
  code, out, err = _run(['multi_gpu_train.py', '--synthetic', '--max_steps=1',
                         '--batch_size=8', '--train_dir=%s' % tmp_path])
  assert code == 0, err
  assert 'step 1, loss = ' in out
  # TensorFlow's own I-lines are information (oneDNN's notice speaks of round-off errors).
  assert not [line for line in err.splitlines() if not re.match(r'I\d{4} ', line) and
              (re.match(r'E\d{4} ', line) or 'cuInit' in line or 'rror' in line)], err
