"""TensorBoard: the summaries both trainers build, and the event files they write them to
(a failed write said once, training goes on); examples/sec timed on the steps without
summaries."""
import json
import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf

from training import storage
from training.errors import os_error

# TensorBoard shows its chart groups (a tag's part before the first '/') sorted by
# name: these two come before the layers' conv1/, local3/, ...
LOSS_TAGS = '1_loss/'          # total_loss, cross_entropy, and each tower's
TRAINING_TAGS = '2_training/'  # learning_rate, examples_per_sec, loss_scale (--use_fp16)

EVENT_FILES = 'events.out.tfevents.*'  # new_event_file's names, and TensorFlow's


def text_summary(tag, record):
  """A TensorBoard text summary showing `record` as indented JSON."""
  text = '\n'.join('    ' + line for line in json.dumps(record, indent=1).splitlines())
  summary = tf.compat.v1.Summary()
  value = summary.value.add(tag=tag)
  value.metadata.plugin_data.plugin_name = 'text'
  value.tensor.CopyFrom(tf.make_tensor_proto(text))
  return summary


def new_event_file(logdir):
  """A path in logdir for a new event file, one no file has yet.

  TensorFlow's name, 'events.out.tfevents.<seconds>.<host>', and then the
  microseconds: a run resumed within the second its last run started (a short run
  does) gets a name of its own instead of writing over that run's events, and the
  names sort in the order the files were made, which is the order TensorBoard
  reads them in.
  """
  now = time.time()
  while True:
    path = os.path.join(logdir, 'events.out.tfevents.%010d.%s.%06d' % (
        now, socket.gethostname(), round(now % 1 * 1e6) % 1000000))
    if not storage.exists(path):
      return path
    now += 1e-6


class SummaryWriter:
  """An event file for TensorBoard whose failed write is said once, plainly.

  tf.compat.v1.summary.FileWriter writes from a thread of its own: a write that
  fails (a file-size limit, a full disk) prints a traceback from that thread and
  raises later, from whichever call comes next. This writer writes and flushes
  each event in the caller's thread, in the same format (TFRecords of Event
  protos, named as TensorFlow names them). The first failure prints one line to
  stderr; after it nothing more is written, and training goes on.

  Args:
    logdir: str, an existing directory.
    graph: a tf.Graph to show in TensorBoard, or None.
  """

  def __init__(self, logdir, graph=None):
    self.path = new_event_file(logdir)
    self.failed = False
    self._speeds = []  # examples/sec of the steps since the last summary (note_speed)
    self._writer = None
    self._write(tf.compat.v1.Event(wall_time=time.time(), file_version='brain.Event:2'),
                step=0)
    if graph is not None:
      self._write(tf.compat.v1.Event(wall_time=time.time(), graph_def=graph.as_graph_def(
          add_shapes=True).SerializeToString()), step=0)

  def add_summary(self, summary, global_step):
    """summary: a tf.compat.v1.Summary, or its serialized bytes (a summary op's value)."""
    if isinstance(summary, bytes):
      summary = tf.compat.v1.Summary.FromString(summary)
    self._write(tf.compat.v1.Event(wall_time=time.time(), step=int(global_step),
                                   summary=summary), int(global_step))

  def note_speed(self, examples_per_sec):
    """A step that computed no summary ran at this speed; write_summary() writes the median.

    Not a summary step's own: it also computes every histogram, and runs several
    times slower than the steps the console times (docs/trainer.md, "TensorBoard").
    """
    self._speeds.append(examples_per_sec)

  def write_summary(self, summary, step):
    """A summary op's value at `step`, with 2_training/examples_per_sec beside it: the
    median of the speeds noted since the last (none noted: none written)."""
    self.add_summary(summary, step)
    if self._speeds:
      self.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
          tag=TRAINING_TAGS + 'examples_per_sec', simple_value=float(np.median(self._speeds)))]),
          step)
      self._speeds = []

  def close(self):
    if self._writer is not None and not self.failed:
      self._writer.close()
    self._writer = None

  def _write(self, event, step):
    if self.failed:
      return
    try:
      if self._writer is None:
        self._writer = tf.io.TFRecordWriter(self.path)
      self._writer.write(event.SerializeToString())
      self._writer.flush()
    except (tf.errors.OpError, OSError) as e:
      self.failed = True
      sys.stderr.write('warning: cannot write %s: %s. The run goes on, but TensorBoard '
                       'will show no summaries from step %d on; free space or raise the '
                       'file-size limit (ulimit -f) to keep them.\n'
                       % (self.path, os_error(e, self.path), step))
      sys.stderr.flush()


def build_summaries(watched, tower_losses, grads, lr, model, loss_scale=None):
  """TensorBoard summaries, tags free of tower prefixes so 1- and 4-tower runs overlay.

  Args:
    watched: indices of the towers whose losses and activations are summarised.
    tower_losses: every tower's total loss; grads: [(gradient, variable), ...].
    loss_scale: fp16: float32 scalar, the scale of this step's gradients; or None.
      The histograms then leave out inf and NaN, which a step skipped after an
      overflow holds (HistogramSummary refuses them).

  The raw summary ops take the tag as given; tf.summary.* would derive it from
  the graph's name scopes and uniquify it ('total_loss_1').
  """
  scalars, histograms = {}, {}
  total, cross_entropy = [], []
  for i in watched:
    prefix = '%s_%d/' % (model.TOWER_NAME, i)
    total.append(tower_losses[i])
    cross_entropy.extend(tf.compat.v1.get_collection(model.CROSS_ENTROPY, prefix))
    scalars[LOSS_TAGS + prefix + 'total_loss'] = total[-1]
    scalars[LOSS_TAGS + prefix + 'cross_entropy'] = cross_entropy[-1]
  scalars[LOSS_TAGS + 'total_loss'] = tf.reduce_mean(total)
  scalars[LOSS_TAGS + 'cross_entropy'] = tf.reduce_mean(cross_entropy)
  scalars[TRAINING_TAGS + 'learning_rate'] = lr
  if loss_scale is not None:
    scalars[TRAINING_TAGS + 'loss_scale'] = loss_scale
  first = '%s_%d/' % (model.TOWER_NAME, watched[0])
  for x in tf.compat.v1.get_collection(model.ACTIVATIONS, first):
    layer = x.op.name[len(first):].split('/')[0]  # tower_0/conv1/conv1 -> conv1
    histograms[layer + '/activations'] = x
    scalars[layer + '/sparsity'] = tf.nn.zero_fraction(x)
  for grad, var in grads:
    histograms[var.op.name] = var
    histograms[var.op.name + '/gradients'] = grad
  with tf.name_scope('summaries'):
    if loss_scale is not None:
      histograms = {tag: tf.boolean_mask(x, tf.math.is_finite(x))
                    for tag, x in histograms.items()}
    return tf.compat.v1.summary.merge(
        [tf.raw_ops.ScalarSummary(tags=tag, values=value) for tag, value in scalars.items()] +
        [tf.raw_ops.HistogramSummary(tag=tag, values=value)
         for tag, value in histograms.items()])


def open_writer(sess, run, summary_steps, record):
  """The run's event file, opening with its record; None without summaries.

  A failed event-file write is said once; training goes on (SummaryWriter).
  """
  if not summary_steps:
    return None
  return start_writer(run.train_dir, sess.graph if not run.checkpoint else None, record,
                      run.start_step)


def start_writer(train_dir, graph, record, start_step):
  """A SummaryWriter on train_dir whose first event is the run record: runs compared
  side by side in TensorBoard say what differed. graph: None leaves it out."""
  writer = SummaryWriter(train_dir, graph)
  writer.add_summary(text_summary('run_record', record), start_step)
  return writer
