"""What this machine has, read in one place: its CPU's flags and what they decide
(oneDNN on or off), its GPUs, its bfloat16 units, the memory a step may use.

oneDNN on or off is chosen before TensorFlow is imported: TensorFlow reads
TF_ENABLE_ONEDNN_OPTS once. Every program calls choose(sys.argv) before its first
`import tensorflow`, through training/prelude.py:

    from training import prelude
    if __name__ == '__main__':
      prelude.start(sys.argv)  # Python 3.11+, then machine.choose(sys.argv), then TensorFlow

Who wins, first first:
  1. TF_ENABLE_ONEDNN_OPTS set by the user: TensorFlow reads it, so it stands;
     start-up says it overrode --onednn.
  2. --onednn=on or --onednn=off on the command line (read here from argv: absl
     parses its flags only after TensorFlow is imported; the programs still define
     the flag, so absl accepts it and --helpshort lists it).
  3. --onednn=auto, the default: on where it was measured faster for the CIFAR-10
     model (x86 with AVX2 but none of the instructions below, where TensorFlow 2.21
     leaves it off: the table of python -m benchmarks, docs/performance.md); TensorFlow's
     own choice elsewhere (it turns oneDNN on itself on CPUs with those
     instructions; other architectures were not measured).
--seed takes the same choice: with oneDNN on, as with it off, two runs of one seed
are bit-identical, a resumed run equals an uninterrupted one, and a tower split
agrees with one tower on the joined batch over the first steps; beyond them a split
drifts under either, as rounding differences are amplified (tests/test_seed.py,
tests/test_onednn.py; docs/trainer.md "Runs that repeat exactly").

Imports no TensorFlow at its top (prelude reads the CPU here before TensorFlow
loads): the functions that ask TensorFlow import it themselves.
"""
import collections
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

ENV = 'TF_ENABLE_ONEDNN_OPTS'        # TensorFlow reads it once, at import
SET_HERE_ENV = 'CIFAR10_ONEDNN_SET'  # the value choose() gave ENV, so that the tasks a
                                     # program starts (--local_cluster) tell it from the user's
CHOICES = ('auto', 'on', 'off')

# ---- What "auto" rests on: edit when a new measurement says otherwise ------------
# Any of these and TensorFlow 2.21 turns oneDNN on by itself (/proc/cpuinfo names).
TF_ON_WITH = ('avx512_vnni', 'avx512_bf16', 'avx_vnni', 'amx_tile', 'amx_bf16', 'amx_int8')
MEASURED_FASTER_WITH = 'avx2'        # ... and without them: measured faster, so on
MEASURED_SPEEDUP = 1.4               # ours, one tower, synthetic, oneDNN on over off, as
                                     # the start-up line says it (docs/performance.md)
X86 = ('x86_64', 'amd64', 'i386', 'i686')


def define_flag(module_name, flag_values=None):
  """--onednn, as every program takes it, defined as module_name's own (the caller's
  __name__: its --helpshort lists it). choose() reads it from argv, before TensorFlow."""
  from absl import flags  # absl only: this module is read before TensorFlow
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if module_name == '__main__':  # absl names a program's own module after its file
    module_name = sys.argv[0]
  flags.DEFINE_enum('onednn', 'auto', CHOICES, 'TensorFlow\'s oneDNN kernels. auto: on where '
                    'measured faster for the CIFAR-10 model (x86 with AVX2), else '
                    'TensorFlow\'s default. TF_ENABLE_ONEDNN_OPTS, if set, wins. Read before '
                    'TensorFlow loads.', flag_values=flag_values, module_name=module_name)
# bfloat16 units (/proc/cpuinfo names): TensorFlow's CPU kernels use them through oneDNN
# only (--use_bf16: training/mixed_precision.py's bfloat16_units).
BFLOAT16_FLAGS = ('avx512_bf16', 'amx_bf16')

Choice = collections.namedtuple('Choice', [
    'on',    # True or False: what TensorFlow does; None: TensorFlow's own default
    'how',   # 'environment', 'flag', 'auto', or 'imported' (too late to choose)
    'why',   # the reason, for start-up and the run record
])

_chosen = None  # the Choice of this process, once choose() has run


def flag_value(argv):
  """--onednn's value on a command line ('--onednn=on', '--onednn on'); 'auto' if absent.

  A value absl will refuse (--onednn=maybe) counts as absent here: absl stops the
  run, naming it, before anything is written.
  """
  value = 'auto'
  for i, arg in enumerate(argv[1:], 1):
    if arg == '--':
      break
    if arg.startswith('--onednn='):
      value = arg.split('=', 1)[1]
    elif arg == '--onednn' and i + 1 < len(argv):
      value = argv[i + 1]
  return value if value in CHOICES else 'auto'


def cpu_flags(path='/proc/cpuinfo'):
  """The CPU's instruction-set flags ({'avx2', 'fma', ...}); empty when unreadable."""
  try:
    with open(path) as f:
      for line in f:
        if line.startswith('flags'):
          return set(line.split(':', 1)[1].split())
  except OSError:
    pass
  return set()


def decide(flag, environ, machine, flags_of_cpu):
  """Which oneDNN setting wins, and why. Pure: the caller reads the machine.

  Args:
    flag: --onednn's value, 'auto', 'on' or 'off'.
    environ: the environment (a dict), as the user started the program.
    machine: platform.machine(), e.g. 'x86_64', 'aarch64'.
    flags_of_cpu: set of the CPU's instruction-set flags (cpu_flags()).

  Returns:
    a Choice.
  """
  user_value = environ.get(ENV, '')
  if user_value and user_value != environ.get(SET_HERE_ENV):
    on = user_value.strip().lower() in ('1', 'true')
    overrides = '' if flag == 'auto' else ', which wins over --onednn=%s' % flag
    return Choice(on, 'environment', '%s=%s set in the environment%s'
                  % (ENV, user_value, overrides))
  if flag in ('on', 'off'):
    return Choice(flag == 'on', 'flag', '--onednn=%s' % flag)
  tf_default = tensorflow_default(machine, flags_of_cpu)
  if tf_default is None:
    return Choice(None, 'auto', 'auto, TensorFlow\'s default on %s (not measured here)'
                  % machine)
  if tf_default:
    return Choice(True, 'auto', 'auto, TensorFlow\'s default on CPUs with %s' % '/'.join(
        sorted(f.upper() for f in flags_of_cpu & set(TF_ON_WITH))))
  if MEASURED_FASTER_WITH in flags_of_cpu:
    return Choice(True, 'auto', 'auto, measured %.1fx faster for the CIFAR-10 model on CPUs '
                  'with %s and without AVX512_VNNI (python -m benchmarks)'
                  % (MEASURED_SPEEDUP, MEASURED_FASTER_WITH.upper()))
  return Choice(False, 'auto', 'auto, TensorFlow\'s default on CPUs without %s (not '
                'measured here)' % MEASURED_FASTER_WITH.upper())


def tensorflow_default(machine, flags_of_cpu):
  """TensorFlow 2.21's own setting with TF_ENABLE_ONEDNN_OPTS unset: True or False on
  x86, None elsewhere (not known here)."""
  if machine.lower() not in X86:
    return None
  return bool(flags_of_cpu & set(TF_ON_WITH))


def choose(argv, environ=None, tensorflow_imported=None):
  """Decides oneDNN for this process and sets TF_ENABLE_ONEDNN_OPTS to match; returns it.

  Call before TensorFlow is imported. Once TensorFlow is in, its setting stands:
  the Choice says so and nothing is set. The first call decides; later calls
  return the same Choice.

  Args:
    argv: the command line (sys.argv), for --onednn.
    environ: the environment to read and set; default os.environ.
    tensorflow_imported: whether it is too late; default: 'tensorflow' in sys.modules.
  """
  global _chosen
  if _chosen is not None:
    return _chosen
  environ = os.environ if environ is None else environ
  if tensorflow_imported is None:
    tensorflow_imported = 'tensorflow' in sys.modules
  if tensorflow_imported:
    _chosen = current(environ)
    return _chosen
  _chosen = apply(decide(flag_value(argv), environ, platform.machine(), cpu_flags()), environ)
  return _chosen


def apply(choice, environ):
  """Sets TF_ENABLE_ONEDNN_OPTS in environ as choice says (and SET_HERE_ENV, to tell
  it from the user's); a user's own value stays. Returns choice."""
  if choice.how != 'environment':
    if choice.on is None:
      environ.pop(ENV, None)
      environ.pop(SET_HERE_ENV, None)
    else:
      environ[ENV] = environ[SET_HERE_ENV] = '1' if choice.on else '0'
  return choice


def current(environ=None):
  """The Choice in force: choose()'s, or, in a process that never called it (a test,
  a notebook), what TensorFlow read from the environment at import."""
  if _chosen is not None:
    return _chosen
  environ = os.environ if environ is None else environ
  value = environ.get(ENV, '')
  if value:
    return Choice(value.strip().lower() in ('1', 'true'), 'imported',
                  '%s=%s when TensorFlow was imported' % (ENV, value))
  return Choice(tensorflow_default(platform.machine(), cpu_flags()), 'imported',
                '%s unset when TensorFlow was imported: TensorFlow\'s default' % ENV)


def start_line(choice=None):
  """'oneDNN on: auto, measured 1.4x faster ...', the start-up line."""
  choice = choice or current()
  state = {True: 'on', False: 'off', None: 'as TensorFlow decides'}[choice.on]
  return 'oneDNN %s: %s' % (state, choice.why)


def record(choice=None):
  """The run record's entry: {'on': ..., 'how': ..., 'why': ...}."""
  return dict((choice or current())._asdict())


# ---- GPUs ------------------------------------------------------------------------
NVIDIA_SMI_SECS = 30  # nvidia-smi answers in well under a second on a healthy driver


def list_gpus():
  """tf.config.list_physical_devices('GPU'), without one misleading line.

  Call it first thing in a program: whatever first looks for GPUs prints the
  line (absl's app.run does, through TensorFlow's start-up hooks).

  On a machine with no NVIDIA driver (no /dev/nvidia* device), TensorFlow's CUDA
  build prints `E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)` here: it
  found no driver library, which is the normal state of such a machine. That one
  line is held back there; every other line, and every line on a machine with a
  driver, goes to stderr as TensorFlow wrote it.
  """
  import tensorflow as tf  # only when asked: this module loads before TensorFlow
  if glob.glob('/dev/nvidia[0-9]*'):
    return tf.config.list_physical_devices('GPU')
  sys.stderr.flush()
  saved_stderr = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      gpus = tf.config.list_physical_devices('GPU')
    finally:
      os.dup2(saved_stderr, 2)
      os.close(saved_stderr)
    captured.seek(0)
    for line in captured.read().decode('utf-8', 'replace').splitlines(True):
      if not re.search(r'failed call to cuInit: .*\(303\)', line):
        sys.stderr.write(line)
  return gpus


def machine_gpus(environ=None):
  """How many GPUs the NVIDIA driver shows: `nvidia-smi --list-gpus`'s, or else the
  /dev/nvidia0.. devices; 0 on a machine without it."""
  environ = os.environ if environ is None else environ
  nvidia_smi = shutil.which('nvidia-smi', path=environ.get('PATH'))
  if nvidia_smi:
    try:
      listed = subprocess.run([nvidia_smi, '--list-gpus'], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_SECS).stdout
      return sum(line.startswith('GPU ') for line in listed.splitlines())
    except (OSError, subprocess.SubprocessError):
      pass
  return len(glob.glob('/dev/nvidia[0-9]*'))


def cuda_advice(environ=None, built_with_cuda=None):
  """For a machine with GPUs where TensorFlow sees none: one line saying what to install.

  The GPUs are the driver's (machine_gpus()), or CUDA_VISIBLE_DEVICES naming some.
  Returns '' when there are none to use: a machine without GPUs needs no advice.

  Args:
    environ: the environment (PATH, CUDA_VISIBLE_DEVICES); os.environ by default.
    built_with_cuda: bool; default tf.test.is_built_with_cuda().
  """
  import tensorflow as tf  # only when asked: this module loads before TensorFlow
  environ = os.environ if environ is None else environ
  on_machine = machine_gpus(environ)
  visible = environ.get('CUDA_VISIBLE_DEVICES', '').strip()
  if not on_machine and visible in ('', '-1'):
    return ''
  which = ('nvidia-smi lists %d GPU(s)' % on_machine if on_machine else
           'CUDA_VISIBLE_DEVICES=%s names GPUs' % visible)
  install = 'pip install "tensorflow[and-cuda]==%s"' % tf.__version__
  if not (tf.test.is_built_with_cuda() if built_with_cuda is None else built_with_cuda):
    return ('%s, but this TensorFlow is built without CUDA: for NVIDIA GPUs on Linux, '
            '%s (README "GPUs")' % (which, install))
  return ('%s, but TensorFlow finds none: %s brings the CUDA %s libraries it needs, with an '
          'NVIDIA driver for CUDA 12; TF_CPP_MIN_LOG_LEVEL=0 shows what it found '
          '(README "GPUs")' % (which, install, tf.sysconfig.get_build_info().get(
              'cuda_version', '12')))


# ---- bfloat16 units ---------------------------------------------------------------
BFLOAT16_GPU_CAPABILITY = (8, 0)  # compute capability with bfloat16 tensor cores (A100 on)


BFloat16Units = collections.namedtuple('BFloat16Units', [
    'ok',    # bool: the towers' devices compute bfloat16 at speed
    'what',  # str: what does ('this CPU's AVX512_BF16 through oneDNN'), or why not
])


def bfloat16_units(on_gpus, gpu_capabilities, cpu_flags, onednn_on):
  """Whether the towers' devices have bfloat16 units. Pure: bfloat16_units_here() reads
  the machine.

  Without them bfloat16 is emulated, slower than float32: on a CPU whose
  AVX512_BF16 only oneDNN uses, many times float32's step with oneDNN off
  (docs/trainer.md, "bfloat16").

  Args:
    on_gpus: bool, the towers run on GPUs (placement.tower_devices found enough).
    gpu_capabilities: [(major, minor)], the compute capability of each tower's GPU.
    cpu_flags: set of the CPU's /proc/cpuinfo flags (cpu_flags()).
    onednn_on: oneDNN in this process (current().on): True, False or None.

  Returns:
    BFloat16Units.
  """
  if on_gpus:
    for i, capability in enumerate(gpu_capabilities):
      if tuple(capability) < BFLOAT16_GPU_CAPABILITY:
        return BFloat16Units(False, 'GPU %d has compute capability %d.%d, and bfloat16 '
                             'units came with %d.%d (--use_fp16 suits it)' % (
                                 (i,) + tuple(capability) + BFLOAT16_GPU_CAPABILITY))
    return BFloat16Units(True, 'GPUs of compute capability %s' % ', '.join(
        sorted({'%d.%d' % tuple(capability) for capability in gpu_capabilities})))
  found = [flag.upper() for flag in BFLOAT16_FLAGS if flag in cpu_flags]
  if not found:
    return BFloat16Units(False, 'this CPU has no bfloat16 units (no %s in /proc/cpuinfo), '
                         'and emulated bfloat16 runs slower than float32'
                         % ' or '.join(BFLOAT16_FLAGS))
  if not onednn_on:
    return BFloat16Units(False, 'oneDNN is off, and only oneDNN runs bfloat16 on this '
                         'CPU\'s %s (without it, 10x slower than float32 here); turn it on '
                         '(--onednn=on)' % '/'.join(found))
  return BFloat16Units(True, 'this CPU\'s %s through oneDNN' % '/'.join(found))


def bfloat16_units_here(num_towers):
  """bfloat16_units() of this machine, for towers placed as placement.tower_devices
  places them."""
  import tensorflow as tf  # only when asked: this module loads before TensorFlow
  gpus = list_gpus()
  on_gpus = len(gpus) >= num_towers
  capabilities = [tf.config.experimental.get_device_details(gpu).get(
      'compute_capability', (0, 0)) for gpu in gpus[:num_towers]] if on_gpus else []
  return bfloat16_units(on_gpus, capabilities, cpu_flags(), current().on)


# ---- Memory -----------------------------------------------------------------------
MEMINFO = '/proc/meminfo'
CGROUP_ROOT = '/sys/fs/cgroup'  # cgroup v2 here; v1 under memory/
PROC_CGROUP = '/proc/self/cgroup'
CGROUP_V1_UNLIMITED = 2 ** 60   # v1 writes "no limit" as a page-aligned 2**63 - 1


def memory_available(meminfo=MEMINFO, cgroup_root=CGROUP_ROOT, proc_cgroup=PROC_CGROUP):
  """Bytes this process can still allocate: the smaller of what the machine has
  free and what its memory cgroup (a container's limit) still allows.

  The machine: MemAvailable of /proc/meminfo (free memory plus the page cache
  the kernel can drop). The cgroup, v2 (memory.max) or v1 (memory/
  memory.limit_in_bytes): the limit minus the working set (usage minus the
  inactive page cache, as `docker stats` counts it), at this process's cgroup and
  each of its parents, whichever allows least. "max" and v1's 2**63 mean no limit.

  Args:
    meminfo, cgroup_root, proc_cgroup: paths, for tests.

  Returns:
    int bytes, or None when neither is known (not Linux).
  """
  found = []
  try:
    with open(meminfo) as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          found.append(int(line.split()[1]) * 1024)  # kB
  except (OSError, ValueError, IndexError):
    pass
  found += _cgroup_room(cgroup_root, proc_cgroup)
  return min(found) if found else None


def _cgroup_room(cgroup_root, proc_cgroup):
  """What each memory cgroup from this process's own up to the root still allows."""
  room = []
  for v2, base, limit_file, usage_file, inactive in (
      (True, cgroup_root, 'memory.max', 'memory.current', 'inactive_file'),
      (False, os.path.join(cgroup_root, 'memory'), 'memory.limit_in_bytes',
       'memory.usage_in_bytes', 'total_inactive_file')):
    for directory in _cgroup_dirs(base, _own_cgroup(proc_cgroup, v2)):
      limit = _read_number(os.path.join(directory, limit_file))
      if limit is None or limit >= CGROUP_V1_UNLIMITED:  # no file, or 'max': no limit
        continue
      working_set = ((_read_number(os.path.join(directory, usage_file)) or 0) -
                     _stat(os.path.join(directory, 'memory.stat'), inactive))
      room.append(max(limit - max(working_set, 0), 0))
  return room


def _own_cgroup(proc_cgroup, v2):
  """This process's cgroup path ('/user.slice/x') in the v2 or v1 memory hierarchy."""
  try:
    with open(proc_cgroup) as f:
      for line in f:
        _, controllers, path = line.rstrip('\n').split(':', 2)
        if (controllers == '') if v2 else ('memory' in controllers.split(',')):
          return path
  except (OSError, ValueError):
    pass
  return '/'


def _cgroup_dirs(base, own):
  """base/own and its parents up to base, those that exist. In a container that
  sees its own cgroup as the root (a cgroup namespace), that is base alone."""
  parts = [p for p in own.split('/') if p]
  dirs = [os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1)]
  return [d for d in dirs if os.path.isdir(d)]


def _read_number(path):
  """The int in a cgroup file; None for 'max', a missing file or anything else."""
  try:
    with open(path) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def _stat(path, key):
  """One value of a memory.stat file; 0 when absent."""
  try:
    with open(path) as f:
      for line in f:
        name, _, value = line.partition(' ')
        if name == key:
          return int(value)
  except (OSError, ValueError):
    pass
  return 0
