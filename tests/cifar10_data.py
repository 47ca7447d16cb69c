"""Small CIFAR-10 data sets in the real binary layout, made for tests and benchmarks.

Each record is 1 label byte + 3072 pixel bytes (red plane, green plane, blue
plane, each 32x32 row-major), exactly as the official files.
"""
import hashlib
import io
import os
import tarfile

import numpy as np

RECORD_BYTES = 3073
BATCHES_DIR = 'cifar-10-batches-bin'
FILES = ['data_batch_%d.bin' % i for i in range(1, 6)] + ['test_batch.bin']

# Class k is a distinct colour in one of ten quadrant/stripe layouts, plus noise:
# learnable in a few hundred steps, unlike random pixels.
_COLOURS = np.array([[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200],
                     [245, 130, 48], [145, 30, 180], [70, 240, 240], [240, 50, 230],
                     [210, 245, 60], [250, 190, 190]], np.float32)


def make_records(labels, rng, learnable=True):
  """uint8 [n, 3073]: label byte then CHW pixels; pixels carry the label if learnable."""
  labels = np.asarray(labels, np.uint8)
  n = len(labels)
  if learnable:
    pixels = np.empty((n, 32, 32, 3), np.float32)
    rows = np.arange(32)[:, None] * np.ones((1, 32))
    for i, label in enumerate(labels):
      mask = ((rows + label * 3) // (4 + label % 3)) % 2  # stripe width and phase per class
      pixels[i] = mask[..., None] * _COLOURS[label] + (1 - mask[..., None]) * 40.0
    pixels += rng.normal(0, 20, pixels.shape)
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
  else:
    pixels = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  chw = pixels.transpose(0, 3, 1, 2).reshape(n, 3072)
  return np.concatenate([labels[:, None], chw], axis=1)


def write_dataset(data_dir, records_per_file=100, seed=0, learnable=True):
  """Writes data_dir/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin.

  Returns:
    dict file name -> (labels uint8 [n], images uint8 [n, 32, 32, 3] in HWC).
  """
  rng = np.random.default_rng(seed)
  out_dir = os.path.join(data_dir, BATCHES_DIR)
  os.makedirs(out_dir, exist_ok=True)
  contents = {}
  for name in FILES:
    labels = rng.integers(0, 10, records_per_file)
    records = make_records(labels, rng, learnable)
    with open(os.path.join(out_dir, name), 'wb') as f:
      f.write(records.tobytes())
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    contents[name] = (records[:, 0], images)
  return contents


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
  members = [(BATCHES_DIR + '/' + name,
              make_records(rng.integers(0, 10, records_per_file), rng).tobytes())
             for name in FILES]
  members.append((BATCHES_DIR + '/batches.meta.txt', b'airplane\nautomobile\n'))
  return members
