"""The lines the programs print: their patterns, and readers of a run's lines."""
import collections
import re

_STAMP = r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}'
_LOSS = (_STAMP + r': step (\d+), loss = \d+\.\d\d \(\d+\.\d examples/sec; '
         r'\d+\.\d{3} sec/batch\)')
LOSS_LINE = re.compile('^' + _LOSS + '$')                          # multi_gpu_train.py
WORKER_LOSS_LINE = re.compile('^' + _LOSS + r' \[worker (\d+), local step (\d+)\]$')
DONE_LINE = re.compile(r'^worker (\d+) done: (\d+) local steps, global step (\d+)$')
SAVED_LINE = re.compile(r'^Saved checkpoint .*model\.ckpt-(\d+)$')
RESUMING_LINE = re.compile(r'^Resuming from .*model\.ckpt-(\d+) at step (\d+)$')
STOPPED_LINE = re.compile(r'^Stopped by (Ctrl-C|SIGTERM) at step (\d+); rerun the same '
                          r'command to resume\.$')
SKIP_LINE = re.compile(r'^\S+ \S+: step (\d+) skipped: gradients overflowed at loss scale '
                       r'(\S+); scale now (\S+)$')
PRECISION_LINE = re.compile(
    '^' + _STAMP + r': precision @ 1 = (\d\.\d{3}) \(global step (\d+), (\d+) test records, '
    r'(moving averages|raw weights), cross-entropy (\S+)\)$')
TASK_PREFIX = re.compile(r'^\[(ps\d+|worker\d+)\] (.*)$')         # --local_cluster's relay
TRAINING_FROM = re.compile(r'^worker (\d+): training from global step (\d+)')


def matches(pattern, lines):
  """The match objects of pattern over lines, in order."""
  return [m for m in map(pattern.match, lines) if m]


def steps(pattern, lines):
  """The step numbers (group 1) of the lines that match pattern."""
  return [int(m.group(1)) for m in matches(pattern, lines)]


def examples_per_sec(pattern, lines):
  """The examples/sec of the loss lines (LOSS_LINE, WORKER_LOSS_LINE) among lines."""
  return [float(re.search(r'\((\d+\.\d) examples/sec;', m.group(0)).group(1))
          for m in matches(pattern, lines)]


def listed_flags(help_text):
  """The flag names a program's --help or --helpshort output lists."""
  return set(re.findall(r'^  --(?:\[no\])?(\w+)', help_text, re.M))


def sample_commands(printed):
  """The command lines a sample writer's hint prints (`  python prog.py --flag=value ...`),
  as (program, {flag: value}) in order."""
  commands = []
  for line in printed.splitlines():
    words = line.split()
    if line.startswith('  python ') and len(words) > 1:
      commands.append((words[1], dict(w[2:].split('=', 1) for w in words[2:]
                                      if w.startswith('--') and '=' in w)))
  return commands


def assert_each_training_evaluated_into_its_own_eval_dir(printed, eval_program):
  """Every trainer command printed is followed by an eval_program command that reads its
  --train_dir, and no two evaluations write to one --eval_dir."""
  commands = sample_commands(printed)
  train_dirs = [f['train_dir'] for prog, f in commands  # not export_model.py's, which reads one
                if prog in ('multi_gpu_train.py', 'dist_train.py')]
  evals = [f for prog, f in commands if prog == eval_program]
  assert len(train_dirs) == 2, printed
  assert [f.get('checkpoint_dir') for f in evals] == train_dirs, printed
  eval_dirs = [f.get('eval_dir') for f in evals]
  assert None not in eval_dirs and len(set(eval_dirs)) == len(eval_dirs), printed


def by_task(lines):
  """{'ps0': [its lines], 'worker0': [...]} from a --local_cluster launcher's output."""
  found = collections.defaultdict(list)
  for m in matches(TASK_PREFIX, lines):
    found[m.group(1)].append(m.group(2))
  return dict(found)


def assert_each_refused_in_one_line(runs, refused):
  """Each run (a Task) of a program given refused[i] = (flags, pattern) exits 1 with
  one error line matching pattern, no traceback and nothing on stdout."""
  for run, (flags, expected) in zip(runs, refused):
    assert run.finish() == 1, (flags, run.log())
    errors = [line for line in run.err_lines if line.startswith('error')]
    assert len(errors) == 1 and re.search(expected, errors[0]), (flags, run.log())
    assert 'Traceback' not in run.err and run.out == '', (flags, run.log())
