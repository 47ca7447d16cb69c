"""deploy/: the TFJob manifest and the Slurm script name only flags the programs take.

PyYAML is not a dependency: a small reader takes each replica's `command:` list
from the manifest, which is written as plain block lists for that reason.
"""
import os
import re

import pytest

import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TFJOB = os.path.join(ROOT, 'deploy', 'kubernetes', 'tfjob.yaml')
SBATCH = os.path.join(ROOT, 'deploy', 'slurm', 'train.sbatch')
DOCKERFILE = os.path.join(ROOT, 'deploy', 'kubernetes', 'Dockerfile')
FLAG = re.compile(r'^--(?:no)?([a-z_0-9]+)(?:=|$)')


def replica_specs(text):
  """{'PS': {'command': [...], 'restartPolicy': 'ExitCode', 'container': 'tensorflow'}, ...}"""
  specs, current, in_command, command_indent = {}, None, False, 0
  for line in text.splitlines():
    stripped = line.split(' #')[0].rstrip() if not line.lstrip().startswith('#') else ''
    if not stripped:
      continue
    indent = len(stripped) - len(stripped.lstrip())
    replica = re.match(r'^    (PS|Chief|Master|Worker|Evaluator):$', stripped)
    if replica:
      current = specs.setdefault(replica.group(1), {'command': []})
      in_command = False
      continue
    if current is None:
      continue
    if in_command:
      item = re.match(r'^\s*- (.+)$', stripped)
      if item and indent >= command_indent:
        current['command'].append(item.group(1).strip('"\''))
        continue
      in_command = False
    key = re.match(r'^\s*(?:- )?(\w+): *(.*)$', stripped)
    if key and key.group(1) == 'command':
      in_command, command_indent = True, indent
    elif key and key.group(1) == 'restartPolicy':
      current['restartPolicy'] = key.group(2)
    elif key and key.group(1) == 'name' and stripped.lstrip().startswith('- name:'):
      current.setdefault('container', key.group(2))
  return specs


def sbatch_command(text):
  """The srun line's argv, continuation lines joined, from `python` on."""
  joined = re.sub(r'\\\n', ' ', text)
  line = next(l for l in joined.splitlines() if l.strip().startswith('srun '))
  words = line.split()
  return words[words.index('python'):]


def flags_of(argv):
  return [FLAG.match(word).group(1) for word in argv if word.startswith('--')]


def unknown_flags(argv, known_flags):
  """The flags argv names that its program (argv[1]) does not take, in order."""
  return [flag for flag in flags_of(argv) if flag not in known_flags[argv[1]]]


@pytest.fixture(scope='module')
def known_flags(helpshort):
  """{'dist_train.py': the flags it lists, 'cifar10_eval.py': the flags it lists}.

  Each program's own --helpshort (tests/test_first_run.py checks that it lists every
  flag the program accepts and no other), not the flags this process happens to hold.
  """
  return {program: helpers.listed_flags(helpshort(program).out)
          for program in ('dist_train.py', 'cifar10_eval.py')}


def test_tfjob_manifest_four_replicas_exit_code_container_tensorflow():
  with open(TFJOB) as f:
    text = f.read()
  assert re.search(r'^apiVersion: kubeflow.org/v1\nkind: TFJob$', text, re.M)
  specs = replica_specs(text)
  assert sorted(specs) == ['Chief', 'Evaluator', 'PS', 'Worker']
  for name, spec in specs.items():
    assert spec['restartPolicy'] == 'ExitCode', name
    assert spec['container'] == 'tensorflow', name  # the operator's TF_CONFIG goes there
  # TF_CONFIG gives each its part, the evaluator's included.
  assert [specs[n]['command'][:3] for n in ('PS', 'Chief', 'Worker', 'Evaluator')] == [
      ['python', 'dist_train.py', '--cluster=tf_config']] * 4
  for name in ('Chief', 'Worker', 'Evaluator'):  # the chief writes, the evaluator reads
    assert '--train_dir=/shared/train' in specs[name]['command']
  # The evaluator ends at the chief's last step.
  assert ([c for c in specs['Chief']['command'] if c.startswith('--max_steps=')] ==
          [c for c in specs['Evaluator']['command'] if c.startswith('--max_steps=')])


@pytest.mark.xdist_group('helpshort')
def test_tfjob_manifest_names_only_flags_the_programs_take(known_flags):
  with open(TFJOB) as f:
    specs = replica_specs(f.read())
  for name, spec in specs.items():
    assert flags_of(spec['command']), name
    assert unknown_flags(spec['command'], known_flags) == [], name


@pytest.mark.xdist_group('helpshort')
def test_sbatch_script_one_srun_step_names_only_dist_train_flags(known_flags):
  with open(SBATCH) as f:
    text = f.read()
  assert len(re.findall(r'^\s*srun ', text, re.M)) == 1
  argv = sbatch_command(text)
  assert argv[:4] == ['python', 'dist_train.py', '--cluster=slurm', '--num_ps=1']
  assert unknown_flags(argv, known_flags) == []


@pytest.mark.xdist_group('helpshort')
def test_flag_reader_catches_an_unknown_flag(known_flags):
  # The checks above would pass on anything if the reader found no flags.
  argv = sbatch_command('srun --label \\\n  python dist_train.py --num_gpu=4 --train_dir=/x\n')
  assert flags_of(argv) == ['num_gpu', 'train_dir']
  assert 'num_gpu' not in known_flags['dist_train.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']
  specs = replica_specs('    PS:\n      restartPolicy: ExitCode\n      template:\n'
                        '        spec:\n          containers:\n            - name: tensorflow\n'
                        '              command:\n                - python\n'
                        '                - dist_train.py\n                - --bogus=1\n'
                        '              volumeMounts:\n                - name: shared\n')
  assert specs == {'PS': {'command': ['python', 'dist_train.py', '--bogus=1'],
                          'restartPolicy': 'ExitCode', 'container': 'tensorflow'}}


@pytest.mark.xdist_group('helpshort')
def test_flag_check_refuses_a_flag_only_the_other_program_takes(known_flags):
  # The evaluator's --checkpoint_dir given to dist_train.py, the trainer's --num_gpus
  # given to cifar10_eval.py: each is a real flag, of the wrong program.
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert unknown_flags(['python', 'dist_train.py', '--cluster=tf_config',
                        '--checkpoint_dir=/shared/train'], known_flags) == ['checkpoint_dir']
  assert unknown_flags(['python', 'cifar10_eval.py', '--run_once', '--num_gpus=2'],
                       known_flags) == ['num_gpus']


def test_dockerfile_python_311_slim_installs_requirements_then_copies_repo():
  with open(DOCKERFILE) as f:
    lines = [l for l in f.read().splitlines() if l and not l.startswith('#')]
  assert lines[0] == 'FROM python:3.11-slim'
  steps = [l.split()[0] + ' ' + l.split()[1] for l in lines]
  assert steps.index('COPY requirements.txt') < steps.index('RUN pip') < steps.index('COPY .')
