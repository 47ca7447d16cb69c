"""Shared test setup: the repo root on sys.path, quiet TensorFlow, the `slow` marker,
and small sample data sets written by the product's own sample writer."""
import collections
import contextlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def pytest_configure(config):
  config.addinivalue_line('markers', 'slow: takes more than ~20 s; CI runs it too')


class Sample(collections.namedtuple('Sample', ['dir', 'md5'])):
  """A data set from cifar10_input.write_sample: its directory and its archive's md5."""

  @property
  def flags(self):
    return ['--data_dir=%s' % self.dir, '--data_md5=%s' % self.md5]


def write_sample(path, records_per_file):
  import cifar10_input  # imports TensorFlow: only once a test asks for data
  return Sample(str(path), cifar10_input.write_sample(str(path), records_per_file))


@contextlib.contextmanager
def umask(mask):
  """Runs the block under this umask, then restores the one before."""
  before = os.umask(mask)
  try:
    yield
  finally:
    os.umask(before)


def modes(root):
  """{path relative to root: permission bits} of every file and directory under root."""
  found = {}
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(directory, name)
      found[os.path.relpath(path, root)] = os.stat(path).st_mode & 0o777
  return found
