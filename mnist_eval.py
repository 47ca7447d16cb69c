"""Evaluates the MNIST model, as the book's mnist_eval.py: precision @ 1 of the latest checkpoint.

    python mnist_eval.py --run_once                 # once, then exit
    python mnist_eval.py                            # beside training: every 10 seconds

Builds the book's network from code, restores the moving-average (shadow) values
of the trainer's latest checkpoint into it (python multi_gpu_train.py
--dataset=mnist), and scores every record of test.tfrecords exactly once. The
book reports its results on the real test set, which cannot be downloaded here.
Without the data set: python mnist_input.py --write_sample=DIR.

It only reads --checkpoint_dir: it never writes, locks or deletes the trainer's
files. Results go to stdout and to TensorBoard event files in --eval_dir.
"""
import sys

from training import machine, prelude

if __name__ == '__main__':  # a program, not a module imported by another (tests)
  prelude.start(sys.argv)  # first: Python 3.11+, --onednn, TensorFlow imported quietly

from absl import app
from absl import flags

import data_sets
from training import evaluation
import mnist
import mnist_input
from training import errors

# ---- Evaluation knobs: edit, save, rerun --------------------------------------
EVAL_INTERVAL_SECS = 10               # the book's: seconds between evaluations
BATCH_SIZE = 1000                     # images per batch; the last batch holds the rest
CHECKPOINT_DIR = '/tmp/mnist_train'   # the trainer's --train_dir
EVAL_DIR = '/tmp/mnist_eval'          # event files of this program
DATA_DIR = '/tmp/mnist_data'

FLAGS = flags.FLAGS
evaluation.define_flags(CHECKPOINT_DIR, EVAL_DIR, DATA_DIR, mnist_input.DATA_URL, BATCH_SIZE,
                        EVAL_INTERVAL_SECS, '10,000', '60,000',
                        archive_md5=False)
flags.adopt_module_key_flags(evaluation)  # its flags in this program's --helpshort


def main(argv):
  with errors.one_line_errors():  # every error a user can cause: one line, its exit code
    errors.refuse_arguments(argv)  # absl has already refused unknown flags
    evaluation.main(FLAGS, mnist, mnist_input, data_sets.DATASETS,
                    'python multi_gpu_train.py --dataset=mnist')


if __name__ == '__main__':
  machine.list_gpus()  # before absl's start-up, which finds them loudly (see there)
  app.run(main)
