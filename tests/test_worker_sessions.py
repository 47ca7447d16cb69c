"""distributed/worker_sessions.py's pieces that need no cluster."""
import types

import pytest

from distributed import worker_sessions


class ReopeningSession:
  """A MonitoredSession's run_step_fn as TensorFlow's is after a connection failed in
  it: the step_fn is called again with the session it first had, now closed; asked
  again, it has the new one."""

  def __init__(self, closed_calls, error='Attempted to use a closed Session.'):
    self.closed_calls, self.error, self.calls = closed_calls, error, 0

  def run_step_fn(self, step_fn):
    self.calls += 1
    if self.calls <= self.closed_calls:
      raise RuntimeError(self.error)
    return step_fn(types.SimpleNamespace(session='the new session'))


def test_without_hooks_asks_again_after_a_reopened_session_and_gets_the_new_one():
  sess = ReopeningSession(closed_calls=1)
  assert worker_sessions.without_hooks(sess, lambda raw: 'ran on %s' % raw) == (
      'ran on the new session')
  assert sess.calls == 2


def test_without_hooks_other_errors_and_a_session_closed_for_good_are_raised():
  with pytest.raises(RuntimeError, match='something else'):
    worker_sessions.without_hooks(ReopeningSession(1, 'something else'), lambda raw: raw)
  closed = ReopeningSession(closed_calls=worker_sessions.CLOSED_SESSION_TRIES)
  with pytest.raises(RuntimeError, match='closed Session'):
    worker_sessions.without_hooks(closed, lambda raw: raw)
  assert closed.calls == worker_sessions.CLOSED_SESSION_TRIES
