"""oneDNN on or off, chosen before TensorFlow is imported: it reads TF_ENABLE_ONEDNN_OPTS once.

Every program calls choose(sys.argv) before its first `import tensorflow`, through
training/prelude.py:

    from training import prelude
    if __name__ == '__main__':
      prelude.start(sys.argv)  # Python 3.11+, then onednn.choose(sys.argv), then TensorFlow

Who wins, first first:
  1. TF_ENABLE_ONEDNN_OPTS set by the user: TensorFlow reads it, so it stands;
     start-up says it overrode --onednn.
  2. --onednn=on or --onednn=off on the command line (read here from argv: absl
     parses its flags only after TensorFlow is imported; the programs still define
     the flag, so absl accepts it and --helpshort lists it).
  3. --onednn=auto, the default: on where it was measured faster for the CIFAR-10
     model (x86 with AVX2 but none of the instructions below, where TensorFlow 2.21
     leaves it off: benchmarks/benchmark.py's table, 1.4x at one tower); TensorFlow's
     own choice elsewhere (it turns oneDNN on itself on CPUs with those
     instructions; other architectures were not measured).
--seed takes the same choice: with oneDNN on, as with it off, two runs of one seed
are bit-identical, a resumed run equals an uninterrupted one, and a tower split
agrees with one tower on the joined batch over the first steps; beyond them a split
drifts under either, as rounding differences are amplified (tests/test_seed.py,
tests/test_onednn.py; docs/trainer.md "Runs that repeat exactly").

Imports no TensorFlow.
"""
import collections
import os
import platform
import sys

ENV = 'TF_ENABLE_ONEDNN_OPTS'        # TensorFlow reads it once, at import
SET_HERE_ENV = 'CIFAR10_ONEDNN_SET'  # the value choose() gave ENV, so that the tasks a
                                     # program starts (--local_cluster) tell it from the user's
CHOICES = ('auto', 'on', 'off')

# ---- What "auto" rests on: edit when a new measurement says otherwise ------------
# Any of these and TensorFlow 2.21 turns oneDNN on by itself (/proc/cpuinfo names).
TF_ON_WITH = ('avx512_vnni', 'avx512_bf16', 'avx_vnni', 'amx_tile', 'amx_bf16', 'amx_int8')
MEASURED_FASTER_WITH = 'avx2'        # ... and without them: measured faster, so on
MEASURED_SPEEDUP = 1.4               # ours, one tower, synthetic, oneDNN on over off; the
                                     # issue's CPUs 1.52x, 1.33x, 1.40x (docs/performance.md)
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
                  'with %s and without AVX512_VNNI (benchmarks/benchmark.py)'
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
  choice = decide(flag_value(argv), environ, platform.machine(), cpu_flags())
  if choice.how != 'environment':
    if choice.on is None:
      environ.pop(ENV, None)
      environ.pop(SET_HERE_ENV, None)
    else:
      environ[ENV] = environ[SET_HERE_ENV] = '1' if choice.on else '0'
  _chosen = choice
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
