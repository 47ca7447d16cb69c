"""cifar10_input: the record reader, the file checks, the pipelines and the download."""
import hashlib
import io
import itertools
import glob
import os
import re
import shutil
import subprocess
import tarfile
import time

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input
import helpers
from training import input_data


def _run(tensors):
  with tf.compat.v1.Session() as sess:
    return sess.run(tensors)


def _read_labels(path):
  """The label bytes of a .bin file: uint8 [records]."""
  return np.fromfile(path, np.uint8).reshape(-1, cifar10_input.RECORD_BYTES)[:, 0]


def test_read_record_decodes_label_and_pixels(tmp_path):
  # Two hand-written records: label, then the R plane, G plane, B plane (32x32 each).
  r = np.arange(1024, dtype=np.uint32).reshape(32, 32) % 251
  first = bytes([7]) + bytes((r % 256).astype(np.uint8)) + bytes([1] * 1024) + bytes([2] * 1024)
  second = bytes([3]) + bytes(range(256)) * 12
  path = tmp_path / 'two.bin'
  path.write_bytes(first + second)
  with tf.Graph().as_default():
    dataset = tf.data.FixedLengthRecordDataset([str(path)], cifar10_input.RECORD_BYTES)
    it = tf.compat.v1.data.make_one_shot_iterator(dataset.map(cifar10_input.decode_record))
    item = it.get_next()
    with tf.compat.v1.Session() as sess:
      (image1, label1), (image2, label2) = sess.run(item), sess.run(item)
  assert label1 == 7 and label2 == 3
  assert image1.shape == (32, 32, 3) and image1.dtype == np.uint8
  np.testing.assert_array_equal(image1[:, :, 0], r % 256)  # HWC: channel last
  assert (image1[:, :, 1] == 1).all() and (image1[:, :, 2] == 2).all()
  expected = np.frombuffer(second[1:], np.uint8).reshape(3, 32, 32).transpose(1, 2, 0)
  np.testing.assert_array_equal(image2, expected)
  assert image2[0, 1, 0] == 1 and image2[0, 0, 1] == 0 and image2[8, 0, 1] == 0


def test_eval_dataset_generated_files_every_record_once_in_order(sample):
  with tf.Graph().as_default():
    dataset, n = cifar10_input.eval_dataset('train_eval', sample.dir, batch_size=64)
    it = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    labels, sizes = [], []
    with tf.compat.v1.Session() as sess:
      try:
        while True:
          images, batch_labels = sess.run(it)
          sizes.append(len(batch_labels))
          labels.extend(batch_labels)
      except tf.errors.OutOfRangeError:
        pass
  assert n == 200 and sizes == [64, 64, 64, 8]  # the sample's 5 files of 40 records
  expected = np.concatenate([
      _read_labels(os.path.join(cifar10_input.batches_dir(sample.dir), f))
      for f in cifar10_input.TRAIN_FILES])
  np.testing.assert_array_equal(labels, expected)
  assert images.shape[1:] == (24, 24, 3)


@pytest.mark.filterwarnings('ignore:Seed 1 from outer graph')  # wanted: seeded draws
def test_distorted_dataset_batches_have_static_shapes_and_standardised_pixels(sample):
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)  # the windows, flips and colour changes compared below
    images, labels = cifar10_input.distorted_inputs(sample.dir, batch_size=16)
    assert images.shape.as_list() == [16, 24, 24, 3]
    assert labels.shape.as_list() == [16]
    image_values, label_values = _run([images, labels])
  per_image_mean = image_values.reshape(16, -1).mean(axis=1)
  per_image_std = image_values.reshape(16, -1).std(axis=1)
  np.testing.assert_allclose(per_image_mean, 0, atol=1e-4)
  assert (per_image_std > 0.9).all() and (per_image_std < 1.01).all()
  assert set(label_values) <= set(range(10))


ITERATED_PIPELINES = {  # every input a program or the tutorial's functions iterate
    'trainer': lambda d: input_data.input_pipeline(d, 2, 4, cifar10_input),
    'trainer --seed': lambda d: input_data.input_pipeline(d, 2, 4, cifar10_input, seed=1),
    'trainer --synthetic': lambda d: input_data.input_pipeline(d, 2, 4, cifar10_input,
                                                               synthetic=True),
    'distributed worker': lambda d: input_data.worker_batches(cifar10_input, d, 4, False)(),
    'evaluator': lambda d: input_data.eval_batches(cifar10_input, 'test', d, 4),
    'distorted_inputs': lambda d: cifar10_input.distorted_inputs(d, 4),
    'inputs': lambda d: cifar10_input.inputs('test', d, 4),
}

@pytest.mark.parametrize('pipeline', ITERATED_PIPELINES)
def test_iterated_pipeline_has_no_autotuning_thread_so_its_session_closes_at_once(
    sample, pipeline):
  # With the thread, closing a trainer's session waited out its pause: silent for
  # up to 43 s after the last checkpoint (input_data.closing_at_once).
  from tensorflow.core.framework import dataset_options_pb2
  with tf.Graph().as_default() as graph:
    ITERATED_PIPELINES[pipeline](sample.dir)
  autotune = [dataset_options_pb2.Options.FromString(op.get_attr('serialized_options'))
              .autotune_options for op in graph.get_operations() if op.type == 'OptionsDataset']
  assert [(a.WhichOneof('optional_enabled'), a.enabled) for a in autotune] == [
      ('enabled', False)]


@pytest.mark.parametrize('size, what', [(3073 * 4 - 1, 'has 12291 bytes'), (0, 'has 0 bytes')])
def test_check_data_files_bad_size_names_file_size_and_fix(tmp_path, size, what):
  path = tmp_path / 'data_batch_1.bin'
  path.write_bytes(b'\0' * size)
  with pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.check_data_files([str(path)])
  assert str(path) in str(e.value) and what in str(e.value)
  assert 'multiple of 3073' in str(e.value) and 'remove' in str(e.value)


def test_check_data_files_missing_file_names_it(tmp_path):
  with pytest.raises(cifar10_input.DataError, match='data_batch_9.bin is missing'):
    cifar10_input.check_data_files([str(tmp_path / 'data_batch_9.bin')])


# ---- The download, against a server on 127.0.0.1 ---------------------------------
# Archives for the download tests: well-formed ones and hostile ones.

def _make_tarball(path, members):
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


def _dataset_members(records_per_file=20, seed=0):
  """The (name, bytes) members of a well-formed small CIFAR-10 archive."""
  rng = np.random.default_rng(seed)
  members = [(cifar10_input.BATCHES_DIR + '/' + name,
              cifar10_input.make_records(rng.integers(0, 10, records_per_file),
                                         rng).tobytes())
             for name in cifar10_input.TRAIN_FILES + cifar10_input.TEST_FILES]
  members.append((cifar10_input.BATCHES_DIR + '/batches.meta.txt', b'airplane\nautomobile\n'))
  return members


def test_download_served_archive_is_fetched_verified_and_extracted(tmp_path, capsys):
  served = tmp_path / 'served'
  served.mkdir()
  members = _dataset_members(records_per_file=20)
  md5 = _make_tarball(str(served / 'cifar-10-binary.tar.gz'), members)
  data_dir = tmp_path / 'data'
  with helpers.serve(served) as url:
    dest = cifar10_input.maybe_download_and_extract(
        str(data_dir), url + 'cifar-10-binary.tar.gz', md5)
    assert '>> Downloading cifar-10-binary.tar.gz 100.0%' in capsys.readouterr().out
    for name, data in members:
      assert (data_dir / name).read_bytes() == data
    # A second call finds the files complete and downloads nothing.
    os.remove(data_dir / 'cifar-10-binary.tar.gz')
    assert cifar10_input.maybe_download_and_extract(str(data_dir), url + 'nothing-here',
                                                    md5) == dest
  assert helpers.tree(data_dir) == sorted(name for name, _ in members)


@pytest.mark.parametrize('mask, file_mode', [(0o022, 0o644), (0o002, 0o664)])
def test_download_and_extraction_files_get_the_umask_mode(tmp_path, mask, file_mode):
  served = tmp_path / 'served'
  served.mkdir()
  md5 = _make_tarball(str(served / 'cifar-10-binary.tar.gz'),
                                  _dataset_members(records_per_file=4))
  data_dir = tmp_path / 'data'
  with helpers.serve(served) as url, helpers.umask(mask):
    cifar10_input.maybe_download_and_extract(str(data_dir), url + 'cifar-10-binary.tar.gz',
                                             md5)
  found = helpers.modes(data_dir)
  assert len(found) == 9  # the archive, the directory, its 7 files
  assert found == {path: 0o777 & ~mask if os.path.isdir(data_dir / path) else file_mode
                   for path in found}


def test_download_checksum_mismatch_refused_and_no_partial_file(tmp_path):
  served = tmp_path / 'served'
  served.mkdir()
  _make_tarball(str(served / 'cifar-10-binary.tar.gz'),
                            _dataset_members(records_per_file=5))
  data_dir = tmp_path / 'data'
  with helpers.serve(served) as url, pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(str(data_dir), url + 'cifar-10-binary.tar.gz',
                                             '0' * 32)
  assert 'expected ' + '0' * 32 in str(e.value) and '--data_md5' in str(e.value)
  assert not os.path.exists(data_dir)  # no archive, no .part file, no extracted files


def _link(name, target, kind=tarfile.SYMTYPE):
  info = tarfile.TarInfo(name)
  info.type = kind
  info.linkname = target
  return info


@pytest.mark.parametrize('evil_name, evil_data', [
    ('cifar-10-batches-bin/../../escaped.bin', b'x' * 3073),
    ('/tmp/cifar10-test-absolute-escape.bin', b'x' * 3073),
    ('cifar-10-batches-bin/test_batch.bin', _link('cifar-10-batches-bin/test_batch.bin',
                                                  '/etc/passwd')),
    ('cifar-10-batches-bin/test_batch.bin', _link('cifar-10-batches-bin/test_batch.bin',
                                                  '../../outside', tarfile.LNKTYPE)),
    ('cifar-10-batches-bin/extra.py', b'print(1)'),
], ids=['dotdot', 'absolute', 'symlink', 'hardlink', 'unexpected'])
def test_download_malicious_tarball_refused_nothing_written(tmp_path, evil_name, evil_data):
  served = tmp_path / 'served'
  served.mkdir()
  members = [m for m in _dataset_members(records_per_file=5)
             if m[0] != evil_name]
  md5 = _make_tarball(str(served / 'evil.tar.gz'),
                                  members + [(evil_name, evil_data)])
  data_dir = tmp_path / 'box' / 'data'
  with helpers.serve(served) as url, pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(str(data_dir), url + 'evil.tar.gz', md5)
  assert 'refusing' in str(e.value) and repr(evil_name)[1:-1] in str(e.value)
  assert helpers.tree(data_dir) == ['evil.tar.gz']  # the verified archive only; nothing extracted
  assert helpers.tree(tmp_path / 'box') == ['data/evil.tar.gz']
  assert not os.path.exists('/tmp/cifar10-test-absolute-escape.bin')


def test_existing_batches_dir_with_truncated_file_stops_and_keeps_it(tmp_path):
  cifar10_input.write_sample(str(tmp_path), records_per_file=4)
  os.remove(tmp_path / 'cifar-10-binary.tar.gz')  # no archive to extract again from
  path = tmp_path / 'cifar-10-batches-bin' / 'data_batch_3.bin'
  path.write_bytes(path.read_bytes()[:-1])
  with pytest.raises(cifar10_input.DataError, match='data_batch_3.bin has 12291 bytes'):
    cifar10_input.maybe_download_and_extract(str(tmp_path), 'http://127.0.0.1:9/none',
                                             '0' * 32)
  assert path.stat().st_size == 12291  # left as it was, for the user to look at


def test_distort_batch_each_image_is_a_flipped_or_plain_24x24_window_of_its_source(tmp_path):
  # 64 copies of one random record: every output must be some window (9x9 corners)
  # of it, maybe mirrored, up to a per-channel affine map with a shared positive
  # scale (brightness, contrast, standardisation); the windows and flips vary.
  rng = np.random.default_rng(3)
  record = cifar10_input.make_records([5], rng, learnable=False)[0]
  source = record[1:].reshape(3, 32, 32).transpose(1, 2, 0).astype(np.float64)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)  # how many windows and flips are found is compared
    images, labels = cifar10_input._distort_batch(tf.constant([record.tobytes()] * 64))
    images, labels = _run([images, labels])
  assert images.shape == (64, 24, 24, 3) and (labels == 5).all()
  found = set()
  for image in images:
    matches = [(y, x, flip) for y in range(9) for x in range(9) for flip in (False, True)
               if _affine_match(image, source[y:y + 24, x:x + 24][:, ::-1 if flip else 1])]
    assert len(matches) == 1, matches
    found.add(matches[0])
  assert len(found) > 20 and {flip for _, _, flip in found} == {False, True}


def _affine_match(image, window):
  scales = []
  for c in range(3):
    a, b = np.polyfit(window[..., c].ravel(), image[..., c].ravel(), 1)
    if np.abs(a * window[..., c] + b - image[..., c]).max() > 1e-3 or a <= 0:
      return False
    scales.append(a)
  return np.ptp(scales) < 1e-4


@pytest.mark.parametrize('case', ['http-404', 'nothing-listening'])
def test_download_unreachable_url_names_it_and_leaves_no_file(tmp_path, case):
  served, data_dir = tmp_path / 'served', tmp_path / 'data'
  served.mkdir()
  with helpers.serve(served) as url:
    if case == 'http-404':
      target = url + 'missing.tar.gz'
      with pytest.raises(cifar10_input.DataError, match='cannot download ' + target):
        cifar10_input.maybe_download_and_extract(str(data_dir), target, '0' * 32)
  if case == 'nothing-listening':  # the server has stopped: its port refuses connections
    target = url + 'cifar-10-binary.tar.gz'
    with pytest.raises(cifar10_input.DataError, match='cannot download ' + target):
      cifar10_input.maybe_download_and_extract(str(data_dir), target, '0' * 32)
  assert not os.path.exists(data_dir)  # created for the download, removed with it


# ---- A hostile server: no end, no Content-Length, a drip, silence -----------------

CAP = 1000000  # bytes: the tests' official size, or a copy of your own's cap


def _endless(most=50 * CAP):  # without the cap, the download stops only here
  return lambda: itertools.repeat(b'\0' * (1 << 16), most >> 16)


@pytest.mark.parametrize('own_copy', [False, True], ids=['official', 'own-copy'])
def test_download_endless_stream_without_length_stops_at_the_cap_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, own_copy):
  monkeypatch.setattr(cifar10_input, 'DATA_BYTES', CAP)
  monkeypatch.setattr(cifar10_input, 'OWN_COPY_MAX_BYTES', CAP, raising=False)
  data_dir = tmp_path / 'data'
  with helpers.serve_stream({}, _endless()) as url:
    with pytest.raises(cifar10_input.DataError) as e:
      cifar10_input.maybe_download_and_extract(
          str(data_dir), url + 'cifar-10-binary.tar.gz',
          '0' * 32 if own_copy else cifar10_input.DATA_MD5)
  assert str(e.value).startswith('%scifar-10-binary.tar.gz sent more than %d bytes, the most '
                                 'expected (%s' % (url, CAP, 'a copy of your own' if own_copy
                                                   else 'the official file'))
  assert 'partial file is removed' in str(e.value) and '\n' not in str(e.value)
  out = capsys.readouterr().out
  shown = '>> Downloading cifar-10-binary.tar.gz ' + ('(' if own_copy else '0.0% (0.0 of 1.0 MB)')
  assert shown in out
  assert not os.path.exists(data_dir)  # no partial file; the directory made for it removed


@pytest.mark.parametrize('case', ['drip', 'silence'])
def test_download_drip_or_silence_stops_at_its_deadline_and_leaves_nothing(tmp_path, capsys,
                                                                          case):
  data_dir = tmp_path / 'data'
  # The drip: a byte every 0.2 s, never 1 s without one, for 20 s.
  chunks = helpers.drip(0.2, 100) if case == 'drip' else helpers.drip(20, 1)
  deadlines = input_data.Deadlines(total_secs=2, stall_secs=1) if case == 'drip' else (
      input_data.Deadlines(total_secs=60, stall_secs=1))
  with helpers.serve_stream({'Content-Length': '100'}, chunks) as url:
    start = time.time()
    with pytest.raises(cifar10_input.DataError) as e:
      cifar10_input.maybe_download_and_extract(str(data_dir), url + 'cifar-10-binary.tar.gz',
                                               '0' * 32, deadlines)
    took = time.time() - start
  expected = ('download of %scifar-10-binary.tar.gz took more than 2 s '
              '(--download_timeout_secs), 0.0 MB received; the partial file is removed'
              if case == 'drip' else 'download of %scifar-10-binary.tar.gz stalled: no byte '
              'came for 1 s (--download_stall_secs); the partial file is removed') % url
  assert str(e.value).startswith(expected), str(e.value)
  assert took < 5
  out = capsys.readouterr().out
  assert '>> Downloading cifar-10-binary.tar.gz 0.0% (0.0 of 0.0 MB), 0 s' in out
  if case == 'drip':  # progress as the bytes come, not only at the start
    assert re.search(r'>> Downloading cifar-10-binary\.tar\.gz \d+\.\d% \(0\.0 of 0\.0 MB\), '
                     r'[12] s', out), out
  assert not os.path.exists(data_dir)


@pytest.mark.parametrize('length', ['abc', '-5', '1e6'])
def test_download_malformed_content_length_refused_in_one_line(tmp_path, length):
  data_dir = tmp_path / 'data'
  with helpers.serve_stream({'Content-Length': length}, lambda: [b'x' * 10]) as url:
    with pytest.raises(cifar10_input.DataError) as e:
      cifar10_input.maybe_download_and_extract(str(data_dir), url + 'a.tar.gz', '0' * 32)
  assert str(e.value).startswith('%sa.tar.gz sent Content-Length %r, not a number of bytes'
                                 % (url, length))
  assert not os.path.exists(data_dir)


def test_download_content_length_beyond_the_cap_refused_before_any_byte(tmp_path,
                                                                       monkeypatch):
  monkeypatch.setattr(cifar10_input, 'OWN_COPY_MAX_BYTES', CAP, raising=False)
  with helpers.serve_stream({'Content-Length': str(CAP + 1)}, _endless()) as url:
    with pytest.raises(cifar10_input.DataError, match='announces %d bytes' % (CAP + 1)):
      cifar10_input.maybe_download_and_extract(str(tmp_path / 'data'), url + 'a.tar.gz',
                                               '0' * 32)
  assert not os.path.exists(tmp_path / 'data')


def test_archive_that_is_a_fifo_refused_in_one_line_without_waiting(tmp_path):
  (tmp_path / 'data').mkdir()
  helpers.make_hostile(tmp_path / 'data' / 'cifar-10-binary.tar.gz', 'fifo')
  with pytest.raises(cifar10_input.DataError, match='cifar-10-binary.tar.gz is not a regular '
                     'file'):
    helpers.returns_within(10, cifar10_input.maybe_download_and_extract,
                           str(tmp_path / 'data'), 'http://127.0.0.1:9/cifar-10-binary.tar.gz',
                           unblock=helpers.unblock_fifo(
                               tmp_path / 'data' / 'cifar-10-binary.tar.gz'))


@pytest.mark.parametrize('md5', ['not-an-md5', 'f' * 31, 'f' * 33, 'g' * 32])
def test_data_md5_not_32_hex_digits_refused_in_one_line(sample, md5, capsys):
  with pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(sample.dir, None, md5)
  assert str(e.value).startswith('--data_md5=%s is not an md5 (32 hex digits)' % md5)
  assert md5 not in capsys.readouterr().out  # never printed as the copy's md5


def test_data_md5_of_another_archive_refused_naming_the_archives_own(sample, capsys,
                                                                     tmp_path):
  # Before, `--data_md5=fff...f` on extracted files was printed as the copy's md5.
  wrong = 'f' * 32
  with pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(sample.dir, None, wrong)
  archive = os.path.join(sample.dir, 'cifar-10-binary.tar.gz')
  assert str(e.value).startswith('--data_md5=%s is not the md5 of %s, which has md5 %s: '
                                 'pass --data_md5=%s' % (wrong, archive, sample.md5,
                                                         sample.md5)), e.value
  assert wrong not in capsys.readouterr().out
  cifar10_input.maybe_download_and_extract(sample.dir, None, sample.md5)
  assert 'CIFAR-10 copy with md5 %s in ' % sample.md5 in capsys.readouterr().out
  # The extracted files alone (docs/data.md): the md5 given, said to be unchecked.
  shutil.copytree(os.path.join(sample.dir, 'cifar-10-batches-bin'),
                  tmp_path / 'cifar-10-batches-bin')
  cifar10_input.maybe_download_and_extract(str(tmp_path), None, wrong)
  assert ('CIFAR-10 copy with md5 %s, not checked (no archive beside it) in ' % wrong
          in capsys.readouterr().out)


def test_download_archive_missing_a_member_names_the_archive_not_a_temporary_dir(tmp_path):
  served = tmp_path / 'served'
  served.mkdir()
  members = [m for m in _dataset_members(records_per_file=5)
             if not m[0].endswith('data_batch_3.bin')]
  md5 = _make_tarball(str(served / 'cifar-10-binary.tar.gz'), members)
  data_dir = tmp_path / 'data'
  with helpers.serve(served) as url, pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(str(data_dir), url + 'cifar-10-binary.tar.gz', md5)
  assert str(e.value) == ('%s has no cifar-10-batches-bin/data_batch_3.bin: it is not a whole '
                          'CIFAR-10 binary archive. Remove it to download it again, or check '
                          '--data_url.' % (data_dir / 'cifar-10-binary.tar.gz'))
  assert helpers.tree(data_dir) == ['cifar-10-binary.tar.gz']  # no temporary directory left


# ---- Bad data found before training ------------------------------------------------

def _bin(data_dir, name):
  return os.path.join(cifar10_input.batches_dir(str(data_dir)), name)


@pytest.mark.parametrize('label', [10, 255])
def test_check_data_files_label_out_of_range_names_file_record_and_value(tmp_path, label):
  cifar10_input.write_sample(str(tmp_path), records_per_file=8)
  path = _bin(tmp_path, 'data_batch_4.bin')
  data = bytearray(open(path, 'rb').read())
  data[5 * cifar10_input.RECORD_BYTES] = label  # record 5's label byte
  open(path, 'wb').write(bytes(data))
  with pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.check_data_files([_bin(tmp_path, f) for f in cifar10_input.TRAIN_FILES])
  assert '%s record 5 has label %d; CIFAR-10 labels are 0..9 (1 of its 8 records' % (
      path, label) in str(e.value)


def test_official_md5_on_a_sample_gives_its_archive_md5_as_the_flag_to_pass(sample):
  # The sample's files hold 40 records each, and its archive lies beside them.
  with pytest.raises(cifar10_input.DataError) as e:
    cifar10_input.maybe_download_and_extract(sample.dir)  # the official md5
  dest = cifar10_input.batches_dir(sample.dir)
  archive = os.path.join(sample.dir, 'cifar-10-binary.tar.gz')
  assert str(e.value) == (
      '%s/data_batch_1.bin holds 40 records; each file of the official archive holds 10000. '
      'The archive beside it, %s, has md5 %s, not %s: to use this copy, pass --data_md5=%s; '
      'for the expected archive instead, remove %s and %s.' % (
          dest, archive, sample.md5, cifar10_input.DATA_MD5, sample.md5, archive, dest))


def test_official_md5_on_files_without_their_archive_requires_10000_records_per_file(
    sample, tmp_path):
  shutil.copytree(cifar10_input.batches_dir(sample.dir), cifar10_input.batches_dir(tmp_path))
  with pytest.raises(cifar10_input.DataError,  # files cut on a record boundary
                     match=r'data_batch_1.bin holds 40 records; each file of the official '
                           r'archive holds 10000.*pass its md5 as --data_md5'):
    cifar10_input.maybe_download_and_extract(str(tmp_path))


def test_own_copy_record_counts_are_printed(sample, capsys):
  before = helpers.modes(sample.dir)
  cifar10_input.maybe_download_and_extract(sample.dir, data_md5=sample.md5)
  out = capsys.readouterr().out
  assert 'CIFAR-10 copy with md5 %s in %s: data_batch_1.bin 40 records' % (
      sample.md5, cifar10_input.batches_dir(sample.dir)) in out
  assert 'test_batch.bin 40 records' in out
  assert helpers.modes(sample.dir) == before  # the shared sample: nothing added or removed


@pytest.mark.parametrize('damage', ['missing', 'short'])
def test_damaged_extracted_file_extracted_again_from_verified_archive(tmp_path, capsys,
                                                                     damage):
  md5 = cifar10_input.write_sample(str(tmp_path), records_per_file=8)
  written = helpers.tree(tmp_path)
  path = _bin(tmp_path, 'data_batch_2.bin')
  original = open(path, 'rb').read()
  if damage == 'missing':
    os.remove(path)
  else:
    open(path, 'wb').write(original[:-cifar10_input.RECORD_BYTES // 2])
  cifar10_input.maybe_download_and_extract(  # nothing listens there: no download
      str(tmp_path), 'http://127.0.0.1:9/cifar-10-binary.tar.gz', md5)
  out = capsys.readouterr().out
  assert 'data_batch_2.bin' in out and 'Extracting it again from the verified archive' in out
  assert open(path, 'rb').read() == original
  assert helpers.tree(tmp_path) == written  # nothing of the extraction left beside it


def test_damaged_copy_holding_a_users_file_kept_whole_beside_the_new_one(tmp_path, capsys):
  # No program removes a directory it did not create, nor a file it did not write.
  md5 = cifar10_input.write_sample(str(tmp_path), records_per_file=8)
  os.remove(_bin(tmp_path, 'data_batch_2.bin'))
  notes = os.path.join(cifar10_input.batches_dir(str(tmp_path)), 'notes.txt')
  open(notes, 'w').write('mine')
  cifar10_input.maybe_download_and_extract(
      str(tmp_path), 'http://127.0.0.1:9/cifar-10-binary.tar.gz', md5)
  [kept] = glob.glob(str(tmp_path / 'cifar-10-batches-bin.damaged-*'))
  assert open(os.path.join(kept, 'notes.txt')).read() == 'mine'
  assert ('held files the archive does not (notes.txt): kept whole as %s' % kept
          in capsys.readouterr().out)
  assert os.path.getsize(_bin(tmp_path, 'data_batch_2.bin')) == 8 * cifar10_input.RECORD_BYTES


def test_leftovers_of_killed_extraction_removed_only_for_dead_processes(tmp_path, capsys):
  md5 = cifar10_input.write_sample(str(tmp_path), records_per_file=4)
  dead = subprocess.Popen(['true'])
  dead.wait()  # a PID that no longer runs
  killed = tmp_path / ('.extract-%d-abc' % dead.pid)
  (killed / 'cifar-10-batches-bin').mkdir(parents=True)
  part = tmp_path / ('.cifar-10-binary.tar.gz.%d.xyz.part' % dead.pid)
  part.write_bytes(b'half')
  running = tmp_path / ('.extract-%d-def' % os.getpid())  # a live extraction: left alone
  running.mkdir()
  users = tmp_path / '.extract-notes'  # not ours: left alone
  users.mkdir()
  cifar10_input.maybe_download_and_extract(str(tmp_path), data_md5=md5)
  out = capsys.readouterr().out
  assert 'Removing %s, left by an interrupted download or extraction (process %d)' % (
      killed, dead.pid) in out
  assert not killed.exists() and not part.exists()
  assert running.exists() and users.exists()


def test_synthetic_dataset_same_batch_every_step_and_no_constant_in_the_graph():
  with tf.Graph().as_default() as graph:
    cifar10_input.synthetic_dataset(100000)  # 691 MB of images, were they a constant
    assert graph.as_graph_def().ByteSize() < 100000
  with tf.Graph().as_default():
    batch = tf.compat.v1.data.make_one_shot_iterator(
        cifar10_input.synthetic_dataset(4)).get_next()
    with tf.compat.v1.Session() as sess:
      (first, labels), (second, _) = sess.run(batch), sess.run(batch)
  assert first.shape == (4, 24, 24, 3) and labels.shape == (4,)
  np.testing.assert_array_equal(first, second)
  assert first.std() > 0.5 and set(labels) <= set(range(10))


def test_write_sample_hint_each_training_evaluated_into_its_own_eval_dir(tmp_path, capsys):
  helpers.input_main(cifar10_input, '--write_sample=%s' % (tmp_path / 'sample'),
                     '--records_per_file=2')
  helpers.assert_each_training_evaluated_into_its_own_eval_dir(capsys.readouterr().out,
                                                               'cifar10_eval.py')


def test_write_sample_same_seed_two_directories_an_hour_apart_same_archive_md5(
    tmp_path, monkeypatch):
  first = cifar10_input.write_sample(str(tmp_path / 'a'), records_per_file=4)
  later = time.time() + 3600
  with monkeypatch.context() as m:
    m.setattr(time, 'time', lambda: later)  # what gzip's header would take by default
    second = cifar10_input.write_sample(str(tmp_path / 'elsewhere'), records_per_file=4)
  assert second == first
  data = (tmp_path / 'a' / 'cifar-10-binary.tar.gz').read_bytes()
  assert hashlib.md5(data).hexdigest() == first
  assert data[3] & 0x08 == 0 and data[4:8] == bytes(4)  # gzip: no file name, mtime 0
  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    found = [(m.name, m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in tar]
  assert found == [(name, 0, 0, 0, '', '', 0o644) for name in sorted(f[0] for f in found)]
  assert len(found) == 6


def test_class_images_first_record_of_each_class_whose_label_is_its_patterns():
  records = np.zeros((4, cifar10_input.RECORD_BYTES), np.uint8)
  records[:, 0] = [3, 3, 5, 3]          # the label bytes; record 0 is mislabelled
  records[:, 1:] = np.arange(4)[:, None] * 10
  images = cifar10_input._class_images(records, [5, 3, 5, 3])  # the patterns' labels
  assert sorted(images) == ['cat', 'dog']
  decoded = {name: tf.io.decode_png(png).numpy() for name, png in images.items()}
  assert {name: (pixels.shape, set(pixels.ravel())) for name, pixels in decoded.items()} == {
      'cat': ((32, 32, 3), {10}), 'dog': ((32, 32, 3), {20})}


def test_write_sample_images_are_test_records_by_class_in_hwc_layout(tmp_path):
  cifar10_input.write_sample(str(tmp_path), records_per_file=100)
  records = np.fromfile(_bin(tmp_path, 'test_batch.bin'), np.uint8).reshape(-1, 3073)
  assert sorted(os.listdir(tmp_path / 'images')) == sorted(
      n + '.png' for n in cifar10_input.CLASS_NAMES)  # all 10 among 100 records
  for label, name in enumerate(cifar10_input.CLASS_NAMES):
    pixels = tf.io.decode_png((tmp_path / 'images' / (name + '.png')).read_bytes()).numpy()
    chw = pixels.transpose(2, 0, 1).ravel()
    assert any(r[0] == label and (r[1:] == chw).all() for r in records), name
