"""The house: no function of the product (the programs, their packages, benchmarks/) is
longer than a screen. A longer one is told as named stages (STYLE.md, "Stages, not
sagas"); tests are left out, their parametrize tables being data. The shared packages
import no program or data set, which the programs hand in (STYLE.md, "Where things
live"); no test file is longer than MAX_TEST_FILE_LINES.
"""
import ast
import os

import helpers

MAX_LINES = 60  # from `def` to the last line of the body, docstring included
MAX_TEST_FILE_LINES = 600  # a longer tests/test_<module>.py splits by aspect
# What of the project each package may import, by top-level name: training/ is the
# machinery every program shares, distributed/ what only dist_train.py needs, on top of it.
PACKAGE_IMPORTS = {'training': {'training'}, 'distributed': {'training', 'distributed'}}


def product_files():
  """Every .py file of the project outside tests/, relative to the root."""
  for directory, subdirectories, names in os.walk(helpers.ROOT):
    subdirectories[:] = sorted(d for d in subdirectories
                               if d not in ('.git', 'tests', '__pycache__') and
                               not d.startswith('.'))
    for name in sorted(names):
      if name.endswith('.py'):
        yield os.path.relpath(os.path.join(directory, name), helpers.ROOT)


def long_functions(path, max_lines=MAX_LINES):
  """['file:line name (N lines)', ...] for each function of path longer than max_lines."""
  with open(os.path.join(helpers.ROOT, path)) as f:
    tree = ast.parse(f.read(), path)
  return ['%s:%d %s (%d lines)' % (path, node.lineno, node.name,
                                   node.end_lineno - node.lineno + 1)
          for node in ast.walk(tree)
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
          node.end_lineno - node.lineno + 1 > max_lines]


def test_product_functions_at_most_60_lines_each():
  files = list(product_files())
  assert {'multi_gpu_train.py', 'distributed/cluster_env.py', 'training/input_data.py',
          'benchmarks/table.py'} <= set(files), files
  too_long = [found for path in files for found in long_functions(path)]
  assert not too_long, 'split each into named stages: %s' % '; '.join(too_long)


def test_long_functions_counts_def_to_last_line(tmp_path, monkeypatch):
  monkeypatch.setattr(helpers, 'ROOT', str(tmp_path))
  body = ''.join('  x = %d\n' % i for i in range(59))
  (tmp_path / 'a.py').write_text('def fits():\n%s\n\ndef over():\n%s  return x\n' % (body, body))
  assert long_functions('a.py') == ['a.py:63 over (61 lines)']


def top_level_modules():
  """The project's top-level module names: each .py file at the root, each package."""
  return {name[:-3] if name.endswith('.py') else name for name in os.listdir(helpers.ROOT)
          if name.endswith('.py') or
          os.path.isfile(os.path.join(helpers.ROOT, name, '__init__.py'))}


def project_imports(path, project):
  """[(line, top-level name)] of each import in path, in a function too, of one of project."""
  with open(os.path.join(helpers.ROOT, path)) as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:  # not `from . import x`
      names = [node.module]
    else:
      continue
    found += [(node.lineno, name.split('.')[0]) for name in names
              if name.split('.')[0] in project]
  return found


def test_packages_import_no_program_or_data_set():
  project = top_level_modules()
  assert {'data_sets', 'cifar10', 'cifar10_input', 'multi_gpu_train', 'training',
          'distributed'} <= project, project
  files = [path for path in product_files() if path.split(os.sep)[0] in PACKAGE_IMPORTS]
  assert {'training/evaluation.py', 'distributed/evaluator.py'} <= set(files), files
  wrong = ['%s:%d imports %s' % (path, line, name) for path in files
           for line, name in project_imports(path, project)
           if name not in PACKAGE_IMPORTS[path.split(os.sep)[0]]]
  assert not wrong, 'let the program hand it in: %s' % '; '.join(wrong)


def test_project_imports_finds_each_form_in_a_function_too(tmp_path, monkeypatch):
  monkeypatch.setattr(helpers, 'ROOT', str(tmp_path))
  (tmp_path / 'a.py').write_text('import os, data_sets\nfrom cifar10 import model\n'
                                 'from . import data_sets\n\ndef f():\n'
                                 '  import mnist_input as m\n  from training.x import y\n')
  assert project_imports('a.py', {'data_sets', 'cifar10', 'mnist_input', 'training'}) == [
      (1, 'data_sets'), (2, 'cifar10'), (6, 'mnist_input'), (7, 'training')]


def test_test_files_at_most_600_lines_each():
  tests = os.path.join(helpers.ROOT, 'tests')
  lengths = {}
  for name in sorted(os.listdir(tests)):
    if name.startswith('test_') and name.endswith('.py'):
      with open(os.path.join(tests, name)) as f:
        lengths[name] = len(f.readlines())
  assert 'test_multi_gpu_train.py' in lengths, sorted(lengths)
  too_long = ['%s (%d lines)' % (name, count) for name, count in lengths.items()
              if count > MAX_TEST_FILE_LINES]
  assert not too_long, ('split each by aspect, tests/test_<module>_<aspect>.py: %s'
                        % '; '.join(too_long))
