"""What a new user meets first: the sample data set, the help text, a clean start-up.

Each sample's first run (write it, run the commands it prints) happens once, in a
module fixture; the tests below read what it printed and wrote.
"""
import glob
import json
import os
import re
import shlex
import sys

from absl import flags
import pytest

import cifar10_input
import helpers
import mnist_input

ROOT = helpers.ROOT
HAS_GPU_DRIVER = bool(glob.glob('/dev/nvidia[0-9]*'))


def _printed_commands(out):
  """The `  python ...` lines a --write_sample run prints, as argv without `python`."""
  return [shlex.split(line.strip())[1:] for line in out.splitlines()
          if line.startswith('  python ')]


def _assert_ok(run, *expected):
  assert run.code == 0 and all(e in run.out for e in expected), run.log()


def _error_lines(err):
  """The stderr lines a user would take for an error (TensorFlow's I-lines are not)."""
  return [line for line in err.splitlines() if not re.match(r'I\d{4} ', line) and
          (re.match(r'E\d{4} ', line) or 'cuInit' in line or 'rror' in line)]


# ---- CIFAR-10: python cifar10_input.py --write_sample=DIR, then what it prints ----------

def first_run(sample_dir, write, train_flags):
  """Writes a sample with `write` (argv), then runs the commands it prints, the trainer's
  with train_flags added (the last --max_steps given wins), CIFAR-10's export and
  classify after it, the file pattern expanded as a shell would. Returns {name: Run}."""
  runs = {'write': helpers.run(write + ['--write_sample=%s' % sample_dir])}
  _assert_ok(runs['write'])
  commands = _printed_commands(runs['write'].out)
  train, evaluate, dist = commands[:3]  # then the dist's eval
  runs['train'] = helpers.run(train + train_flags)
  runs['eval'] = helpers.run(evaluate)
  runs['dist'] = helpers.run(dist + ['--only_check_args'])
  for name, command in zip(('export', 'classify'), commands[4:]):
    runs[name] = helpers.run([path for word in command for path in _as_a_shell_expands(word)])
  return runs


def _as_a_shell_expands(word):
  """[word], or the files DIR/*.png names, sorted: without glob(), which would read a
  bracket or star in the temporary directory's own name as a pattern."""
  directory, _, pattern = word.rpartition('/')
  if pattern != '*.png':
    return [word]
  return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                if name.endswith('.png'))


@pytest.fixture(scope='module')
def cifar10_first_run(tmp_path_factory):
  """The CIFAR-10 sample written by the command line, and its printed commands run.
  Returns (sample dir, {name: Run})."""
  sample_dir = tmp_path_factory.mktemp('first_run') / 'sample'
  return sample_dir, first_run(sample_dir, ['cifar10_input.py', '--records_per_file=20'],
                               ['--max_steps=2', '--batch_size=8'])


@pytest.mark.slow
@pytest.mark.xdist_group('first_run_cifar10')
def test_write_sample_cli_writes_real_layout(cifar10_first_run):
  sample_dir, _ = cifar10_first_run
  names = sorted(os.listdir(sample_dir / 'cifar-10-batches-bin'))
  assert names == ['data_batch_%d.bin' % i for i in range(1, 6)] + ['test_batch.bin']
  for name in names:
    data = (sample_dir / 'cifar-10-batches-bin' / name).read_bytes()
    assert len(data) == 20 * 3073 and max(data[::3073]) <= 9  # 20 records, labels 0..9


@pytest.mark.slow
@pytest.mark.xdist_group('first_run_cifar10')
def test_write_sample_cli_printed_commands_run(cifar10_first_run):
  _, runs = cifar10_first_run
  train, evaluate, dist = _printed_commands(runs['write'].out)[:3]
  assert train[0] == 'multi_gpu_train.py' and evaluate[0] == 'cifar10_eval.py'
  _assert_ok(runs['train'], 'step 1, loss = ', 'model.ckpt-2')
  _assert_ok(runs['eval'], 'precision @ 1 = ', '20 test records')
  _assert_dist_line_parses(dist, train, runs['dist'])
  # The check bites: absl's --only_check_args refuses an unknown flag (once for both
  # samples' lines: it is absl's parser that is checked here, not the line).
  bogus = helpers.run(dist + ['--no_such_flag=1', '--only_check_args'])
  assert bogus.code == 1 and 'no_such_flag' in bogus.err, bogus.log()


@pytest.mark.slow
@pytest.mark.xdist_group('first_run_cifar10')
def test_write_sample_cli_printed_export_and_classify_run_on_its_class_images(
    cifar10_first_run):
  sample_dir, runs = cifar10_first_run
  export, classify = _printed_commands(runs['write'].out)[4:]
  assert export[0] == 'export_model.py' and classify[:2] == [
      'classify.py', '--model_dir=%s' % export[-1].split('=', 1)[1]]
  assert classify[2:] == [str(sample_dir / 'images' / '*.png')]
  images = _as_a_shell_expands(classify[2])
  assert images and {os.path.basename(p)[:-4] for p in images} <= set(cifar10_input.CLASS_NAMES)
  _assert_ok(runs['export'])
  _assert_ok(runs['classify'], *('%s: ' % path for path in images))
  assert len(runs['classify'].out.splitlines()) == len(images), runs['classify'].log()


@pytest.mark.slow
@pytest.mark.xdist_group('first_run_cifar10')
def test_write_sample_cli_second_sample_into_same_directory_overwrites_nothing(
    cifar10_first_run, capsys):
  sample_dir, _ = cifar10_first_run
  before = {p: os.path.getmtime(p) for p in glob.glob(str(sample_dir / '**'),
                                                      recursive=True)}
  # The command line's own parser and exit, in this process: `python cifar10_input.py`
  # runs main() (the fixture's run shows it), and sys.exit('error: ...') exits 1.
  with pytest.raises(SystemExit) as e:
    helpers.input_main(cifar10_input, '--write_sample=%s' % sample_dir)
  assert 'already exists; nothing was written' in str(e.value.code), e.value.code
  assert str(e.value.code).startswith('error: ') and capsys.readouterr().out == ''
  assert {p: os.path.getmtime(p) for p in before} == before


@pytest.mark.slow
@pytest.mark.skipif(HAS_GPU_DRIVER, reason='this machine has a GPU driver: the line is a '
                    'real error here, and is shown')
def test_start_up_without_gpu_driver_prints_no_error_line(tmp_path):
  # --synthetic: the GPU driver's lines are the subject. Real data, oneDNN on and
  # TensorFlow's other lines: tests/test_prelude.py.
  done = helpers.run(['multi_gpu_train.py', '--synthetic', '--max_steps=1', '--batch_size=8',
                      '--train_dir=%s' % tmp_path])
  assert done.code == 0 and 'step 1, loss = ' in done.out, done.log()
  # TensorFlow's own I-lines are information (oneDNN's notice speaks of round-off errors).
  assert not _error_lines(done.err), done.log()


# ---- MNIST: python mnist_input.py --write_sample=DIR, then what it prints -----------------

@pytest.fixture(scope='module')
def mnist_first_run(tmp_path_factory):
  sample_dir = tmp_path_factory.mktemp('first_run') / 'mnist'
  return sample_dir, first_run(sample_dir, ['mnist_input.py', '--train_records=500',
                                            '--test_records=100'], ['--max_steps=100'])


@pytest.mark.slow
@pytest.mark.xdist_group('first_run_mnist')
def test_mnist_write_sample_cli_commands_run(mnist_first_run):
  sample_dir, runs = mnist_first_run
  assert sorted(os.listdir(sample_dir)) == ['test.tfrecords', 'train.tfrecords']
  train, evaluate, dist, _ = _printed_commands(runs['write'].out)  # _: the dist's eval
  assert train[:2] == ['multi_gpu_train.py', '--dataset=mnist'] and evaluate[0] == 'mnist_eval.py'
  _assert_ok(runs['train'], 'step 100, loss = ')
  _assert_ok(runs['eval'], 'precision @ 1 = ', '100 test records')
  _assert_dist_line_parses(dist, train, runs['dist'])


def _assert_dist_line_parses(dist, train, checked):
  """The printed dist_train.py line: the same data, its own --train_dir, flags that parse.

  checked: the Run of the line with --only_check_args: absl parses every flag and
  exits before main, so no cluster (four TensorFlow processes) is started.
  """
  assert dist[:1] == ['dist_train.py'] and '--local_cluster=1,2' in dist, dist
  assert [a for a in dist if a.startswith('--data')] == [a for a in train
                                                         if a.startswith('--data')]
  assert [a for a in dist if a.startswith('--train_dir=')] != [
      a for a in train if a.startswith('--train_dir=')]  # it would resume the other run
  assert checked.code == 0, checked.log()


# ---- The help text ---------------------------------------------------------------------

PROGRAMS = ['multi_gpu_train.py', 'cifar10_eval.py', 'dist_train.py', 'mnist_eval.py']


@pytest.mark.xdist_group('helpshort')
@pytest.mark.parametrize('script', PROGRAMS)
def test_helpshort_shows_the_docstring_verbatim(script, helpshort):
  with open(os.path.join(ROOT, script)) as f:
    as_written = f.read().split('"""')[1]  # the source text: a '\\' line end stays one
  out = helpshort(script).out
  assert as_written.strip() in out, out  # no '%' read as a format, no lost line breaks


# One Python and one TensorFlow import for every program: each is imported in turn,
# the absl flags the project's own modules define are noted, and they are removed
# (flags and modules) before the next, which defines its own as in a fresh process.
_ACCEPTED_FLAGS = '''
import json, os, sys
from absl import flags
programs, sys.argv = sys.argv[1:], ["x"]
def ours(module):
  return os.path.exists(module.replace(".", "/") + ".py")
found = {}
def defined():
  return {f.name for m, fs in flags.FLAGS.flags_by_module_dict().items() if ours(m) for f in fs}
for program in programs:
  module = __import__(program)
  at_import = defined()
  if hasattr(module, "define_flags"):  # what running it as a program defines
    module.define_flags()
  own = defined()
  found[program] = {"project": sorted(own), "all": sorted(flags.FLAGS),
                    "at_import": sorted(at_import)}
  for name in own:
    delattr(flags.FLAGS, name)
  for module in [m for m in sys.modules if ours(m)]:
    del sys.modules[module]
print(json.dumps(found))
'''


@pytest.fixture(scope='module')
def accepted_flags():
  """{'cifar10_eval': {'project': [the flags the project defines once it is imported],
  'all': [every flag absl then accepts]}, ...}, one process for all the programs."""
  names = [script[:-3] for script in PROGRAMS]
  done = helpers.run([sys.executable, '-c', _ACCEPTED_FLAGS] + names)
  assert done.code == 0, done.log()
  return {name: {kind: set(flags) for kind, flags in found.items()}
          for name, found in json.loads(done.out).items()}


@pytest.mark.xdist_group('helpshort')
@pytest.mark.parametrize('script', ['cifar10_eval.py', 'mnist_eval.py', 'multi_gpu_train.py'])
def test_helpshort_lists_every_flag_the_program_accepts_and_no_other(script, helpshort,
                                                                   accepted_flags):
  accepted = accepted_flags[script[:-3]]['project']
  listed = helpers.listed_flags(helpshort(script).out)
  assert accepted and listed == accepted, (sorted(accepted - listed), sorted(listed - accepted))


@pytest.mark.xdist_group('helpshort')
@pytest.mark.parametrize('program', ['multi_gpu_train', 'dist_train'])
def test_importing_a_trainer_defines_no_flag_running_it_defines_them(program, accepted_flags):
  # Its define_flags(), called under __main__: a test or a second program imports its
  # functions without inheriting its flags.
  assert accepted_flags[program]['at_import'] == set()
  assert {'num_gpus', 'batch_size', 'train_dir'} <= accepted_flags[program]['project']


@pytest.mark.xdist_group('helpshort')
def test_mnist_eval_has_no_data_md5_flag(accepted_flags):
  # No module of mnist_eval's process defines it, so absl refuses it (`Unknown command
  # line flag 'data_md5'`); cifar10_eval's, run the same way, does define it.
  assert 'data_md5' not in accepted_flags['mnist_eval']['all']
  assert 'data_md5' in accepted_flags['cifar10_eval']['all']
  assert 'checkpoint_dir' in accepted_flags['mnist_eval']['all']


@pytest.mark.parametrize('module, options', [
    (cifar10_input, {'write_sample': 'directory to write', 'records_per_file': 'records in'}),
    (mnist_input, {'write_sample': 'directory to write', 'train_records': 'records in train',
                   'test_records': 'records in test'})],
    ids=['cifar10_input', 'mnist_input'])
def test_input_module_flags_each_described(module, options):
  # What --help lists for them (the programs' own --help: the test below).
  flag_values = flags.FlagValues()
  module.define_flags(flag_values)
  described = {name: flag.help for name, flag in flag_values._flags().items()}
  assert set(described) == set(options), described
  for name, words in options.items():
    assert described[name].startswith(words), (name, described)


@pytest.mark.slow
@pytest.mark.parametrize('program', ['cifar10_input.py', 'mnist_input.py'])
def test_input_program_misspelt_or_missing_flag_refused_in_one_line_exit_1(program, tmp_path):
  misspelt = helpers.run([program, '--write_sampl=%s' % tmp_path])
  assert misspelt.code == 1 and "Unknown command line flag 'write_sampl'" in misspelt.err, (
      misspelt.log())
  missing = helpers.run([program])
  assert missing.code == 1 and missing.err.splitlines() == [
      'error: --write_sample=DIR is required: the directory to write the sample into.'], (
          missing.log())
  assert os.listdir(tmp_path) == [] and misspelt.out == missing.out == ''


# A flag each program defines itself, which its --helpshort must list.
OWN_FLAG = {'multi_gpu_train.py': 'num_gpus', 'dist_train.py': 'job_name',
            'cifar10_eval.py': 'eval_dir', 'mnist_eval.py': 'eval_dir',
            'export_model.py': 'export_dir', 'classify.py': 'model_dir',
            'cifar10_input.py': 'write_sample', 'mnist_input.py': 'write_sample'}


@pytest.mark.slow
@pytest.mark.xdist_group('helpshort')
@pytest.mark.parametrize('program', sorted(OWN_FLAG))
def test_help_exits_0_and_helpshort_lists_the_programs_own_flags_shorter(program, helpshort):
  full, short = helpers.run([program, '--help']), helpshort(program)
  assert full.code == 0 and short.code == 0, (full.log(), short.log())
  listed_full, listed_short = helpers.listed_flags(full.out), helpers.listed_flags(short.out)
  assert OWN_FLAG[program] in listed_short, short.log()
  # --help: every flag the program accepts (absl's, TensorFlow's); --helpshort: its own
  assert listed_short < listed_full and len(short.out) < len(full.out), short.log()
