"""--local_cluster: a whole ps/worker cluster of dist_train.py tasks on one machine.

    python dist_train.py --local_cluster=1,2 --max_steps=10000

dist_train.py calls run() once its flags are checked and the data is in place.
It moves into a private network namespace whose only interface is loopback
(where Linux permits), starts the ps tasks and the workers as subprocesses of
dist_train.py on free ports of 127.0.0.1, prints their output prefixed with
the task's name, and waits for them all to end: the workers once they have
trained, then the ps tasks, which end by themselves once every worker has said
it finished. It stops them on a failure, or on Ctrl-C or SIGTERM (the chief
first, so that it saves). Each task dies with this launcher, however it ends
(die_with). More tasks than the machine's memory holds are refused (check_memory).
"""
import ctypes
import errno
import fcntl
import glob
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from distributed import cluster_env
from training import errors, forked_run, machine, signals, startup, storage
from training import settings as trainer_settings

DIST_TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          'dist_train.py')
STOP_TASKS_SECS = 30         # SIGTERM to SIGKILL for tasks still running, as Kubernetes'
                             # grace: a ps task serves a save up to 15 s, then exits
STOP_CHIEF_SECS = 60         # stopped by a signal: the workers' last steps, the chief's save
END_SECS = 60                # once the workers (or the ps tasks) have ended, the others
                             # must end by themselves within this, or they are stopped
# dist_train.py's flags that say which task a process is: the launcher sets them itself
LAUNCHER_FLAGS = ['local_cluster', 'job_name', 'task_index', 'ps_hosts', 'worker_hosts',
                  'cluster', 'num_ps', 'slurm_port_base']
DIE_WITH_LAUNCHER_ENV = 'DIST_TRAIN_LAUNCHER_PID'  # set for the tasks this launcher starts
TASK_MEMORY_BYTES = 480e6    # one task's own memory (RssAnon), above a CIFAR-10 worker's
                             # at --batch_size=128 as measured (docs/distributed.md)
LIBRARY_MEMORY_BYTES = 430e6  # TensorFlow's library pages (RssFile): one copy, shared by
                              # every task of the machine; Slurm's MaxRSS counts them in
                              # each task (docs/distributed.md)

# Linux constants for enter_private_network(): <sched.h>, <linux/sockios.h>, <net/if.h>
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15                      # <linux/prctl.h>
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

# TensorFlow's lines that look like errors in every normal --local_cluster run: a
# notice at start-up, rendezvous cleaned up after some steps. The relay holds them
# back and shows them only if a task fails; so too everything but the workers' own
# last lines once a worker closes its session (FINAL_LINE): receives and queue runners
# cancelled as the sessions close, in many forms.
QUIET_LINES = (
    r'^WARNING: All log messages before absl::InitializeLog\(\) is called are written',
    r'^W\d{4} [\d:.]+ +\d+ local_rendezvous\.cc:\d+\] Local rendezvous is aborting with '
    r'status: ABORTED: Cleanup \d+ ',
    # oneDNN on (TensorFlow's default on CPUs with AVX512_VNNI and newer): its notice
    # speaks of round-off errors. (It and the banner above show at TF_CPP_MIN_LOG_LEVEL=0
    # only: the programs' default, 2, drops them, training/prelude.py.)
    r'^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\.',
)
FINAL_LINE = re.compile(
    r'^(worker \d+: closing the session |worker \d+ done: |Stopped by |Saved checkpoint |error: |'
    r'ps task \d+[: ]|[\d-]+ [\d:.]+: step \d+, loss = )')  # a worker's last loss line too
# Without an NVIDIA device on this machine, every task says it found no CUDA driver.
NO_GPU_LINES = (
    r'^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your '
    r'machine, GPU will not be used\.$',
    r'^E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: INTERNAL: CUDA '
    r'error: Failed call to cuInit: UNKNOWN ERROR \(303\)$',
)


def enter_private_network():
  """Moves this process into a new network namespace whose only interface is loopback.

  Linux only. Every process started from here on shares it: the tasks reach each
  other on 127.0.0.1, and no one outside the namespace, not even another process
  on this machine, can reach their ports. TensorFlow's servers listen on all
  interfaces; here the only one is loopback. As root this needs CLONE_NEWNET
  alone; otherwise a user namespace too (CLONE_NEWUSER), mapping this user to
  itself, which Linux grants only to a single-threaded process.

  Returns:
    None once inside, or why it was not possible (str) and nothing has changed.

  Raises:
    errors.TrainingError: the namespace was made but its loopback could not be
      brought up.
  """
  if not sys.platform.startswith('linux'):
    return 'network namespaces are Linux only'
  libc = ctypes.CDLL(None, use_errno=True)
  as_root = os.geteuid() == 0
  if libc.unshare(CLONE_NEWNET if as_root else CLONE_NEWUSER | CLONE_NEWNET) != 0:
    error = ctypes.get_errno()
    threads = len(os.listdir('/proc/self/task'))
    if not as_root and error == errno.EINVAL and threads > 1:
      return ('a user namespace needs a single-threaded process, and TensorFlow has '
              'started %d threads in this one; run as root to get one' % threads)
    return 'unshare(%s) failed: %s' % ('CLONE_NEWNET' if as_root else
                                       'CLONE_NEWUSER | CLONE_NEWNET', os.strerror(error))
  try:
    if not as_root:  # this user stays itself inside; setgroups must go before gid_map
      for name, text in (('setgroups', 'deny'), ('uid_map', '%d %d 1' % ((os.geteuid(),) * 2)),
                         ('gid_map', '%d %d 1' % ((os.getegid(),) * 2))):
        with open('/proc/self/%s' % name, 'w') as f:
          f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
      ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack('16sh22x', b'lo', 0))
      lo_flags = struct.unpack('16sh22x', ifreq)[1]
      fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack('16sh22x', b'lo', lo_flags | IFF_UP))
  except OSError as e:
    raise errors.TrainingError('--local_cluster made a private network namespace but '
                                     'could not bring its loopback interface up: %s'
                                     % e) from None
  return None


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1, found by binding port 0."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def task_command(job_name, task_index, ps_hosts, worker_hosts, extra_flags=()):
  """The argv that starts one task of the cluster with this script."""
  return [sys.executable, '-u', DIST_TRAIN, '--job_name=%s' % job_name,
          '--task_index=%d' % task_index, '--ps_hosts=%s' % ','.join(ps_hosts),
          '--worker_hosts=%s' % ','.join(worker_hosts)] + list(extra_flags)


def _say_failed(relay, name, code):
  """The lines of a task that failed: TensorFlow's held back, then which, then its error."""
  relay.show_held()
  print('local cluster: %s exited with %d; stopping the other tasks' % (name, code),
        flush=True)
  # Last, so that a log cut to its end still says why (the held lines come before).
  error = relay.last_error(name)
  if error:
    print('local cluster: %s said: %s' % (name, error), flush=True)


def launch_local_cluster(num_ps, num_workers, extra_flags, stop):
  """Runs num_ps ps tasks and num_workers workers on 127.0.0.1, printing their logs.

  Returns 0 once every task has exited 0: the workers, then the ps tasks, which
  end by themselves when every worker has reported that it finished. Returns 1 as
  soon as any task fails, or when some tasks are still running END_SECS after the
  others (the workers, or the ps tasks) have all ended. On a stop signal the workers
  stop together, the chief saving the step they left (stop_workers), then the ps
  tasks; returns stop.exit_code. Every task still running is then stopped.
  """
  ports = free_ports(num_ps + num_workers)
  ps_hosts = ['127.0.0.1:%d' % p for p in ports[:num_ps]]
  worker_hosts = ['127.0.0.1:%d' % p for p in ports[num_ps:]]
  print('local cluster: %sworkers %s' % ('ps %s, ' % ','.join(ps_hosts) if ps_hosts else '',
                                         ','.join(worker_hosts)), flush=True)
  relay = Relay()
  tasks = {}  # 'ps0' -> Popen, in start order
  try:
    start_tasks(tasks, relay, ps_hosts, worker_hosts, extra_flags)
    one_side_ended = None  # when every worker, or every ps task, had ended
    while not stop.requested:
      ended = {name: p.returncode for name, p in tasks.items() if p.poll() is not None}
      failed = [name for name, code in ended.items() if code != 0]
      if failed:
        _say_failed(relay, failed[0], ended[failed[0]])
        return 1
      if len(ended) == len(tasks):
        then = ', then the %d ps task(s) by themselves' % num_ps if num_ps else ''
        print('local cluster: all %d workers finished%s' % (num_workers, then), flush=True)
        return 0
      running = [name for name in tasks if name not in ended]
      if one_side_ended is None and (all(name.startswith('ps') for name in running) or
                                     all(name.startswith('worker') for name in running)):
        one_side_ended = time.time()
      if one_side_ended and time.time() - one_side_ended > END_SECS:
        relay.show_held()
        print('local cluster: %s still running %d s after the others ended; stopping it'
              % (','.join(running), END_SECS), flush=True)
        return 1
      time.sleep(0.2)
    stop_workers(tasks, stop)
    stop_tasks(tasks.values())
    print('local cluster: stopped; exit codes: %s' % ', '.join(
        '%s %s' % (name, exit_status(p.returncode)) for name, p in tasks.items()), flush=True)
    return stop.exit_code
  finally:
    stop_tasks(tasks.values())
    relay.join()


def start_tasks(tasks, relay, ps_hosts, worker_hosts, extra_flags):
  """Starts every task, the ps tasks first, into tasks ({'ps0': process}), each relayed.

  Forked from this launcher, which has loaded TensorFlow, where that is safe
  (training/forked_run.py): each task runs dist_train.py from its first line as a fresh
  `python dist_train.py --job_name=...` would, without loading TensorFlow again (a
  first loss line 1.9 s after the start, not 6.2 s: docs/distributed.md). Where it is
  not (a GPU: CUDA does not survive a fork), fresh interpreters. `ps` shows a forked
  task with this launcher's command line: its name (ps0, worker1) is its process name,
  as `top` and `pgrep` show it, and the launcher prints each task's pid.
  One process group of their own: a Ctrl-C in the terminal reaches this launcher
  alone, which stops the tasks in order. They die with it (die_with); the variable
  marks them as its tasks.
  """
  env = dict(os.environ, **{DIE_WITH_LAUNCHER_ENV: str(os.getpid())})
  why_fresh = forked_run.fork_safe()
  for job_name, hosts in (('ps', ps_hosts), ('worker', worker_hosts)):
    for i in range(len(hosts)):
      name = '%s%d' % (job_name, i)
      argv = task_command(job_name, i, ps_hosts, worker_hosts, extra_flags)
      group = next(iter(tasks.values())).pid if tasks else 0  # the first task's
      if why_fresh:
        tasks[name] = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, process_group=group,
            preexec_fn=die_with(os.getpid()))
      else:
        tasks[name] = ForkedTask(name, argv, env, group, [t.stdout for t in tasks.values()])
  for name, process in tasks.items():  # after the forks: the launcher had no thread
    relay.start(name, process.stdout)
  print('local cluster: started %s; %s' % (
      ', '.join('%s (pid %d)' % (name, p.pid) for name, p in tasks.items()),
      'each loads TensorFlow before its first line, as %s' % why_fresh if why_fresh else
      'forked from this launcher, which has loaded TensorFlow'), flush=True)


class ForkedTask:
  """A task forked from this launcher (training/forked_run.py), with as much of Popen's
  interface as the launcher uses: pid, stdout (its stdout and stderr, text), poll, wait,
  send_signal, terminate, kill, returncode."""

  def __init__(self, name, argv, env, group, other_pipes):
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
      try:
        become_task(name, argv, env, group, launcher, write_end,
                    [read_end] + [pipe.fileno() for pipe in other_pipes])
      finally:
        os._exit(70)  # not reached: run_script ends in os._exit
    os.close(write_end)
    try:
      os.setpgid(pid, group or pid)  # as the child does: whichever runs first
    except OSError:  # the child has, and has exited already
      pass
    self.pid, self.returncode, self.args = pid, None, argv
    self.stdout = open(read_end, 'r', buffering=1)

  def poll(self):
    if self.returncode is None:
      pid, status = os.waitpid(self.pid, os.WNOHANG)
      if pid:
        self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def wait(self, timeout=None):
    deadline = None if timeout is None else time.time() + timeout
    while self.poll() is None:
      if deadline is not None and time.time() > deadline:
        raise subprocess.TimeoutExpired(self.args, timeout)
      time.sleep(0.05)
    return self.returncode

  def send_signal(self, signum):
    if self.poll() is None:
      os.kill(self.pid, signum)

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def kill(self):
    self.send_signal(signal.SIGKILL)


def become_task(name, argv, env, group, launcher, output, launcher_fds):
  """In a forked task: what die_with and Popen would give it, then dist_train.py."""
  die_with(launcher)()
  os.setpgid(0, group)
  ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15])
  for fd in launcher_fds:
    os.close(fd)
  null = os.open(os.devnull, os.O_RDONLY)
  for target, fd in ((0, null), (1, output), (2, output)):
    os.dup2(fd, target)
  os.close(null)
  os.close(output)
  forked_run.run_script(argv, env, os.getcwd())


def stop_workers(tasks, stop):
  """Passes the stop signal on to every worker at once, as a cluster manager stops a job,
  and waits for them: they stop together (distributed/run_match.py), the chief saving
  the step the others left (sync: a step left waiting for their gradients is handed a
  token); then the ps tasks, which serve until it has, go.
  """
  print('local cluster: %s: stopping the workers; worker 0, the chief, saves the step '
        'they leave; then the ps tasks' % stop.name, flush=True)
  running = [p for name, p in tasks.items() if name.startswith('worker') and p.poll() is None]
  for process in running:
    process.send_signal(stop.signum)
  deadline = time.time() + STOP_CHIEF_SECS
  for process in running:
    try:
      process.wait(max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
      print('local cluster: a worker has not stopped within %d s; stopping every task '
            'without waiting for it' % STOP_CHIEF_SECS, flush=True)
      return


def exit_status(returncode):
  """143, or 'killed by SIGKILL' (Popen's negative return codes)."""
  if returncode is not None and returncode < 0:
    return 'killed by %s' % signal.Signals(-returncode).name
  return str(returncode)


def stop_tasks(processes):
  """SIGTERM to every process still running, SIGKILL to those left after STOP_TASKS_SECS."""
  for process in processes:
    if process.poll() is None:
      process.terminate()
  deadline = time.time() + STOP_TASKS_SECS
  for process in processes:
    try:
      process.wait(max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


class Relay:
  """Prints each task's output, line by line, as '[worker1] ...'.

  Lines TensorFlow prints in every normal run that look like errors and are not
  (QUIET_LINES, and all but FINAL_LINEs once a worker closes its session) are held
  back; show_held() prints them when a task has failed, where they may say why.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._readers, self._held = {}, []
    self._errors = {}  # task name -> its last 'error: ' line
    self._finishing = False  # a worker closes its session: the others' steps are cancelled
    self._quiet = re.compile('|'.join(QUIET_LINES + (
        [] if glob.glob('/dev/nvidia*') else NO_GPU_LINES)))

  def start(self, name, stream):
    self._readers[name] = threading.Thread(target=self._relay, args=(name, stream),
                                           daemon=True)
    self._readers[name].start()

  def _relay(self, name, stream):
    held = False  # a held line's continuation lines start with a tab
    for line in stream:
      final = FINAL_LINE.match(line)
      held = not final and (self._finishing or bool(self._quiet.search(line)) or
                            (held and line.startswith('\t')))
      if final and 'closing the session' in line:
        self._finishing = True
      if line.startswith('error: '):
        self._errors[name] = line.rstrip('\n')
      with self._lock:
        if held:
          self._held.append('[%s] %s' % (name, line))
        else:
          sys.stdout.write('[%s] %s' % (name, line))
          sys.stdout.flush()

  def show_held(self):
    with self._lock:
      if self._held:
        print('local cluster: TensorFlow lines held back until now:\n%s'
              % ''.join(self._held), end='', flush=True)
      self._held = []

  def last_error(self, name):
    """Task `name`'s last 'error: ...' line, or None; read to its end (it has exited)."""
    self._readers[name].join(STOP_TASKS_SECS)
    return self._errors.get(name)

  def join(self):
    for reader in self._readers.values():
      reader.join(STOP_TASKS_SECS)


def die_with(launcher_pid):
  """Popen's preexec_fn for a task: it dies with its launcher, however the launcher ends.

  Run in the task between fork and exec: Linux is asked to SIGKILL the task when
  the launcher dies (PR_SET_PDEATHSIG, which exec keeps), then the task exits if
  the launcher has already died (it then has another parent). So a launcher killed
  at any moment leaves no task. Set by the task itself once it ran, this left
  orphans: a task imports TensorFlow for seconds before it runs a line of its own
  (minutes while hundreds start), and one whose launcher died meanwhile ran on.

  Returns:
    a function of no arguments, or None where this is not Linux.
  """
  if not sys.platform.startswith('linux'):
    return None
  prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
  kill = int(signal.SIGKILL)

  def preexec():
    prctl(PR_SET_PDEATHSIG, kill)
    if os.getppid() != launcher_pid:
      os._exit(1)  # pylint: disable=protected-access
  return preexec


def check_memory(num_ps, num_workers, available_bytes):
  """ValueError naming the estimate and the limit unless the tasks fit in memory.

  Each task needs about TASK_MEMORY_BYTES of its own, whatever it trains (more
  at larger batches): --local_cluster=1,1000 once took all 24 GB of a machine.

  Args:
    num_ps, num_workers: ints, --local_cluster's P and W.
    available_bytes: int, machine.memory_available(); None (not Linux) checks nothing.
  """
  num_tasks = num_ps + num_workers
  needed = num_tasks * TASK_MEMORY_BYTES + LIBRARY_MEMORY_BYTES
  if available_bytes is None or needed <= available_bytes:
    return
  most = int((available_bytes - LIBRARY_MEMORY_BYTES) // TASK_MEMORY_BYTES)
  raise ValueError(
      '--local_cluster=%d,%d starts %d TensorFlow tasks, about %.1f GB of memory (%d x %d MB '
      'of their own, what a CIFAR-10 worker was measured to use, and %d MB of TensorFlow\'s '
      'library that they share), and this machine has %.1f GB available; %s, or run the '
      'tasks on several machines with --job_name, --ps_hosts and --worker_hosts'
      % (num_ps, num_workers, num_tasks, needed / 1e9, num_tasks, TASK_MEMORY_BYTES / 1e6,
         LIBRARY_MEMORY_BYTES / 1e6, available_bytes / 1e9,
         'start at most %d here, e.g. --local_cluster=1,%d' % (most, most - 1)
         if most >= 2 else 'free some memory'))


def parse_spec(value):
  """--local_cluster's 'P,W' -> (P, W); ValueError naming the value unless P >= 0 (0:
  all-reduce) and W >= 1."""
  try:
    num_ps, num_workers = [int(n) for n in value.split(',')]
  except ValueError:
    num_ps, num_workers = -1, 0
  if num_ps < 0 or num_workers < 1:
    raise ValueError('--local_cluster takes P,W with at least 0 ps tasks (0: --all_reduce) '
                     'and 1 worker, e.g. --local_cluster=1,2; got %r' % value)
  return num_ps, num_workers


def run(num_ps, num_workers, task_flags, exposure_warning, stop=None):
  """Starts the cluster in a private network where possible; returns the exit code.

  Args:
    num_ps, num_workers: ints >= 1.
    task_flags: list of '--flag=value' strings every task gets.
    exposure_warning: the line to print when the tasks' ports cannot be private.
    stop: the launcher's signals.StopSignals, or None for one of its own.
  """
  why_not = enter_private_network()
  if why_not:
    print('%s\nlocal cluster: the tasks cannot have a private network here (%s): their '
          'ports are open on every interface of this machine while they run.'
          % (exposure_warning, why_not), flush=True)
  else:
    print('local cluster: the tasks run in a private network namespace whose only '
          'interface is loopback: nothing outside it, on this machine or another, can '
          'reach their ports.', flush=True)
  stop = stop or signals.StopSignals()
  try:
    return launch_local_cluster(num_ps, num_workers, task_flags, stop)
  except KeyboardInterrupt:  # a second signal
    print('local cluster: stopped by a second %s: every task was stopped, the chief '
          'perhaps before it saved' % stop.name, flush=True)
    return stop.exit_code


def main(flag_values, data_input):
  """dist_train.py --local_cluster=P,W: its checks and the data, then run(); the exit code.

  data_input: the --dataset's input module, which prepares the data once for every task.

  Raises errors.TrainingError (a flag, a spec, more tasks than memory holds) and what
  the data's preparation raises: dist_train.py's main says them in one line.
  """
  for name in LAUNCHER_FLAGS[1:]:
    if flag_values[name].present:
      raise errors.TrainingError('--local_cluster starts every task itself on 127.0.0.1; '
                                 'drop --%s' % name)
  try:
    num_ps, num_workers = parse_spec(flag_values.local_cluster)
    check_memory(num_ps, num_workers, machine.memory_available())
    for misfit in (cluster_env.mode_misfit(num_ps, flag_values.all_reduce),
                   cluster_env.too_many_replicas(flag_values.replicas_to_aggregate,
                                                 num_workers)):
      if misfit:
        raise ValueError(misfit)
  except ValueError as e:
    raise errors.TrainingError(str(e)) from None
  settings = trainer_settings.settings_from_flags(flag_values)
  for flag, path in (('--train_dir', settings.train_dir), ('--data_dir', settings.data_dir)):
    if not storage.is_local(path) and not (flag == '--data_dir' and settings.synthetic):
      raise errors.TrainingError(
          '%s=%s: --local_cluster runs its tasks in a private network namespace whose only '
          'interface is loopback, where object storage cannot be reached. Give local '
          'paths, or start the tasks yourself with TF_CONFIG (docs/distributed.md).'
          % (flag, path))
  # The data once, here, rather than racing in every worker; a signal stops its download.
  stop = signals.StopSignals()
  startup.prepare_data(settings, data_input, stop)
  # Every flag given on this command line goes to every task.
  task_flags = [flag_values[name].serialize() for name in flag_values
                if flag_values[name].present and flag_values[name].name not in LAUNCHER_FLAGS]
  return run(num_ps, num_workers, list(dict.fromkeys(task_flags)),
             cluster_env.SECURITY_WARNING % 'the ports listed below', stop)
