"""Shared test setup: the repo root on sys.path, quiet TensorFlow, the `slow` marker,
and small sample data sets written by the product's own sample writer."""
import collections
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
