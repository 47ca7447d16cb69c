"""Evaluates the CIFAR-10 model: precision @ 1 of the latest checkpoint.

    python cifar10_eval.py --run_once                 # once, then exit
    python cifar10_eval.py                            # beside training: every 5 minutes

Builds the inference graph from code, restores the moving-average (shadow) values
of the trainer's latest checkpoint into it, and scores every record of the test
set (or, with --eval_data=train_eval, of the training set) exactly once.
The original tutorial reports precision @ 1 of about 0.86 after 100K steps on one
GPU, batch 128. Without the data set: python cifar10_input.py --write_sample=DIR.

It only reads --checkpoint_dir: it never writes, locks or deletes the trainer's
files. Results go to stdout and to TensorBoard event files in --eval_dir.
"""
import sys

from training import machine, prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  prelude.start(sys.argv)  # first: Python 3.11+, --onednn, TensorFlow imported quietly

from absl import app
from absl import flags

import cifar10
import cifar10_input
import data_sets
from training import evaluation
from training import errors

# ---- Evaluation knobs: edit, save, rerun --------------------------------------
EVAL_INTERVAL_SECS = 300              # seconds between evaluations beside a training job
BATCH_SIZE = 128                      # images per batch; the last batch holds the rest
CHECKPOINT_DIR = '/tmp/cifar10_train'  # the trainer's --train_dir
EVAL_DIR = '/tmp/cifar10_eval'        # event files of this program
DATA_DIR = '/tmp/cifar10_data'

FLAGS = flags.FLAGS
evaluation.define_flags(CHECKPOINT_DIR, EVAL_DIR, DATA_DIR, cifar10_input.DATA_URL, BATCH_SIZE,
                        EVAL_INTERVAL_SECS, '10,000', '50,000')
flags.adopt_module_key_flags(evaluation)  # its flags in this program's --helpshort


def main(argv):
  with errors.one_line_errors():  # every error a user can cause: one line, its exit code
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
    evaluation.main(FLAGS, cifar10, cifar10_input, data_sets.DATASETS,
                    'python multi_gpu_train.py')


if __name__ == '__main__':
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
