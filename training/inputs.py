"""The input every tower draws from, and the epoch the schedule counts, for both trainers."""
import collections

import tensorflow as tf

from training import mixed_precision


Epoch = collections.namedtuple('Epoch', [
    'count',   # int: training records in one epoch
    'source',  # str: where the count came from, for start-up
])

def examples_per_epoch(settings, data):
  """One epoch of the schedule: the training records actually read, counted.

  The official sets give the tutorial's 50,000 and the book's 60,000; a sample or
  a copy of your own counts its own records. Synthetic input takes the official
  count, as there is no epoch to count.
  """
  if settings.synthetic:
    return Epoch(data.model.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
                 '%s/model.py\'s count: the input is synthetic' % data.model.__name__)
  count, files = data.input.train_records(settings.data_dir)
  return Epoch(count, 'the records in %s' % files)

def first_batch(run):
  """The global batch a seeded input starts at: one per step run so far, applied or
  skipped (an fp16 step whose gradients overflowed consumed its batch too)."""
  return run.start_step + mixed_precision.checkpoint_skipped_steps(run.checkpoint)

def input_pipeline(data_dir, num_gpus, batch_size, data_input, synthetic=False, seed=None,
                   start_step=0):
  """The one input pipeline that every tower draws from, on the CPU.

  With a seed, each step reads one global batch, fixed by (seed, global step)
  alone, and cuts it into the towers' batches in tower order: the same images,
  distorted the same way, whatever the number of towers, and a resumed run reads
  on from start_step exactly. (Towers dequeuing their own batches would race
  for them.) Without a seed, each tower dequeues its own batch, shuffled and
  distorted afresh on every run.

  Args:
    data_input: the data set's input module (DATASETS[...].input).

  Returns:
    (next_batch: callable giving the next tower's (images float32 [batch_size,
     24, 24, 3] or [batch_size, 784], labels int32 [batch_size]), called once per
     tower; the op that starts the pipeline, to run once in the session).
  """
  with tf.device('/cpu:0'):
    if seed is not None and not synthetic:
      dataset, load_records = data_input.seeded_dataset(data_dir, batch_size * num_gpus,
                                                        seed, start_step)
      iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
      images, labels = iterator.get_next()
      towers = iter(list(zip(tf.split(images, num_gpus), tf.split(labels, num_gpus))))
      return lambda: next(towers), tf.group(load_records, iterator.initializer)
    dataset = train_dataset(data_input, data_dir, batch_size, synthetic)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator.get_next, iterator.initializer


def train_dataset(data_input, data_dir, batch_size, synthetic):
  """Batches of shuffled, distorted training images, or synthetic ones (--synthetic)."""
  if synthetic:
    return data_input.synthetic_dataset(batch_size)
  return data_input.train_dataset(data_dir, batch_size)


def worker_batches(data_input, data_dir, batch_size, synthetic):
  """dist_train.py's input: a function that returns a worker's next batch's tensors.

  Without tf.data's autotuning thread. Closing a session on a cluster deletes the
  worker's graphs, and with them the iterator, whose deletion waits out that
  thread's pause between tunings, which grows to a minute: workers and chiefs
  stopped together hung there after their last step, past the ps tasks' stay
  (tests/test_slurm.py's time-limit test shows it). Without it, AUTOTUNE parallel
  calls keep their starting value (the CPUs, at most 16) and prefetch still sizes
  its buffer.
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  dataset = train_dataset(data_input, data_dir, batch_size, synthetic).with_options(options)
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next
