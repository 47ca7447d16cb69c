"""What only the chief (worker 0) writes beside training, and what it has written:
its run record, its checkpoint and summary hooks, its newest checkpoint's step.
"""
import os

from distributed import worker_sessions
from training import checkpoints, run_record


def record(run, settings, data, flag_values, program, knobs, flags_given=()):
  """The chief's run record, as multi_gpu_train.py's: flags, constants, the cluster.

  program: dist_train.py's module; knobs: the module its training knobs come from
  (multi_gpu_train.py's), where they are edited: they are recorded there, the
  program's own constants beside them. flags_given: the flags set on the command
  line (a constant they override says so).
  """
  edited_there = run_record.constants_of(knobs)
  own = {name: value for name, value in run_record.constants_of(program).items()
         if name not in edited_there}
  described = run_record.describe(
      {os.path.basename(knobs.__file__): edited_there,
       os.path.basename(program.__file__): own},
      flag_values, settings, run.devices, run.start_step, data, flags_given)
  described['cluster'] = run.cluster.as_dict()
  return described


def hooks(run, settings, model, scaffold, global_step, record, keep_checkpoints):
  """The chief's checkpoints (SaveCheckpoints) and summaries, through
  the machinery multi_gpu_train.py saves and summarises with."""
  found = []
  if scaffold.summary_op is not None:  # first: its step time ends before a save starts
    found.append(worker_sessions.WriteSummaries(
        settings.train_dir, settings.summary_steps, scaffold.summary_op, global_step, record,
        settings.batch_size * len(run.devices)))
  found.append(worker_sessions.SaveCheckpoints(
      settings.train_dir, settings.save_every_n_steps, keep_checkpoints, scaffold.saver,
      global_step, checkpoints.all_variables_finite(), model.__name__,
      run.start_step if run.checkpoint else None))
  return found


def untouched(run, graph):
  """What a worker stopping on a diverged loss leaves on disk, for its message."""
  if run.is_chief:
    return checkpoints.untouched_note(saved_step(run, graph))
  return 'the chief saves no checkpoint with a NaN or infinite variable.'


def saved_step(run, graph):
  """The chief's newest checkpoint's step, as its SaveCheckpoints hook knows it, or None
  (none yet, or not the chief)."""
  found = saves(graph)
  return found.last_saved if run.is_chief and found else None


def saves(graph):
  """The chief's SaveCheckpoints hook, or None (another worker)."""
  return next((h for h in graph.hooks if isinstance(h, worker_sessions.SaveCheckpoints)),
              None)


def save_after_error(sess, run, graph):
  """After a step that failed on this worker's data (steps.stop_on_changed_data): the
  chief saves the global step, unless its checkpoint is on disk; returns what it says."""
  if not run.is_chief:
    return 'This worker saves nothing (the chief does); rerun it once the file is whole.'
  found = saves(graph)
  worker_sessions.without_hooks(sess, found.end)
  return 'Saved step %d; rerun to resume once the file is whole.' % found.last_saved
