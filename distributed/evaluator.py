"""TF_CONFIG's evaluator task: the trainers' evaluation, beside a distributed run."""
import os

from absl import flags

from training import evaluation


def define_flags(eval_interval_secs):
  """The evaluator's flags; eval_interval_secs: --eval_interval_secs's default."""
  flags.DEFINE_integer('eval_interval_secs', eval_interval_secs, 'TF_CONFIG\'s evaluator: '
                       'seconds between looks for a new checkpoint in --train_dir.')
  flags.DEFINE_string('eval_dir', None, 'TF_CONFIG\'s evaluator: where it writes its event '
                      'files (default: --train_dir/eval).')


def run_evaluator(settings, networks, eval_dir, eval_interval_secs):
  """TF_CONFIG's evaluator: scores each new checkpoint of the chief's --train_dir.

  What cifar10_eval.py and mnist_eval.py do beside training (training/evaluation.py), on
  the --dataset's test set in --data_dir (also with --synthetic), in batches of
  --batch_size; it returns once it has scored a checkpoint at --max_steps.
  networks: {name: data_sets.DataSet} of every data set (data_sets.DATASETS), the
  --dataset's among them. eval_dir: None for --train_dir/eval.
  """
  data = networks[settings.dataset]
  eval_dir = eval_dir or os.path.join(settings.train_dir, 'eval')
  print('evaluator: scoring each new checkpoint in %s (every %d s) until global step %d; '
        'event files in %s' % (settings.train_dir, eval_interval_secs, settings.max_steps,
                               eval_dir), flush=True)
  evaluation.main(evaluation.Options(settings.train_dir, eval_dir, settings.data_dir,
                                     settings.data_url, settings.data_md5,
                                     eval_interval_secs, settings.batch_size),
                  data.model, data.input, networks, 'python dist_train.py',
                  last_step=settings.max_steps)
  print('evaluator done: it has scored the checkpoint at --max_steps=%d' % settings.max_steps,
        flush=True)
