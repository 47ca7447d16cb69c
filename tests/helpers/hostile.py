"""What the programs meet that a user or a network can hand them: HTTP servers on
127.0.0.1 for the download tests, hostile files where a program reads."""
import contextlib
import os
import threading
import time


# ---- A server on 127.0.0.1, for the download tests ---------------------------------------

# How often serve_forever looks for shutdown(): shutdown() waits for its next look, and
# at Python's default (0.5 s) each download test ended half a second after its check.
SHUTDOWN_POLL_SECS = 0.01


@contextlib.contextmanager
def serve(directory):
  """An HTTP server on 127.0.0.1 serving directory's files; yields its base URL."""
  import functools
  import http.server

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass
  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(Quiet, directory=str(directory)))
  with _served(server) as url:
    yield url


@contextlib.contextmanager
def serve_stream(headers, chunks):
  """A hostile HTTP server on 127.0.0.1: every GET gets status 200, `headers` (a dict;
  no Content-Length unless given) and then each bytes object of `chunks()`, an
  iterable that may sleep between them; the connection closes when it ends or when
  the block does. Yields the base URL."""
  import http.server
  done = threading.Event()

  class Hostile(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
      self.send_response(200)
      for name, value in headers.items():
        self.send_header(name, value)
      self.end_headers()
      try:
        for chunk in chunks():
          if done.is_set():
            return
          self.wfile.write(chunk)
          self.wfile.flush()
      except OSError:  # the client went away
        pass

    def log_message(self, *args):
      pass
  with _served(http.server.ThreadingHTTPServer(('127.0.0.1', 0), Hostile), done.set) as url:
    yield url


@contextlib.contextmanager
def _served(server, on_close=lambda: None):
  """Serves on a daemon thread; yields the base URL; on_close(), then stops it."""
  threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_SECS,),
                   daemon=True).start()
  try:
    yield 'http://127.0.0.1:%d/' % server.server_address[1]
  finally:
    on_close()
    server.shutdown()
    server.server_close()


def drip(byte_every_secs, most_bytes):
  """chunks for serve_stream: one byte every byte_every_secs, at most most_bytes."""
  def chunks():
    for _ in range(most_bytes):
      time.sleep(byte_every_secs)
      yield b'x'
  return chunks


# ---- Hostile files a user can leave where a program reads -------------------------------

HOSTILE_FILES = ['fifo', 'dev_zero', 'sparse_3gb']


def make_hostile(path, kind):
  """Puts at path a FIFO (a read waits forever), a link to /dev/zero (never ends) or a
  sparse 3 GB file (no disk used; read whole, it fills the memory)."""
  path = str(path)
  if kind == 'fifo':
    os.mkfifo(path)
  elif kind == 'dev_zero':
    os.symlink('/dev/zero', path)
  else:
    with open(path, 'wb') as f:
      f.truncate(3 << 30)


def returns_within(secs, function, *args, unblock=None):
  """function(*args)'s result or exception, or an AssertionError when it has not returned
  within secs (then unblock(), if given, frees the thread: opens a FIFO's other end)."""
  outcome = []

  def call():
    try:
      outcome.append(('value', function(*args)))
    except BaseException as e:  # noqa: B902 -- handed to the caller
      outcome.append(('raised', e))
  thread = threading.Thread(target=call, daemon=True)
  thread.start()
  thread.join(secs)
  if thread.is_alive():
    if unblock:
      unblock()
    raise AssertionError('%s has not returned within %d s' % (function.__name__, secs))
  kind, value = outcome[0]
  if kind == 'raised':
    raise value
  return value


def unblock_fifo(path):
  """A writer for the FIFO at path, at once closed: its reader sees the end."""
  def unblock():
    with contextlib.suppress(OSError):
      os.close(os.open(str(path), os.O_WRONLY | os.O_NONBLOCK))
  return unblock
