"""What every data set's input module shares: its errors, the verified download,
the clean-up after a killed one, and the seeded order of samples.

cifar10_input.py and mnist_input.py use these; nothing here knows a data set.
"""
import hashlib
import http.client
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np

DOWNLOAD_TIMEOUT_SECS = 60   # a read that stalls this long stops the download


class DataError(Exception):
  """The data set is missing, damaged or unsafe; the message says what to do."""


# ---- The download ------------------------------------------------------------------

def md5_of(path):
  digest = hashlib.md5()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def part_prefix(name):
  """Prefix of the temporary file a download of `name` goes to, with this PID."""
  return '.%s.%d.' % (name, os.getpid())


def download(url, path, md5, expected_bytes=None, offline_hint='', mismatch_hint=''):
  """Streams url to a temporary file beside `path`, verifies it, renames it to path.

  On any failure the temporary file is removed and `path` is not created.

  Args:
    url: str.
    path: str, where the verified file goes.
    md5: str, its expected md5.
    expected_bytes: int or None, its expected size.
    offline_hint: str, a sentence for the message when the download fails.
    mismatch_hint: str, a sentence for the message when size or md5 differ.

  Raises:
    DataError: naming the URL, what went wrong and what to do.
  """
  name, directory = os.path.basename(path), os.path.dirname(path)
  try:
    fd, tmp_path = tempfile.mkstemp(prefix=part_prefix(name), suffix='.part', dir=directory)
  except OSError as e:
    raise DataError('cannot write into --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (directory, e.strerror)) from None
  try:
    with os.fdopen(fd, 'wb') as out:
      received, digest, length = _stream(url, out, name, expected_bytes)
    if length and received != int(length):
      raise DataError('download of %s stopped after %d of %s bytes; run again to '
                      'retry.' % (url, received, length))
    if expected_bytes and received != expected_bytes:
      raise DataError('%s gave %d bytes; the official file has %d. Check --data_url. %s'
                      % (url, received, expected_bytes, mismatch_hint))
    if digest != md5:
      raise DataError('%s has md5 %s; expected %s. The copy is damaged or different: '
                      'check --data_url. %s' % (url, digest, md5, mismatch_hint))
    os.replace(tmp_path, path)
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    os.remove(tmp_path)
    raise DataError('cannot download %s: %s. Check the network, point --data_url at '
                    'another copy, or put %s in %s yourself. %s'
                    % (url, getattr(e, 'reason', e), name, directory, offline_hint)) from e
  except BaseException:
    os.remove(tmp_path)
    raise
  print('Downloaded %s, %d bytes, md5 %s' % (path, received, md5))


def _stream(url, out, name, expected_bytes):
  """Copies url into the open file `out`, showing progress.

  Returns:
    (bytes received, their md5, the Content-Length header or None).
  """
  digest, received, shown = hashlib.md5(), 0, -1
  with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECS) as response:
    length = response.headers.get('Content-Length')
    total = int(length) if length else expected_bytes
    for chunk in iter(lambda: response.read(1 << 16), b''):
      out.write(chunk)
      digest.update(chunk)
      received += len(chunk)
      if total and int(1000 * received / total) != shown:
        shown = int(1000 * received / total)
        sys.stdout.write('\r>> Downloading %s %.1f%% (%.1f of %.1f MB)' % (
            name, shown / 10.0, received / 1e6, total / 1e6))
        sys.stdout.flush()
  sys.stdout.write('\n')
  return received, digest.hexdigest(), length


def make_data_dir(data_dir):
  """Creates data_dir if missing; returns True when it did (for remove_if_empty)."""
  created = not os.path.isdir(data_dir)
  try:
    os.makedirs(data_dir, exist_ok=True)
  except OSError as e:
    raise DataError('cannot create --data_dir %s: %s. Point --data_dir at a directory '
                    'you can write to.' % (data_dir, e.strerror)) from None
  return created


def remove_if_empty(data_dir, created):
  """After a failed download: no empty directory left behind that this run created."""
  if created and os.path.isdir(data_dir) and not os.listdir(data_dir):
    os.rmdir(data_dir)


# ---- What killed runs leave behind -----------------------------------------------

def remove_leftovers(data_dir, patterns):
  """Removes temporary files and directories of killed downloads and conversions.

  Args:
    data_dir: str.
    patterns: regular expressions of this program's own temporary names, each
      with the PID that made the name as group 1; only dead processes' are removed.
  """
  for entry in os.listdir(data_dir):
    found = next(filter(None, (re.match(p, entry) for p in patterns)), None)
    if not found or _alive(int(found.group(1))):
      continue
    path = os.path.join(data_dir, entry)
    print('Removing %s, left by an interrupted download or extraction (process %s).'
          % (path, found.group(1)))
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process
  return True


# ---- The seeded order of samples -----------------------------------------------------

class SeededPlan:
  """Which record, with which random values, is sample i of a seeded run.

  Sample i is position i mod N of epoch i // N (N records). Each epoch's order of
  the records, and each position's random values, are drawn from (seed, epoch)
  alone: nothing depends on the batch size, the towers or where a run resumed.
  """

  def __init__(self, num_records, seed, draw=None):
    """draw: callable (numpy Generator, n) -> tuple of arrays with n rows, or None."""
    self._num_records, self._seed, self._draw = num_records, seed, draw
    self._epoch, self._plan = None, None

  def _epoch_plan(self, epoch):
    if epoch != self._epoch:
      n, rng = self._num_records, np.random.default_rng([self._seed, epoch])
      order = rng.permutation(n)  # first, then the draws: the same stream every time
      self._epoch, self._plan = epoch, (order, self._draw(rng, n) if self._draw else ())
    return self._plan

  def samples(self, first, count):
    """Record indices int64 [count] and the draws of samples first .. first + count - 1."""
    samples = np.arange(first, first + count)
    order, draws = np.empty(count, np.int64), None
    for epoch in np.unique(samples // self._num_records):
      here = samples // self._num_records == epoch
      position = samples[here] % self._num_records
      epoch_order, epoch_draws = self._epoch_plan(epoch)
      order[here] = epoch_order[position]
      if draws is None:
        draws = [np.empty((count,) + v.shape[1:], v.dtype) for v in epoch_draws]
      for out, values in zip(draws, epoch_draws):
        out[here] = values[position]
    return order, tuple(draws)
