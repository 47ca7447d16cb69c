"""Shared test setup: the repo root on sys.path, quiet TensorFlow, the `slow` marker."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'tests'))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def pytest_configure(config):
  config.addinivalue_line('markers', 'slow: takes more than ~20 s; CI runs it too')
