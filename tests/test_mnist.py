"""MNIST, the book's second classic: its network, the same trainer, evaluation, the cluster."""
import os
import types

import numpy as np
import pytest
import tensorflow as tf

import data_sets
from training import errors, evaluation, summaries
import helpers
import mnist
import mnist_input
import multi_gpu_train

# mnist/ importing nothing of training/, distributed/ or the programs, and building under
# tf.compat.v1.disable_v2_behavior(): tests/test_cifar10_model.py, one process for both models.


def test_inference_is_the_books_network_with_l2_terms_in_losses():
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)  # the initial weights' spread is compared below
    logits = mnist.inference(tf.zeros([3, 784]))
    shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
    terms = tf.compat.v1.get_collection(mnist.LOSSES)
    weights = [v for v in tf.compat.v1.trainable_variables() if v.op.name.endswith('weights')]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      term_values, weight_values, biases = sess.run(
          [terms, weights, [v for v in tf.compat.v1.trainable_variables()
                            if v.op.name.endswith('biases')]])
  assert logits.shape.as_list() == [3, 10]
  assert shapes == {'layer1/weights': [784, 500], 'layer1/biases': [500],
                    'layer2/weights': [500, 10], 'layer2/biases': [10]}
  assert sum(int(np.prod(s)) for s in shapes.values()) == 397510
  for term, w in zip(term_values, weight_values):  # L2: rate * sum(w^2) / 2
    assert term == pytest.approx(0.0001 * (w.astype(np.float64) ** 2).sum() / 2, rel=1e-5)
    assert abs(w).max() <= 0.2 + 1e-6 and 0.08 < w.std() < 0.1  # truncated normal, 0.1
  assert all((b == 0).all() for b in biases)
  with tf.Graph().as_default():  # the book's evaluation passes no regulariser
    mnist.inference(tf.zeros([1, 784]), None)
    assert tf.compat.v1.get_collection(mnist.LOSSES) == []


def test_two_towers_step_matches_one_tower_on_joined_batch():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (40, 784)).astype(np.float32)  # unscaled, as the reader
  labels = rng.integers(0, 10, 40).astype(np.int32)
  start, one_tower = helpers.one_train_step(1, images, labels, model=mnist)
  _, two_towers = helpers.one_train_step(2, images, labels, start_values=start, model=mnist)
  assert len(one_tower) == 9  # 4 variables, their 4 moving averages, global_step
  for name in one_tower:
    np.testing.assert_allclose(two_towers[name], one_tower[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  for name in ('layer1/weights', 'layer2/biases'):
    assert np.abs(one_tower[name] - start[name]).max() > 1e-6, name


def test_train_two_towers_then_eval_learns_the_sample(mnist_sample, tmp_path, capsys):
  # In this process: the trainer's and the evaluator's own functions; the command
  # lines and their defaults are the next test's and tests/test_first_run.py's.
  train_dir = str(tmp_path / 'train')
  multi_gpu_train.train(helpers.trainer_settings(
      train_dir, mnist_sample, dataset='mnist', num_gpus=2, batch_size=100, max_steps=200,
      log_frequency=100, seed=1))  # one outcome: unseeded runs measured 0.87-0.92
  out = capsys.readouterr().out
  assert 'global batch 200 = 100 x 2 towers; 397510 trainable parameters' in out
  # An epoch is the sample's 2000 records, counted, not the official set's 60000.
  assert ('decay_steps 10 = 2000 examples (the records in train.tfrecords) / 200 per update '
          'x 1 epochs') in out
  assert ('learning rate 0.001, multiplied by 0.99 every 10 updates (smoothly); '
          'constants in mnist/model.py') in out
  assert helpers.steps(helpers.LOSS_LINE, out.splitlines())[-1] == 200
  assert 'model.ckpt-200' in out
  flags = types.SimpleNamespace(
      checkpoint_dir=train_dir, eval_dir=str(tmp_path / 'eval'), data_dir=mnist_sample,
      eval_data='test', batch_size=1000, use_moving_averages=True, run_once=True,
      eval_interval_secs=10)  # mnist_eval.py's defaults
  with tf.Graph().as_default():  # as after the program's disable_eager_execution()
    evaluation._evaluate_new_checkpoints(flags, mnist, mnist_input, data_sets.DATASETS,
                                         'train').close()
  out = capsys.readouterr().out
  found = helpers.matches(helpers.PRECISION_LINE, out.splitlines())
  assert len(found) == 1, out
  precision, step, count, which, _ = found[0].groups()
  # Chance is 0.1; the harder sample's wrong labels cap it at 0.98; this seed gives 0.874.
  assert float(precision) >= 0.8 and step == '200' and count == '500', out
  assert which == 'moving averages'


@pytest.mark.slow
def test_flags_not_given_take_the_mnist_defaults(mnist_sample, tmp_path):
  done = helpers.run(['multi_gpu_train.py', '--dataset=mnist', '--data_dir=' + mnist_sample,
                      '--train_dir=%s' % tmp_path, '--log_frequency=500'])
  assert done.code == 0, done.log()
  assert 'global batch 100 = 100 x 1 towers' in done.out, done.log()  # the book's batch
  assert 1000 in helpers.steps(helpers.LOSS_LINE, done.out.splitlines()), done.log()
  assert 'model.ckpt-1000' in done.out, done.log()  # the book's steps
  done = helpers.run(['multi_gpu_train.py', '--dataset=mnist', '--data_dir=' + mnist_sample,
                      '--train_dir=%s' % (tmp_path / 'other'), '--data_md5=0123'])
  assert done.code == 1 and 'Drop --data_md5' in done.err, done.log()
  assert 'Traceback' not in done.err, done.log()


@pytest.mark.slow
def test_mnist_eval_bad_command_line_exits_1_in_one_line_writing_nothing(mnist_sample, tmp_path,
                                                                        tasks):
  # evaluation's checks one by one: tests/test_cifar10_eval.py; here mnist_eval.py's own line.
  (tmp_path / 'file').write_text('not a directory\n')
  refused = [
      (['--eval_interval_secs=%d' % 10 ** 13],
       r'^error: --eval_interval_secs must be 1\.\.604800 \(1 s to a week\), got 10000000000000;'),
      (['--eval_dir=%s' % (tmp_path / 'file')], r'^error: --eval_dir=\S+ is not a directory'),
      (['extra'], r"^error: unexpected argument 'extra': mnist_eval\.py takes flags only"),
  ]
  runs = [tasks(['mnist_eval.py', '--run_once', '--data_dir=%s' % mnist_sample,
                 '--eval_dir=%s' % (tmp_path / 'eval'),
                 '--checkpoint_dir=%s' % (tmp_path / 'train')] + flags)
          for flags, _ in refused]
  helpers.assert_each_refused_in_one_line(runs, refused)
  assert [p.name for p in tmp_path.iterdir()] == ['file']


def _untrained_checkpoint(model, data_input, train_dir, step):
  """A checkpoint of model's network and its moving averages, untrained, at `step`."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    images, _ = tf.compat.v1.data.make_one_shot_iterator(
        data_input.synthetic_dataset(1)).get_next()
    model.inference(images)
    tf.compat.v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY, global_step).apply(
        tf.compat.v1.trainable_variables())
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(global_step.assign(step))
      return tf.compat.v1.train.Saver().save(sess, os.path.join(str(train_dir), 'model.ckpt'),
                                             global_step=step)


def _eval_options(train_dir, eval_dir, data_dir):
  return types.SimpleNamespace(  # mnist_eval.py's defaults
      checkpoint_dir=str(train_dir), eval_dir=str(eval_dir), data_dir=data_dir,
      eval_data='test', batch_size=1000, use_moving_averages=True, run_once=True,
      eval_interval_secs=10)


def test_mnist_eval_cifar10_checkpoint_refused_naming_the_network_it_holds(mnist_sample,
                                                                           tmp_path):
  import cifar10
  import cifar10_input
  path = _untrained_checkpoint(cifar10, cifar10_input, tmp_path / 'train', 7)
  options = _eval_options(tmp_path / 'train', tmp_path / 'eval', mnist_sample)
  with tf.Graph().as_default(), pytest.raises(errors.EvalError) as e:
    evaluation._evaluate_new_checkpoints(options, mnist, mnist_input, data_sets.DATASETS,
                                         'train')
  assert str(e.value).startswith('cannot restore %s into the %s model: ' % (path, 'mnist'))
  assert str(e.value).endswith(
      '. It holds the cifar10 network: evaluate it with cifar10_eval.py.'), e.value
  assert sorted(os.listdir(tmp_path)) == ['train']


def test_eval_checkpoint_below_eval_dirs_points_moves_them_out_of_logdirs_reach(
    mnist_sample, tmp_path, capsys):
  # The trainer's --fresh began again at 0: eval_dir's points to step 900 are the old model's.
  (tmp_path / 'eval').mkdir()
  old = summaries.SummaryWriter(str(tmp_path / 'eval'))
  old.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
      tag='Precision @ 1', simple_value=0.9)]), 900)
  old.close()
  _untrained_checkpoint(mnist, mnist_input, tmp_path / 'train', 7)
  options = _eval_options(tmp_path / 'train', tmp_path / 'eval', mnist_sample)
  with tf.Graph().as_default():
    evaluation._evaluate_new_checkpoints(options, mnist, mnist_input, data_sets.DATASETS,
                                         'train').close()
  [moved] = [line for line in capsys.readouterr().out.splitlines() if 'moved' in line]
  [replaced] = [p for p in os.listdir(tmp_path) if p.startswith('eval-replaced-')]
  assert moved == ('%s held points up to global step 900, of a model since replaced: moved '
                   'its 1 event files to %s. To see them beside the new: tensorboard '
                   '--logdir_spec=new:%s,old:%s' % (
                       tmp_path / 'eval', tmp_path / replaced, tmp_path / 'eval',
                       tmp_path / replaced))
  assert os.listdir(tmp_path / replaced) == [os.path.basename(old.path)]
  assert len(helpers.event_files(tmp_path / 'eval')) == 1  # the new model's points alone
  assert helpers.scalars(tmp_path / 'eval', 'Precision @ 1').keys() == {7}


# dist_train.py --dataset=mnist: tests/test_dist_train.py's fp16 and float32 clusters.


def test_seeded_mnist_runs_repeat_exactly(mnist_sample, tmp_path):
  for name in ('a', 'b'):
    multi_gpu_train.train(helpers.trainer_settings(
        str(tmp_path / name), mnist_sample, num_gpus=2, batch_size=50, max_steps=20,
        summary_steps=0, seed=3, dataset='mnist'))
  a, b = (helpers.checkpoint(tmp_path / name) for name in ('a', 'b'))
  assert 'layer1/weights/ExponentialMovingAverage' in a and a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
