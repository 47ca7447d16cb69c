"""A test network: tasks at addresses of their own, on links that can be shaped and cut
(tests/test_dist_network.py's faults, and python -m benchmarks.net_rows's shaped links).

Everything lives inside one private network namespace (the lab), made by `unshare
--net --mount` and held by a process of its own, so that nothing the tests do reaches
any real network or this machine's own interfaces:

    lab (outer namespace): bridge br0, lo
      host `ps0`     (a namespace of its own): veth 10.77.0.2/24 <-> br0
      host `worker0` (...):                    veth 10.77.0.3/24 <-> br0
      ...

A task runs in its host's namespace (`lab.command(host, argv)`, which the tests' fork
server honours: forked, it joins the namespace before the program starts). Faults:
  cut(a, b) / mend(a, b)        every packet between two hosts dropped (a blackhole)
  reset(a, b) / mend(a, b)      every TCP packet from b to a answered with a reset
  link(host, up=False)          the host's interface down (a pulled cable)
  shape(host, rate)             tbf on both directions of the host's link
This kernel has no netem (`tc ... netem` says 'Specified qdisc kind is unknown'): no
delay or loss of its own, only what tbf's queue does (available() says what is missing).
Needs root, iproute2 (ip, tc) and iptables; .ci/run installs iptables.
"""
import json
import os
import shutil
import subprocess

SUBNET = '10.77.0.'          # host i is SUBNET + str(i + 2); the bridge has no address
BRIDGE = 'br0'
COMMAND_SECS = 20            # one ip, tc or iptables command


def available():
  """'' where the lab can be made here, else why not (the tests skip, saying so)."""
  if os.geteuid() != 0:
    return 'the test network needs root (network namespaces, veth, iptables)'
  missing = [tool for tool in ('unshare', 'nsenter', 'ip', 'tc', 'iptables')
             if shutil.which(tool) is None]
  if missing:
    return 'the test network needs %s (Debian: iproute2, iptables, util-linux)' % (
        ', '.join(missing))
  return ''


def rate_bytes(rate):
  """Bytes a second of a tc rate: '200mbit' -> 25e6, '1gbit' -> 125e6; None if not one."""
  for unit, scale in (('kbit', 1e3), ('mbit', 1e6), ('gbit', 1e9)):
    if rate.endswith(unit) and rate[:-len(unit)].replace('.', '', 1).isdigit():
      return float(rate[:-len(unit)]) * scale / 8
  return None


class Host:
  """One host of the lab: its name, address, and the namespace a task joins."""

  def __init__(self, lab, name, index):
    self.name, self.address = name, SUBNET + str(index + 2)
    self.inside = 'v%d' % index    # its end of the veth, in its namespace
    self.outside = 'b%d' % index   # the bridge's end, in the lab's
    self.netns = '/proc/%d/root/run/netns/%s' % (lab.pid, name)


class Lab:
  """The lab's namespace and its hosts; stop() ends it, and every namespace with it
  once the tasks in them have ended."""

  def __init__(self):
    os.makedirs('/run/netns', exist_ok=True)  # the mount point; the mount is the lab's own
    self._holder = subprocess.Popen(
        ['unshare', '--net', '--mount', '--propagation', 'private', '--kill-child', 'sh', '-c',
         'mount -t tmpfs lab-netns /run/netns && ip link set lo up && '
         'ip link add %s type bridge && ip link set %s up && echo ready && exec sleep 1d'
         % (BRIDGE, BRIDGE)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = self._holder.stdout.readline()
    if said != 'ready\n':
      self._holder.kill()
      raise AssertionError('the lab did not start: %r %s' % (said, self._holder.stderr.read()))
    self.pid = self._holder.pid
    self.hosts = {}

  def run(self, *argv):
    """Runs one command in the lab's namespaces (ip, tc, iptables); fails with its stderr."""
    done = subprocess.run(['nsenter', '-t', str(self.pid), '--net', '--mount', *argv],
                          capture_output=True, text=True, timeout=COMMAND_SECS)
    if done.returncode != 0:
      raise AssertionError('%s: %s' % (' '.join(argv), done.stderr.strip()))
    return done.stdout

  def add_host(self, name):
    """A host on the bridge, with an address of its own; returns its Host."""
    host = Host(self, name, len(self.hosts))
    self.run('ip', 'netns', 'add', name)
    self.run('ip', 'link', 'add', host.inside, 'type', 'veth', 'peer', 'name', host.outside)
    self.run('ip', 'link', 'set', host.inside, 'netns', name)
    self.run('ip', 'link', 'set', host.outside, 'master', BRIDGE, 'up')
    self.run('ip', '-n', name, 'addr', 'add', host.address + '/24', 'dev', host.inside)
    for device in ('lo', host.inside):
      self.run('ip', '-n', name, 'link', 'set', device, 'up')
    self.hosts[name] = host
    return host

  def command(self, host, argv):
    """argv run in host's namespace: `nsenter --net=... -- argv` (the fork server joins it
    itself, processes.start)."""
    return ['nsenter', '--net=' + host.netns, '--'] + list(argv)

  def _iptables(self, host, action, rule):
    self.run('ip', 'netns', 'exec', host.name, 'iptables', '-w', action, *rule)

  def cut(self, a, b):
    """Drops every packet between hosts a and b, both ways, silently."""
    for rule in self._cut_rules(b):
      self._iptables(a, '-I', rule)

  def reset(self, a, b):
    """Answers every TCP packet b sends to a with a reset, as a host that lost the
    connection's state does."""
    self._iptables(a, '-I', self._reset_rule(b))

  def mend(self, a, b):
    """Takes back cut() and reset() between a and b."""
    rules = self.run('ip', 'netns', 'exec', a.name, 'iptables', '-w', '-S')
    for rule in self._cut_rules(b) + [self._reset_rule(b)]:
      if ' '.join(rule) in rules:
        self._iptables(a, '-D', rule)

  @staticmethod
  def _cut_rules(b):
    return [['INPUT', '-s', b.address + '/32', '-j', 'DROP'],
            ['OUTPUT', '-d', b.address + '/32', '-j', 'DROP']]

  @staticmethod
  def _reset_rule(b):
    return ['INPUT', '-s', b.address + '/32', '-p', 'tcp', '-j', 'REJECT', '--reject-with',
            'tcp-reset']

  def link(self, host, up):
    """The host's interface up or down."""
    self.run('ip', '-n', host.name, 'link', 'set', host.inside, 'up' if up else 'down')

  def shape(self, host, rate):
    """tbf at rate (e.g. '200mbit') on the host's link, both directions. Its bucket holds
    10 ms of the rate (at least 64 KB): tc-tbf(8) asks for at least rate / HZ, and with
    64 KB at 1gbit the links ran at 40% of their rate (python -m benchmarks.net_rows,
    2026-12-02)."""
    burst = max(64 << 10, int(rate_bytes(rate) / 100))
    tbf = ['root', 'tbf', 'rate', rate, 'burst', str(burst), 'latency', '100ms']
    self.run('tc', 'qdisc', 'replace', 'dev', host.outside, *tbf)
    self.run('ip', 'netns', 'exec', host.name, 'tc', 'qdisc', 'replace', 'dev', host.inside,
             *tbf)

  def link_bytes(self, host):
    """(bytes sent, bytes received) so far on the host's interface."""
    stats = json.loads(self.run('ip', '-n', host.name, '-j', '-s', 'link', 'show',
                                host.inside))[0]['stats64']
    return stats['tx']['bytes'], stats['rx']['bytes']

  def stop(self):
    self._holder.kill()
    self._holder.wait()
    self._holder.stdout.close()
    self._holder.stderr.close()
