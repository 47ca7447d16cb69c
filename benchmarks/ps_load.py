"""python -m benchmarks.ps_load: the bytes each ps task moves per update, by ps count.

For each count of ps tasks, `dist_train.py --local_cluster=P,1 --synthetic` trains one
async worker; as each of its loss lines arrives, the bytes sent and received on every
TCP connection of each ps task's process are read with `ss` in the launcher's network
namespace (as root, a private one that holds this job alone). Past the warm-up, the
growth per global step is what that ps task moved for one update: the variables it
holds to the worker, their gradients back, and gRPC's framing. Prints one row per ps
count, each ps task's MB per update and the largest task's share of the update's bytes,
medians over --repeats runs.

    python -m benchmarks.ps_load                      # 1, 2 and 4 ps tasks
    python -m benchmarks.ps_load --ps 2 --repeats 3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from benchmarks.loss_lines import LOSS_LINE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PS_LINE = re.compile(r'^local cluster: ps (\S+), workers ')
SS_BYTES = re.compile(r'bytes_sent:(\d+).*bytes_received:(\d+)')
PID = re.compile(r'pid=(\d+),')
RUN_TIMEOUT_SECS = 300


def parse_args(argv):
  parser = argparse.ArgumentParser(prog='python -m benchmarks.ps_load', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--ps', default='1,2,4', help='ps counts to run, comma-separated')
  parser.add_argument('--warmup', type=int, default=10, help='global steps before measuring')
  parser.add_argument('--steps', type=int, default=30, help='global steps measured')
  parser.add_argument('--repeats', type=int, default=1, help='runs of each count; medians')
  return parser.parse_args(argv)


def bytes_by_port(launcher_pid, ports):
  """{port: bytes sent + received on every TCP connection of the process listening on
  it}, as `ss` sees them in the launcher's network namespace. By process, not by port:
  a ps task sends the variables on the connections workers opened to it, and fetches
  the gradients on connections it opened to them."""
  ns = ['nsenter', '-t', str(launcher_pid), '-n'] if _own_namespace(launcher_pid) else []
  listening = _ss(ns + ['ss', '-tlnpH'])
  pids = {port: PID.search(line).group(1) for port in ports for line in listening
          if re.search(r':%d\s' % port, line) and PID.search(line)}
  moved = dict.fromkeys(ports, 0)
  owner = None
  for line in _ss(ns + ['ss', '-tinpH']):  # a socket's line, then its indented counters
    counted = SS_BYTES.search(line)
    if not line[:1].isspace():
      owner = PID.search(line) and PID.search(line).group(1)
    elif counted and owner:
      for port in [port for port, pid in pids.items() if pid == owner]:
        moved[port] += int(counted.group(1)) + int(counted.group(2))
  return moved


def _ss(argv):
  """The lines `ss` prints; SystemExit in one line where it cannot run (no iproute2's ss,
  or nsenter without root)."""
  try:
    return subprocess.run(argv, capture_output=True, text=True,
                          check=True).stdout.splitlines()
  except (OSError, subprocess.CalledProcessError) as e:
    raise SystemExit('error: %s failed (%s); run as root with `ss` and `nsenter` '
                     '(iproute2, util-linux) installed' % (' '.join(argv), getattr(
                         e, 'stderr', None) or e)) from None


def _own_namespace(pid):
  return os.readlink('/proc/%d/ns/net' % pid) != os.readlink('/proc/self/ns/net')


def measure(num_ps, args):
  """[MB per update of ps task 0, 1, ...] for one run of num_ps ps tasks."""
  with tempfile.TemporaryDirectory(prefix='cifar10_ps_load_') as train_dir:
    argv = [sys.executable, '-u', os.path.join(ROOT, 'dist_train.py'),
            '--local_cluster=%d,1' % num_ps, '--synthetic', '--log_frequency=1',
            '--summary_steps=0', '--max_steps=%d' % (args.warmup + args.steps),
            '--train_dir=%s' % train_dir]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    ports, samples = [], []
    for line in proc.stdout:
      found = PS_LINE.match(line.strip())
      if found:
        ports = [int(host.rsplit(':', 1)[1]) for host in found.group(1).split(',')]
      found = LOSS_LINE.match(line.strip())
      if found and int(found.group('step')) >= args.warmup:
        samples.append((int(found.group('step')), bytes_by_port(proc.pid, ports)))
    if proc.wait(RUN_TIMEOUT_SECS) != 0 or len(samples) < 2:
      raise SystemExit('error: %s exited %d with %d loss lines past the warm-up'
                       % (' '.join(argv), proc.returncode, len(samples)))
  (first_step, first), (last_step, last) = samples[0], samples[-1]
  return [(last[port] - first[port]) / (last_step - first_step) / 1e6 for port in ports]


def main(argv):
  args = parse_args(argv)
  print('ps tasks | MB per update, each ps task (sent + received) | largest share')
  for num_ps in [int(count) for count in args.ps.split(',')]:
    runs = [measure(num_ps, args) for _ in range(args.repeats)]
    per_task = [statistics.median(run[task] for run in runs) for task in range(num_ps)]
    print('%8d | %s | %.0f%%' % (num_ps, ', '.join('ps%d %.2f' % (task, mb) for task, mb in
                                                    enumerate(per_task)),
                                 100 * max(per_task) / sum(per_task)))
    sys.stdout.flush()


if __name__ == '__main__':
  main(sys.argv[1:])
