"""Archives for the download tests: well-formed ones and hostile ones.

Data sets themselves come from the product: cifar10_input.write_sample().
"""
import hashlib
import io
import tarfile

import numpy as np

import cifar10_input


def make_tarball(path, members):
  """Writes a .tar.gz of (name, bytes or tarfile type) pairs; returns its md5.

  members: list of (name, data) where data is bytes for a regular file, or a
  tarfile.TarInfo (for links, directories and other special members).
  """
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    for name, data in members:
      if isinstance(data, tarfile.TarInfo):
        tar.addfile(data)
      else:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  with open(path, 'wb') as f:
    f.write(buf.getvalue())
  return hashlib.md5(buf.getvalue()).hexdigest()


def dataset_members(records_per_file=20, seed=0):
  """The (name, bytes) members of a well-formed small CIFAR-10 archive."""
  rng = np.random.default_rng(seed)
  members = [(cifar10_input.BATCHES_DIR + '/' + name,
              cifar10_input.make_records(rng.integers(0, 10, records_per_file),
                                         rng).tobytes())
             for name in cifar10_input.TRAIN_FILES + cifar10_input.TEST_FILES]
  members.append((cifar10_input.BATCHES_DIR + '/batches.meta.txt', b'airplane\nautomobile\n'))
  return members


def read_labels(path):
  """The label bytes of a .bin file: uint8 [records]."""
  return np.fromfile(path, np.uint8).reshape(-1, cifar10_input.RECORD_BYTES)[:, 0]
