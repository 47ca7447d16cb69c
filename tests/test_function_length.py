"""The house: no function of the product (the programs, their packages, benchmarks/) is
longer than a screen. A longer one is told as named stages (STYLE.md, "Stages, not
sagas"); tests are left out, their parametrize tables being data.
"""
import ast
import os

import helpers

MAX_LINES = 60  # from `def` to the last line of the body, docstring included


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
