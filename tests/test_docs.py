"""README.md and docs/: a newcomer's first screen, sizes a person reads through, links
that land, and none of the statements issue 48 found untrue.
"""
import glob
import os
import re

import helpers

README_MAX_BYTES = 20000
DOCS_MAX_BYTES = 100000     # docs/*.md, all together
FIRST_SCREEN_LINES = 60
TRAIN_COMMAND = ('python -m pip install -r requirements.txt && '
                 'python multi_gpu_train.py --num_gpus=2')
TEST_COMMAND = 'python -m pip install -r requirements-test.txt && python -m pytest tests'


def pages():
  """{path relative to the root: text} for README.md and every docs/*.md."""
  paths = ['README.md'] + sorted(
      os.path.relpath(p, helpers.ROOT)
      for p in glob.glob(os.path.join(helpers.ROOT, 'docs', '*.md')))
  texts = {}
  for path in paths:
    with open(os.path.join(helpers.ROOT, path), encoding='utf-8') as f:
      texts[path] = f.read()
  return texts


def paragraphs(text):
  """The text's paragraphs (and lists, and code blocks), whitespace made single spaces."""
  return [' '.join(block.split()) for block in re.split(r'\n\s*\n', text)]


def code_blocks(text):
  """Each indented code block as its list of lines, indentation removed."""
  blocks, block, previous_blank = [], None, True
  for line in text.splitlines() + ['']:
    if line.startswith('    ') and (block is not None or previous_blank):
      block = (block or []) + [line[4:]]
    elif block is not None and not line.strip():
      blocks.append(block)
      block = None
    previous_blank = not line.strip()
  return blocks


def slug(heading):
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(text):
  """The anchors of a page's headings, as GitHub makes them."""
  found = set()
  for heading in re.findall(r'(?m)^#{1,6} (.+)$', text):
    name, n = slug(heading), 1
    while name in found:  # a repeated heading gets -1, -2, ...
      name, n = '%s-%d' % (slug(heading), n), n + 1
    found.add(name)
  return found


def test_readme_size_at_most_20000_bytes():
  size = os.path.getsize(os.path.join(helpers.ROOT, 'README.md'))
  assert size <= README_MAX_BYTES, 'README.md is %d bytes; cut it to %d' % (
      size, README_MAX_BYTES)


def test_docs_size_all_pages_together_at_most_100000_bytes():
  sizes = {path: len(text.encode('utf-8')) for path, text in pages().items()
           if path.startswith('docs/')}
  assert len(sizes) >= 6, sizes
  assert sum(sizes.values()) <= DOCS_MAX_BYTES, sizes


def test_readme_first_screen_holds_both_commands_offline_way_and_where_next():
  first = '\n'.join(pages()['README.md'].splitlines()[:FIRST_SCREEN_LINES])
  commands = [line.strip() for line in first.splitlines() if line.startswith('    ')]
  assert TRAIN_COMMAND in commands, first
  assert TEST_COMMAND in commands, first
  assert 'python -m pytest tests -m "not slow"' in first  # the quick loop, and its time
  assert any(c.startswith('python cifar10_input.py --write_sample=') for c in commands)
  assert '## Where to go next' in pages()['README.md']


def test_docs_quick_loop_about_140_s_absent():
  for path, text in pages().items():
    assert 'about 140 s' not in ' '.join(text.split()), path


def test_docs_start_up_example_begins_with_the_data_sets_line_not_run_record():
  examples = []
  for path, text in pages().items():
    for block in code_blocks(text):
      output = block[1:] if block[0].startswith('$ ') else block
      assert not output[0].startswith('Run record:'), (path, block[:2])
      if block[0].startswith('$ python multi_gpu_train.py'):
        examples.append((path, output))
  assert examples, 'no start-up example ($ python multi_gpu_train.py ...) left'
  for path, output in examples:
    assert output[0].startswith('CIFAR-10 copy with md5 '), (path, output[0])
    assert output[1].startswith('Run record: '), (path, output[1])


def test_docs_scalars_page_never_said_to_hold_activations_variables_or_gradients():
  # Each layer's activations, every variable and gradient are histograms; only
  # <layer>/sparsity is a scalar (training/summaries.py).
  for path, text in pages().items():
    for paragraph in paragraphs(text):
      if 'Scalars' in paragraph and 'activations' in paragraph:
        assert 'Histograms' in paragraph, (path, paragraph)
  with open(os.path.join(helpers.ROOT, 'training', 'summaries.py')) as f:
    summaries = f.read()
  assert "scalars[layer + '/sparsity']" in summaries
  assert "histograms[layer + '/activations']" in summaries
  assert '`<layer>/sparsity`' in pages()['docs/trainer.md']


def test_docs_relative_links_land_on_a_file_and_a_heading():
  texts = pages()
  for path, text in texts.items():
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
      if re.match(r'[a-z]+:', target):
        continue
      file_part, _, anchor = target.partition('#')
      linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)
                                if file_part else path)
      assert os.path.exists(os.path.join(helpers.ROOT, linked)), (path, target)
      if anchor:
        assert anchor in anchors(texts[linked]), (path, target, sorted(
            anchors(texts[linked])))


def test_slug_matches_githubs_anchors():
  assert slug('Mixed precision: `--use_fp16`') == 'mixed-precision---use_fp16'
  assert slug('bfloat16 against the `model.fit` peer') == 'bfloat16-against-the-modelfit-peer'
  assert slug('Kubernetes and Slurm: the cluster from the environment') == (
      'kubernetes-and-slurm-the-cluster-from-the-environment')
