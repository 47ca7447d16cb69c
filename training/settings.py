"""One run's settings: the trainers' shared flags, their checks (the data sets they
name: data_sets.py, at the top).

Both trainers define these flags (define_trainer_flags) with their own defaults,
the constants at the top of each program, and read them back as a Settings
(settings_from_flags) in main(); everything below main() takes plain arguments.
"""
import typing

from absl import flags

from training import input_data, machine
from training import placement
from training.errors import TrainingError

# Ranges: what TensorFlow can hold, and what a machine can run.
MAX_TOWERS = 64            # --num_gpus; beyond the GPUs seen, each tower is a CPU device
MAX_THREADS = 4096         # --intra_op_threads, --inter_op_threads (ConfigProto's int32)
MAX_INT64 = 2 ** 63 - 1    # --max_steps (the int64 global step), --seed (an int64 seed)


class Settings(typing.NamedTuple):
  """One run's settings: the flags, or a test's arguments. The training knobs have no
  default here: they are the program's constants (settings_from_flags), one copy."""
  train_dir: str
  data_dir: str
  num_gpus: int
  batch_size: int                               # images per tower
  max_steps: int                                # the global step to stop at
  log_frequency: int
  summary_steps: int                            # 0: no summaries
  save_every_n_steps: int
  dataset: str = 'cifar10'                      # a key of data_sets.DATASETS
  synthetic: bool = False
  data_url: str = None
  data_md5: str = None
  download_timeout_secs: int = input_data.DOWNLOAD_TIMEOUT_SECS  # a whole download
  download_stall_secs: int = input_data.DOWNLOAD_STALL_SECS      # no byte for this long
  seed: int = None                              # int >= 0: the run repeats exactly
  fresh: bool = False
  async_towers: bool = False
  use_fp16: bool = False                        # float16 towers, float32 variables
  use_bf16: bool = False                        # bfloat16 towers, float32 variables
  session: placement.SessionOptions = placement.SessionOptions()


def define_trainer_flags(dataset_defaults, num_gpus, log_frequency, summary_steps,
                         save_every_n_steps, flag_values=flags.FLAGS):
  """The flags both trainers take, with the calling program's defaults.

  Args:
    dataset_defaults: {dataset: {'batch_size': .., 'max_steps': .., 'train_dir': ..,
      'data_dir': ..}}: what each flag named, not given, takes.
    flag_values: where to define them (a test's own flags.FlagValues()).
  """
  def per_dataset(name):
    return ', '.join('%s for %s' % (d[name], key) for key, d in dataset_defaults.items())
  flags.DEFINE_enum('dataset', 'cifar10', list(dataset_defaults), 'The data set and its '
                    'model; the flags below not given take its defaults.',
                    flag_values=flag_values)
  flags.DEFINE_integer('num_gpus', num_gpus, 'Number of towers (GPUs) to use.',
                       flag_values=flag_values)
  flags.DEFINE_integer('batch_size', None, 'Images per tower per step (default: %s).'
                       % per_dataset('batch_size'), flag_values=flag_values)
  flags.DEFINE_integer('max_steps', None, 'Global step at which to stop (default: %s).'
                       % per_dataset('max_steps'), flag_values=flag_values)
  flags.DEFINE_string('train_dir', None, 'Checkpoints and summaries go here (default: %s).'
                      % per_dataset('train_dir'), flag_values=flag_values)
  flags.DEFINE_string('data_dir', None, 'The data set\'s files (default: %s).'
                      % per_dataset('data_dir'), flag_values=flag_values)
  flags.DEFINE_string('data_url', None, 'Where to download the data (default: the '
                      'official copy).', flag_values=flag_values)
  flags.DEFINE_string('data_md5', None, 'cifar10: md5 of the archive at --data_url, for a '
                      'copy of your own (default: the official archive\'s).',
                      flag_values=flag_values)
  define_download_flags(flag_values)
  flags.DEFINE_integer('log_frequency', log_frequency, 'Steps between loss lines.',
                       flag_values=flag_values)
  flags.DEFINE_integer('summary_steps', summary_steps, 'Steps between summaries; 0: none.',
                       flag_values=flag_values)
  flags.DEFINE_integer('save_every_n_steps', save_every_n_steps, 'Steps between checkpoints.',
                       flag_values=flag_values)
  flags.DEFINE_boolean('fresh', False, 'Start from step 0: move the checkpoints and event '
                       'files already in --train_dir into a dated subdirectory first.',
                       flag_values=flag_values)
  flags.DEFINE_boolean('async_towers', False, 'Each tower applies its own gradients as soon '
                       'as they are ready (asynchronous), one thread per tower.',
                       flag_values=flag_values)
  flags.DEFINE_boolean('use_fp16', False, 'Train the model using fp16: float16 towers over '
                       'float32 variables, with dynamic loss scaling '
                       '(training/mixed_precision.py).', flag_values=flag_values)
  flags.DEFINE_boolean('use_bf16', False, 'bfloat16 towers over float32 variables, no loss '
                       'scale; needs bfloat16 units: a CPU with AVX512_BF16 or AMX and '
                       'oneDNN on, or GPUs of compute capability 8.0 or more.',
                       flag_values=flag_values)
  flags.DEFINE_boolean('synthetic', False, 'Feed random in-memory images instead of files, '
                       'to time the compute alone.', flag_values=flag_values)
  _define_session_flags(flag_values)
  flags.DEFINE_integer('seed', None, 'Seed every random choice (initial weights, record '
                       'order, distortions) so that the same command repeats exactly, '
                       'whatever the towers, and a resumed run equals an uninterrupted one.',
                       flag_values=flag_values)


def define_download_flags(flag_values=flags.FLAGS):
  """How long a download of the data set may take: the trainers' and evaluators' flags."""
  flags.DEFINE_integer('download_timeout_secs', input_data.DOWNLOAD_TIMEOUT_SECS, 'Seconds a '
                       'download of the data set may take in all before it stops.',
                       flag_values=flag_values)
  flags.DEFINE_integer('download_stall_secs', input_data.DOWNLOAD_STALL_SECS, 'Seconds a '
                       'download may wait for its next byte before it stops.',
                       flag_values=flag_values)


def deadlines(values):
  """The input_data.Deadlines of a download, from Settings or parsed flags (either
  missing: input_data's constant, as for a caller's options without them)."""
  return input_data.Deadlines(
      getattr(values, 'download_timeout_secs', input_data.DOWNLOAD_TIMEOUT_SECS),
      getattr(values, 'download_stall_secs', input_data.DOWNLOAD_STALL_SECS))


def _define_session_flags(flag_values):
  flags.DEFINE_boolean('log_device_placement', False, 'Log the device of every op.',
                       flag_values=flag_values)
  flags.DEFINE_boolean('allow_growth', False, 'Allocate GPU memory as needed instead of '
                       'taking nearly all of it at start.', flag_values=flag_values)
  flags.DEFINE_float('gpu_memory_fraction', 0.0, 'Cap on the share of each GPU\'s memory '
                     'this process takes (per_process_gpu_memory_fraction); 0: no cap.',
                     flag_values=flag_values)
  flags.DEFINE_integer('intra_op_threads', 0, 'Threads inside one op; 0: one per core.',
                       flag_values=flag_values)
  flags.DEFINE_integer('inter_op_threads', 0, 'Ops run at once; 0: one per core.',
                       flag_values=flag_values)
  machine.define_flag(__name__, flag_values)


def apply_dataset_defaults(flag_values, dataset_defaults):
  """Gives the flags dataset_defaults names, not set on the command line, their --dataset's."""
  for name, value in dataset_defaults[flag_values.dataset].items():
    if flag_values[name].value is None:
      setattr(flag_values, name, value)


def settings_from_flags(flag_values):
  """The run's Settings from the command line, once apply_dataset_defaults() has run."""
  session = placement.SessionOptions(
      **{name: flag_values[name].value for name in placement.SessionOptions._fields})
  return Settings(session=session, **{name: flag_values[name].value
                                      for name in Settings._fields if name != 'session'})


def check_trainer_flags(flag_values, also_positive=()):
  """errors.TrainingError, naming the flag, for a trainer flag out of range.

  Args:
    also_positive: names of the calling program's own flags that must be >= 1.
  """
  fv = flag_values
  for name in ('num_gpus', 'batch_size', 'max_steps', 'log_frequency',
               'save_every_n_steps', 'download_timeout_secs',
               'download_stall_secs') + tuple(also_positive):
    if fv[name].value < 1:
      raise TrainingError('--%s must be at least 1, got %d' % (name, fv[name].value))
  if fv.seed is not None and not 0 <= fv.seed <= MAX_INT64:
    raise TrainingError('--seed must be 0 .. %d (an int64), got %d' % (MAX_INT64, fv.seed))
  for name, most, why in (('num_gpus', MAX_TOWERS, 'towers: one per GPU, or per virtual '
                           'CPU device where GPUs are fewer'),
                          ('max_steps', MAX_INT64, 'the global step is an int64'),
                          ('intra_op_threads', MAX_THREADS, 'threads'),
                          ('inter_op_threads', MAX_THREADS, 'threads')):
    if fv[name].value > most:
      raise TrainingError('--%s must be at most %d (%s), got %d' % (name, most, why,
                                                                    fv[name].value))
  if fv.use_fp16 and fv.use_bf16:
    raise TrainingError('--use_fp16 and --use_bf16 each set what the towers compute in; '
                        'pass one of the two.')
  if fv.use_fp16 and fv.async_towers:
    raise TrainingError(
        '--use_fp16 cannot train --async_towers: the towers share one loss scale, and one '
        'tower halving it while another is between scaling its loss and unscaling its '
        'gradients would apply that tower\'s gradients at twice or half their size. Drop '
        'one of the two.')
  if fv['seed'].present and fv['async_towers'].present and fv.async_towers:
    raise TrainingError(
        '--seed cannot repeat an --async_towers run: the towers race for the shared '
        'variables by design, so the order of updates differs from run to run. Drop one '
        'of the two.')
  for name in ('summary_steps', 'intra_op_threads', 'inter_op_threads'):
    if fv[name].value < 0:
      raise TrainingError('--%s must be 0 or more, got %d' % (name, fv[name].value))
  if not 0.0 <= fv.gpu_memory_fraction <= 1.0:
    raise TrainingError('--gpu_memory_fraction must be between 0 and 1, got %g'
                        % fv.gpu_memory_fraction)
