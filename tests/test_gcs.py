"""gs:// end to end: TensorFlow's own gs:// client, in the programs, against a GCS JSON
API server on 127.0.0.1 (tests/helpers/gcs_server.py), reached through HTTPS_PROXY and a
test CA: not real GCS. Every program runs from an empty working directory with an empty
HOME, and both must stay empty: nothing of a gs:// run is written locally.

The server lives in the test process, one per module and process; the programs are
forked as the other tests' are: the proxy, the CA and the token are read by
TensorFlow's libcurl at each request, not when TensorFlow is imported.
"""
import hashlib
import os
import re

import numpy as np
import pytest

import helpers
from helpers.gcs_server import GcsServer, Unavailable

BUCKET = 'bucket'
RECORDS_PER_FILE = 40  # 200 training records, 40 test records
NOT_LOCKED = re.compile(r'^gs://bucket/\S+ is on object storage, where no fcntl lock '
                        r'exists: a second trainer on it is not stopped', re.M)


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  try:
    server = GcsServer(str(tmp_path_factory.mktemp('gcs_ca')), buckets=(BUCKET,))
  except Unavailable as e:
    pytest.skip('no local GCS server for the gs:// tests: %s' % e)
  yield server
  server.close()


@pytest.fixture
def place(tmp_path):
  """(run(argv) in an empty working directory with an empty HOME, that directory, HOME)."""
  cwd, home = tmp_path / 'cwd', tmp_path / 'home'
  cwd.mkdir()
  home.mkdir()

  def run(argv, gcs=None):
    env = helpers.user_env(HOME=str(home), **(gcs.env() if gcs else {}))
    return helpers.run(argv, env=env, cwd=str(cwd))
  return run, cwd, home


def _ok(result):
  assert result.code == 0, result.log()
  assert 'Traceback' not in result.err, result.log()
  return result.out


def _png():
  import tensorflow as tf
  pixels = np.zeros((32, 32, 3), np.uint8)
  pixels[:, :, 0] = 255
  return tf.io.encode_png(pixels).numpy()


@pytest.mark.slow
def test_gcs_sample_train_resume_eval_export_classify_all_in_the_bucket(gcs, place):
  run, cwd, home = place
  out = _ok(run(['cifar10_input.py', '--write_sample=gs://bucket/data',
                 '--records_per_file=%d' % RECORDS_PER_FILE], gcs))
  md5 = re.search(r'archive md5 ([0-9a-f]{32})', out).group(1)
  assert md5 == hashlib.md5(gcs.get(BUCKET, 'data/cifar-10-binary.tar.gz')).hexdigest()
  assert len(gcs.get(BUCKET, 'data/cifar-10-batches-bin/test_batch.bin')) == 40 * 3073
  data = ['--data_dir=gs://bucket/data', '--data_md5=%s' % md5]
  train = ['multi_gpu_train.py', '--train_dir=gs://bucket/run', '--batch_size=8'] + data

  out = _ok(run(train + ['--max_steps=2'], gcs))
  assert NOT_LOCKED.search(out), out
  assert 'Run record: gs://bucket/run/run-' in out
  assert 'Saved checkpoint gs://bucket/run/model.ckpt-2' in out
  assert 'data_batch_5.bin %d records' % RECORDS_PER_FILE in out
  read = [path for method, host, path in gcs.requests if host == 'storage.googleapis.com']
  assert '/bucket/data/cifar-10-batches-bin%2Fdata_batch_1.bin' in read or any(
      'data_batch_1.bin' in path for path in read), read

  out = _ok(run(train + ['--max_steps=3'], gcs))
  assert 'Resuming from gs://bucket/run/model.ckpt-2 at step 2' in out
  assert 'Saved checkpoint gs://bucket/run/model.ckpt-3' in out
  names = gcs.names(BUCKET, 'run/')
  assert 'run/checkpoint' in names and 'run/model.ckpt-3.index' in names
  assert sum(n.startswith('run/events.out.tfevents.') for n in names) == 2, names
  assert sum(bool(re.match(r'run/run-\d{8}-\d{6}-step\d+\.json$', n)) for n in names) == 2

  out = _ok(run(['cifar10_eval.py', '--run_once', '--checkpoint_dir=gs://bucket/run',
                 '--eval_dir=gs://bucket/eval'] + data, gcs))
  assert re.search(r'precision @ 1 = [0-9.]+ \(global step 3, 40 test records', out), out
  assert any(n.startswith('eval/events.out.tfevents.') for n in gcs.names(BUCKET, 'eval/'))

  out = _ok(run(['export_model.py', '--train_dir=gs://bucket/run',
                 '--export_dir=gs://bucket/model'], gcs))
  assert 'Wrote gs://bucket/model: a SavedModel of gs://bucket/run/model.ckpt-3' in out
  assert 'model/saved_model.pb' in gcs.names(BUCKET, 'model/')
  gcs.put(BUCKET, 'images/red.png', _png())
  out = _ok(run(['classify.py', '--model_dir=gs://bucket/model', 'gs://bucket/images/red.png'],
                gcs))
  assert re.match(r'gs://bucket/images/red.png: \w+ 0\.\d\d, \w+ 0\.\d\d, \w+ 0\.\d\d$',
                  out.strip()), out
  # (HOME too: the programs are forked from a process that imported TensorFlow, whose
  # Keras makes ~/.keras at import, in any program, gs:// or not.)
  assert os.listdir(cwd) == [] and os.listdir(home) == []


@pytest.mark.slow
def test_gcs_two_trainers_then_fresh_and_rotation_touch_only_the_runs_objects(gcs, place):
  run, cwd, home = place
  gcs.put(BUCKET, 'shared-notes.txt', b'not the run\'s')
  gcs.put(BUCKET, 'shared/notes.txt', b'not the run\'s either')
  argv = helpers.Task.python_argv('multi_gpu_train.py') + [
      '--synthetic', '--train_dir=gs://bucket/shared', '--batch_size=4', '--max_steps=2']
  env = helpers.user_env(HOME=str(home), **gcs.env())
  trainers = [helpers.Task(argv, env=env, cwd=str(cwd)) for _ in range(2)]
  for trainer in trainers:
    code = trainer.finish()
    assert code == 0, trainer.log()
    assert NOT_LOCKED.search(trainer.out), trainer.log()  # said, as docs/trainer.md says
  out = _ok(run(['multi_gpu_train.py', '--synthetic', '--train_dir=gs://bucket/shared',
                 '--batch_size=2', '--max_steps=6', '--save_every_n_steps=1', '--fresh'], gcs))
  moved = re.search(r'--fresh: moved (\d+) files from gs://bucket/shared to '
                    r'(gs://bucket/(shared-replaced-\d{8}-\d{6})) \(on object storage: a move '
                    r'there is a copy and a delete', out)
  assert moved, out
  aside = [n for n in gcs.names(BUCKET, moved.group(3) + '/') if not n.endswith('/')]
  assert len(aside) == int(moved.group(1)) and any('model.ckpt-2.index' in n for n in aside)
  names = gcs.names(BUCKET, 'shared')
  assert 'shared-notes.txt' in names and 'shared/notes.txt' in names  # never the run's
  assert 'Starting from step 0 in gs://bucket/shared' in out
  kept = sorted(int(n.split('-')[-1][:-len('.index')]) for n in names
                if re.match(r'shared/model\.ckpt-\d+\.index$', n))
  assert kept == [2, 3, 4, 5, 6], names  # KEEP_CHECKPOINTS: step 1's rotated away
  assert not any(n.startswith('shared/model.ckpt-1.') for n in names), names
  assert gcs.get(BUCKET, 'shared/checkpoint').decode().startswith(
      'model_checkpoint_path: "model.ckpt-6"')
  assert os.listdir(cwd) == [] and os.listdir(home) == []


def test_gcs_scheme_tensorflow_lacks_refused_in_one_line_before_anything_written(place):
  run, cwd, home = place
  for argv in (['multi_gpu_train.py', '--synthetic', '--train_dir=s3://bucket/run'],
               ['multi_gpu_train.py', '--train_dir=%s' % (cwd / 'run'),
                '--data_dir=s3://bucket/data']):
    result = run(argv + ['--max_steps=1'])
    assert result.code == 1, result.log()
    assert result.errors == [result.err.strip()], result.log()  # one line, no traceback
    assert re.match(r'error: --(train|data)_dir=s3://bucket/\w+: TensorFlow [\d.]+ has no '
                    r'file system for s3://.*the tensorflow-io package.*adds it\. Nothing '
                    r'was written\.$', result.err.strip()), result.log()
    assert os.listdir(cwd) == [] and os.listdir(home) == []


def test_gcs_local_cluster_refused_in_one_line_its_namespace_has_no_network(place):
  run, cwd, home = place
  result = run(['dist_train.py', '--local_cluster=1,1', '--synthetic', '--max_steps=1',
                '--train_dir=gs://bucket/dist'])
  assert result.code == 1, result.log()
  assert re.match(r'error: --train_dir=gs://bucket/dist: --local_cluster runs its tasks in '
                  r'a private network namespace .* object storage cannot be reached\.',
                  result.err.strip()) and result.errors == [result.err.strip()], result.log()
  assert os.listdir(cwd) == [] and os.listdir(home) == []
