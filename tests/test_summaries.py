"""training/summaries.py: the event files TensorBoard reads, two runs' kept apart, the
speed's median, and summaries cut short by a file-size limit: said once, training goes on.
"""
import os
import sys

import pytest
import tensorflow as tf

import helpers
from training import summaries

SUMMARIES_UNDER_LIMIT = '''
import signal, sys
import tensorflow as tf
from training import summaries
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as StopSignals does
writer = summaries.SummaryWriter(sys.argv[1])
for step in range(200):
  writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
      tag='loss', simple_value=float(step))]), step)
writer.close()
print('went on to the end')
'''


def test_summary_writer_over_file_size_limit_says_once_and_goes_on(tmp_path):
  done = helpers.run([sys.executable, '-c', SUMMARIES_UNDER_LIMIT, str(tmp_path)],
                     file_size_limit=2000)
  assert done.code == 0 and done.out == 'went on to the end\n', done.log()
  warnings = [line for line in done.err.splitlines() if 'cannot write' in line]
  [path] = helpers.event_files(tmp_path)
  assert len(warnings) == 1 and 'Traceback' not in done.err, done.log()
  steps = []
  with pytest.raises(tf.errors.DataLossError):  # the last record is cut short
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step] if event.summary.value else []
  assert steps == list(range(len(steps))) and 10 < len(steps) < 200
  assert warnings == ['warning: cannot write %s: File too large. The run goes on, but '
                      'TensorBoard will show no summaries from step %d on; free space or '
                      'raise the file-size limit (ulimit -f) to keep them.'
                      % (path, len(steps))]


def test_summary_writer_events_read_by_tensorboard(tmp_path):
  with tf.Graph().as_default() as graph:
    tf.constant(1.0, name='one')
  writer = summaries.SummaryWriter(str(tmp_path), graph)
  for step in (0, 5, 7):
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag='total_loss', simple_value=step / 10)]).SerializeToString(), step)
  writer.close()
  from tensorboard.backend.event_processing import event_accumulator
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [(e.step, round(e.value, 6)) for e in events.Scalars('total_loss')] == [
      (0, 0.0), (5, 0.5), (7, 0.7)]
  assert 'one' in [node.name for node in events.Graph().node]


def test_summary_writers_made_in_the_same_second_keep_both_runs_events(tmp_path, monkeypatch):
  monkeypatch.setattr(summaries.time, 'time', lambda: 1795575295.25)  # the same instant
  for step in (7, 9):  # a run, then its resumed run, as TensorBoard's reader sees them
    writer = summaries.SummaryWriter(str(tmp_path))
    writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
        tag='total_loss', simple_value=step / 10)]), step)
    writer.close()
  names = sorted(os.listdir(tmp_path))
  assert len(names) == 2 and names[0].endswith('.250000') and names[1].endswith('.250001')
  from tensorboard.backend.event_processing import event_accumulator
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [e.step for e in events.Scalars('total_loss')] == [7, 9]


def test_summary_writer_writes_the_median_of_the_speeds_noted_since_the_last(tmp_path):
  writer = summaries.SummaryWriter(str(tmp_path))
  loss = lambda value: tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
      tag='loss', simple_value=value)])
  writer.write_summary(loss(1.0), 0)  # no step timed yet: no rate
  for rate in (100.0, 300.0, 200.0):
    writer.note_speed(rate)
  writer.write_summary(loss(0.5), 3)
  writer.note_speed(50.0)
  writer.write_summary(loss(0.4), 4)
  writer.close()
  assert helpers.scalars(tmp_path, '2_training/examples_per_sec') == {3: 200.0, 4: 50.0}
