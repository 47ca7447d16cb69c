"""A Google Cloud Storage JSON API server on 127.0.0.1, in memory, that TensorFlow's own
gs:// client talks to, and the proxy that carries it there.

TensorFlow's client hard-codes https://www.googleapis.com/storage/v1/ and
https://storage.googleapis.com and has no endpoint variable; its libcurl honours
HTTPS_PROXY and CURL_CA_BUNDLE, read at each request. So one port here is both: a
CONNECT proxy that admits only those two hosts (nothing leaves 127.0.0.1) and, inside the
tunnel, a TLS server with a certificate for both names, signed by a test CA made with
the openssl command line. `GcsServer.env()` is what a program needs to reach it. (Checked
here: the proxy, the CA bundle and the token are read at each request, so programs
forked from an imported TensorFlow reach the server; GCS_RETRY_CONFIG_* are read when
TensorFlow registers gs://, at import, so forked programs keep TensorFlow's retries,
which this server, answering no 5xx, never calls for.)

What TensorFlow 2.21 sends (tsl/platform/cloud/gcs_file_system.cc), and is answered:
bucket metadata and storageLayout; object list (prefix, delimiter, pageToken,
maxResults); object metadata (size, generation, updated); media download with Range
from storage.googleapis.com; media upload (an empty body is a directory marker, with
ifGenerationMatch=0) and resumable upload (POST, then PUT to the session URI, with
Content-Range, chunked or not, and status queries `bytes */N`); delete; rewriteTo (a
rename is a rewrite and a delete). `Expect: 100-continue` is answered (HTTP/1.1).
"""
import datetime
import http.server
import itertools
import json
import os
import socket
import socketserver
import ssl
import subprocess
import threading
import urllib.parse

HOSTS = ('www.googleapis.com', 'storage.googleapis.com')
PAGE_SIZE = 1000  # objects per list page, as GCS's default


class Unavailable(Exception):
  """The server cannot be had here (no openssl); the message says why, in one line."""


def make_certificates(directory):
  """A test CA and a server certificate for HOSTS, made with the openssl CLI in
  `directory`. Returns (ca.pem, server.pem, server.key). Raises Unavailable."""
  paths = [os.path.join(directory, name) for name in
           ('ca.pem', 'ca.key', 'server.pem', 'server.key', 'server.csr', 'san.cnf')]
  ca, ca_key, cert, key, csr, san = paths
  with open(san, 'w') as f:
    f.write('subjectAltName=%s\n' % ','.join('DNS:%s' % host for host in HOSTS))
  ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']  # quick
  commands = [  # handshakes: TensorFlow opens a connection per request
      ['req', '-x509'] + ec + ['-days', '2', '-subj', '/CN=gcs test CA', '-keyout', ca_key,
                               '-out', ca],
      ['req'] + ec + ['-subj', '/CN=%s' % HOSTS[0], '-keyout', key, '-out', csr],
      ['x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-CAcreateserial',
       '-days', '2', '-extfile', san, '-out', cert]]
  for command in commands:
    try:
      subprocess.run(['openssl'] + command, check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
      raise Unavailable('no openssl command to make the test CA') from None
    except subprocess.CalledProcessError as e:
      raise Unavailable('openssl %s failed: %s' % (command[0], e.stderr.decode()[-200:]))
  return ca, cert, key


class Bucket:
  """Objects by name: {name: (bytes, generation)}."""

  def __init__(self):
    self.objects = {}


class GcsServer:
  """The server and its proxy on one port of 127.0.0.1, in a thread of this process.

  buckets: {name: Bucket}, read and changed by tests directly (under `lock`).
  requests: (method, host, path) of every request, in order.
  """

  def __init__(self, directory, buckets=('bucket',)):
    self.ca, cert, key = make_certificates(directory)
    self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    self.context.load_cert_chain(cert, key)
    self.buckets = {name: Bucket() for name in buckets}
    self.lock = threading.RLock()
    self.requests = []
    self.sessions = {}  # upload_id -> [bucket, name, bytearray, done]
    self.generations = itertools.count(1)
    self.ids = itertools.count(1)
    handler = type('Handler', (_Handler,), {'gcs': self})
    self.httpd = _Server(('127.0.0.1', 0), handler)
    self.port = self.httpd.server_address[1]
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
    self.thread.start()

  def env(self):
    """The variables a program needs to reach this server through TensorFlow's client."""
    proxy = 'http://127.0.0.1:%d' % self.port
    return {'HTTPS_PROXY': proxy, 'https_proxy': proxy, 'NO_PROXY': None, 'no_proxy': None,
            'CURL_CA_BUNDLE': self.ca, 'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test-token',
            'NO_GCE_CHECK': 'true', 'GCS_RETRY_CONFIG_INIT_DELAY_TIME_US': '10000',
            'GCS_RETRY_CONFIG_MAX_DELAY_TIME_US': '100000',
            'GCS_RETRY_CONFIG_MAX_RETRIES': '2'}

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()

  # ---- What tests read and write directly --------------------------------------------
  def names(self, bucket='bucket', prefix=''):
    with self.lock:
      return sorted(n for n in self.buckets[bucket].objects if n.startswith(prefix))

  def get(self, bucket, name):
    with self.lock:
      return self.buckets[bucket].objects[name][0]

  def put(self, bucket, name, data):
    with self.lock:
      self.buckets[bucket].objects[name] = (bytes(data), next(self.generations))

  def put_tree(self, bucket, prefix, local_dir):
    """Uploads every file under local_dir as prefix/<relative path>."""
    for root, _, files in os.walk(local_dir):
      for name in files:
        path = os.path.join(root, name)
        with open(path, 'rb') as f:
          self.put(bucket, prefix + os.path.relpath(path, local_dir), f.read())

  def _metadata(self, bucket, name):
    data, generation = self.buckets[bucket].objects[name]
    return {'kind': 'storage#object', 'bucket': bucket, 'name': name, 'size': str(len(data)),
            'generation': str(generation), 'updated': datetime.datetime.now(
                datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%fZ')[:-4] + 'Z'}


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  allow_reuse_address = True


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = 'HTTP/1.1'  # keeps connections, answers Expect: 100-continue
  gcs = None

  def setup(self):
    super().setup()
    # Headers and body go as two writes (two TLS records): without this, Nagle's
    # algorithm holds the second for the client's delayed ACK, 40 ms a request.
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

  def log_message(self, *args):
    pass

  def do_CONNECT(self):
    host, _, port = self.path.partition(':')
    if host not in HOSTS or port != '443':
      self.send_error(403, 'this proxy reaches only %s' % ' and '.join(HOSTS))
      return
    self.send_response(200, 'Connection established')
    self.end_headers()
    self.wfile.flush()
    self.connection = self.gcs.context.wrap_socket(self.connection, server_side=True)
    self.rfile = self.connection.makefile('rb')
    self.wfile = socketserver._SocketWriter(self.connection)
    self.tunnel = host

  def _body(self):
    if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
      data = bytearray()
      while True:
        size = int(self.rfile.readline().split(b';')[0].strip() or b'0', 16)
        if size == 0:
          while self.rfile.readline() not in (b'\r\n', b'\n', b''):
            pass
          return bytes(data)
        data += self.rfile.read(size)
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get('Content-Length') or 0))

  def _reply(self, code, body=None, headers=()):
    data = b'' if body is None else json.dumps(body).encode()
    self.send_response(code)
    for name, value in headers:
      self.send_header(name, value)
    self.send_header('Content-Type', 'application/json')
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _not_found(self):
    self._reply(404, {'error': {'code': 404, 'message': 'No such object'}})

  def _dispatch(self, method):
    body = self._body() if method in ('POST', 'PUT') else b''
    host = getattr(self, 'tunnel', None)
    if host is None:  # plain http to the proxy port: nothing is served that way
      self._reply(403, {'error': 'use CONNECT'})
      return
    url = urllib.parse.urlsplit(self.path)
    query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    with self.gcs.lock:
      self.gcs.requests.append((method, host, self.path))
      if host == 'storage.googleapis.com':
        self._download(url.path)
      elif url.path.startswith('/upload/storage/v1/b/'):
        self._upload(method, url.path, query, body)
      elif url.path.startswith('/storage/v1/b/'):
        self._json_api(method, url.path[len('/storage/v1/b/'):], query)
      else:
        self._reply(400, {'error': 'not a GCS path: %s' % self.path})

  def do_GET(self):
    self._dispatch('GET')

  def do_POST(self):
    self._dispatch('POST')

  def do_PUT(self):
    self._dispatch('PUT')

  def do_DELETE(self):
    self._dispatch('DELETE')

  # ---- storage.googleapis.com/BUCKET/OBJECT --------------------------------------------
  def _download(self, path):
    bucket, _, name = path.lstrip('/').partition('/')
    name = urllib.parse.unquote(name)
    if bucket not in self.gcs.buckets or name not in self.gcs.buckets[bucket].objects:
      self._not_found()
      return
    data = self.gcs.buckets[bucket].objects[name][0]
    wanted = self.headers.get('Range', '')
    if not wanted.startswith('bytes='):
      self._send_bytes(200, data)
      return
    first, _, last = wanted[len('bytes='):].partition('-')
    first = int(first)
    last = min(int(last) if last else len(data) - 1, len(data) - 1)
    if first >= len(data):
      self._send_bytes(416 if data else 200, b'')
      return
    self._send_bytes(206, data[first:last + 1],
                     [('Content-Range', 'bytes %d-%d/%d' % (first, last, len(data)))])

  def _send_bytes(self, code, data, headers=()):
    self.send_response(code)
    for name, value in headers:
      self.send_header(name, value)
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  # ---- www.googleapis.com/storage/v1/b/... -------------------------------------------------
  def _json_api(self, method, rest, query):
    parts = rest.split('/')
    bucket = parts[0]
    if bucket not in self.gcs.buckets:
      self._reply(404, {'error': {'code': 404, 'message': 'No such bucket'}})
      return
    objects = self.gcs.buckets[bucket].objects
    if len(parts) == 1 and method == 'GET':
      self._reply(200, {'kind': 'storage#bucket', 'name': bucket, 'location': 'US'})
    elif parts[1:] == ['storageLayout'] and method == 'GET':
      self._reply(200, {'kind': 'storage#storageLayout', 'bucket': bucket,
                        'location': 'US', 'hierarchicalNamespace': {'enabled': False}})
    elif parts[1:] == ['o'] and method == 'GET':
      self._reply(200, self._list(objects, query))
    elif len(parts) == 3 and parts[1] == 'o':
      name = urllib.parse.unquote(parts[2])
      if name not in objects:
        self._not_found()
      elif method == 'GET':
        self._reply(200, self.gcs._metadata(bucket, name))
      elif method == 'DELETE':
        del objects[name]
        self._reply(204)
      else:
        self._reply(405, {'error': method})
    elif len(parts) == 8 and parts[1] == 'o' and parts[3:5] == ['rewriteTo', 'b']:
      self._rewrite(bucket, urllib.parse.unquote(parts[2]), parts[5],
                    urllib.parse.unquote(parts[7]))
    else:
      self._reply(400, {'error': 'not answered here: %s %s' % (method, self.path)})

  def _list(self, objects, query):
    prefix, delimiter = query.get('prefix', ''), query.get('delimiter', '')
    entries = []  # ('item' or 'prefix', name), sorted, prefixes once each
    seen = set()
    for name in sorted(objects):
      if not name.startswith(prefix):
        continue
      cut = name.find(delimiter, len(prefix)) if delimiter else -1
      if cut >= 0:
        folder = name[:cut + len(delimiter)]
        if folder not in seen:
          seen.add(folder)
          entries.append(('prefixes', folder))
      else:
        entries.append(('items', name))
    start = int(query.get('pageToken') or 0)
    size = min(int(query.get('maxResults') or PAGE_SIZE), PAGE_SIZE)
    page = {'kind': 'storage#objects'}
    for kind, name in entries[start:start + size]:
      page.setdefault(kind, []).append({'name': name} if kind == 'items' else name)
    if start + size < len(entries):
      page['nextPageToken'] = str(start + size)
    return page

  def _rewrite(self, bucket, name, to_bucket, to_name):
    objects = self.gcs.buckets[bucket].objects
    if name not in objects or to_bucket not in self.gcs.buckets:
      self._not_found()
      return
    self.gcs.put(to_bucket, to_name, objects[name][0])
    resource = self.gcs._metadata(to_bucket, to_name)
    self._reply(200, {'kind': 'storage#rewriteResponse', 'done': True,
                      'totalBytesRewritten': resource['size'],
                      'objectSize': resource['size'], 'resource': resource})

  # ---- www.googleapis.com/upload/storage/v1/b/BUCKET/o ---------------------------------
  def _upload(self, method, path, query, body):
    bucket = path[len('/upload/storage/v1/b/'):].split('/')[0]
    if bucket not in self.gcs.buckets:
      self._reply(404, {'error': {'code': 404, 'message': 'No such bucket'}})
      return
    if method == 'PUT' and 'upload_id' in query:
      self._put_session(query['upload_id'], body)
      return
    name = query.get('name', '')
    if query.get('ifGenerationMatch') == '0' and name in self.gcs.buckets[bucket].objects:
      self._reply(412, {'error': {'code': 412, 'message': 'Precondition Failed'}})
    elif query.get('uploadType') == 'media':
      self.gcs.put(bucket, name, body)
      self._reply(200, self.gcs._metadata(bucket, name))
    elif query.get('uploadType') == 'resumable':
      upload_id = str(next(self.gcs.ids))
      self.gcs.sessions[upload_id] = [bucket, name, bytearray(), False]
      location = ('https://www.googleapis.com/upload/storage/v1/b/%s/o?uploadType=resumable'
                  '&upload_id=%s' % (bucket, upload_id))
      self._reply(200, {}, [('Location', location)])
    else:
      self._reply(400, {'error': 'upload type not answered: %s' % self.path})

  def _put_session(self, upload_id, body):
    session = self.gcs.sessions.get(upload_id)
    if session is None:
      self._not_found()
      return
    bucket, name, data, done = session
    said = self.headers.get('Content-Range', '')
    total = None
    if said.startswith('bytes */'):  # a status query
      total = int(said[len('bytes */'):])
    elif said.startswith('bytes '):
      span, _, total = said[len('bytes '):].partition('/')
      first = int(span.split('-')[0])
      del data[first:]
      data += body
      total = int(total)
    else:  # no Content-Range: an empty file, whole
      data += body
      total = len(data)
    if not done and len(data) == total:
      self.gcs.put(bucket, name, data)
      session[3] = done = True
    if done:
      self._reply(200, self.gcs._metadata(bucket, name))
    else:
      self._reply(308, None, [('Range', 'bytes=0-%d' % (len(data) - 1))] if data else [])
