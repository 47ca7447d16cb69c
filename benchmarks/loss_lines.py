"""Rates and bytes from the programs' own loss lines: what the dist rows report.

examples/sec comes from the loss lines' timestamps: the window opens when the last
worker to get there has finished its warm-up steps and closes when the first worker
to finish prints its last line, so with two workers both are training throughout.
Each worker's rate is its local steps in the window x its images per step / the time
between its first and last line there; the cluster's is their sum. For one process
that is its mean rate after warm-up. With a backup worker the late gradient of each
update is dropped, so applied_rate counts the examples of gradients applied (global
steps x --replicas_to_aggregate x images per step) as well.

Bytes: the transmit counter of the loopback interface the launcher sees
(/proc/<its pid>/net/dev), read as each loss line arrives; over the window, its growth
per global step is what went through 127.0.0.1 for one update: variables to the
workers, gradients to the ps, gRPC's framing and the runtime's own messages.
--local_cluster's tasks run in a network namespace of their own where Linux allows
it, and the counter then holds their traffic alone; without one, anything else
talking over 127.0.0.1 at the time adds to it.
"""
import datetime
import re

# '[worker1] 2026-11-23 07:01:09.659295: step 3, loss = 4.44 (170.2 examples/sec; 0.094
# sec/batch) [worker 1, local step 3]'; multi_gpu_train.py's lines lack both brackets.
LOSS_LINE = re.compile(r'^(?:\[(?P<task>\w+)\] )?(?P<time>\d{4}-\d\d-\d\d [\d:.]+): step '
                       r'(?P<step>\d+), loss = [^(]+\([\d.]+ examples/sec; [\d.]+ sec/batch\)'
                       r'(?: \[worker \d+, local step (?P<local_step>\d+)\])?$')


def steps_by_task(output):
  """{task: [(local step, seconds since the epoch), ...]} from the loss lines."""
  tasks = {}
  for line in output.splitlines():
    match = LOSS_LINE.match(line)
    if match:
      step = int(match.group('local_step') or match.group('step'))
      when = datetime.datetime.fromisoformat(match.group('time')).timestamp()
      tasks.setdefault(match.group('task') or 'local', []).append((step, when))
  return tasks


def window(tasks, warmup):
  """(opens, closes): seconds when every task is past its warm-up, and when one ends.

  tasks: {task: [(local step, time in seconds), ...]}, from steps_by_task; None
  while some task has no line past its warm-up yet.
  """
  past = [[t for step, t in lines if step >= warmup] for lines in tasks.values()]
  if not tasks or not all(past):
    return None
  return max(min(times) for times in past), min(lines[-1][1] for lines in tasks.values())


def inside(lines, opens, closes):
  return [(step, t) for step, t in lines if opens <= t <= closes]


def window_full(tasks, num_tasks, warmup, steps):
  """Whether the window holds `steps` local steps of each of num_tasks tasks.

  Later lines only widen the window (each task's last line can only come later),
  so once full it stays full.
  """
  found = window(tasks, warmup) if len(tasks) == num_tasks else None
  return found is not None and all(
      len(lines) >= 2 and lines[-1][0] - lines[0][0] >= steps
      for lines in (inside(lines, *found) for lines in tasks.values()))


def window_rate(tasks, warmup, examples_per_step):
  """examples/sec of all tasks together while every one of them is past its warm-up.

  Args:
    tasks: {task: [(local step, time in seconds), ...]}, from steps_by_task.
    warmup: local steps each task runs before the window may open.
    examples_per_step: images of one local step of one task.

  Returns:
    (examples/sec, window seconds), or (None, reason) when the window holds
    fewer than two lines of some task.
  """
  opens, closes = window(tasks, warmup)
  total = 0.0
  for task, lines in sorted(tasks.items()):
    lines = inside(lines, opens, closes)
    if len(lines) < 2 or lines[-1][1] == lines[0][1]:
      return None, '%s has %d loss lines while all tasks train' % (task, len(lines))
    total += ((lines[-1][0] - lines[0][0]) * examples_per_step /
              (lines[-1][1] - lines[0][1]))
  return total, closes - opens


def loopback_bytes_sent(pid='self'):
  """The transmit counter of the loopback interface process pid sees (its network
  namespace's, /proc/<pid>/net/dev), or None where there is none."""
  try:
    with open('/proc/%s/net/dev' % pid) as f:
      return next(int(line.split(':', 1)[1].split()[8]) for line in f
                  if line.strip().startswith('lo:'))
  except (OSError, StopIteration, IndexError, ValueError):
    return None


def bytes_per_update(samples, opens, closes):
  """Bytes sent over 127.0.0.1 per global step while the window was open, or None.

  samples: [(printed at, global step, loopback bytes sent when read), ...], one per
  loss line in the order read.
  """
  found = [(step, sent) for when, step, sent in samples
           if opens <= when <= closes and sent is not None]
  if len(found) < 2:
    return None
  steps = max(step for step, _ in found) - found[0][0]  # async lines may come out of order
  return (found[-1][1] - found[0][1]) / steps if steps > 0 else None


def loss_line_samples(output, sent):
  """[(printed at, global step, bytes sent when read)] from output's loss lines, whose
  i-th line was read when the counter stood at sent[i]."""
  samples = []
  matches = filter(None, map(LOSS_LINE.match, output.splitlines()))
  for match, bytes_sent in zip(matches, sent):
    samples.append((datetime.datetime.fromisoformat(match.group('time')).timestamp(),
                    int(match.group('step')), bytes_sent))
  return samples


def applied_rate(samples, opens, closes, examples_per_update):
  """examples/sec of the gradients applied (global steps) while the window was open."""
  found = [(when, step) for when, step, _ in samples if opens <= when <= closes]
  steps = max(step for _, step in found) - found[0][1] if found else 0
  if steps < 1 or found[-1][0] == found[0][0]:
    return None
  return steps * examples_per_update / (found[-1][0] - found[0][0])
