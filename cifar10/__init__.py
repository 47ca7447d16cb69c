"""The CIFAR-10 model, under the names the original tutorial used.

    import cifar10
    logits = cifar10.inference(images)
    total_loss = cifar10.loss(logits, labels)

The network and its constants live in cifar10/model.py. The input functions below
are the original's names for cifar10_input.py's, taking explicit arguments where
the original read global flags.
"""
from cifar10.model import (ACTIVATIONS, CLASS_NAMES, CROSS_ENTROPY, IMAGE_SIZE,  # noqa: F401
                           INITIAL_LEARNING_RATE,
                           LEARNING_RATE_DECAY_FACTOR, LOSSES, MOVING_AVERAGE_DECAY,
                           NUM_CLASSES, NUM_EPOCHS_PER_DECAY,
                           NUM_EXAMPLES_PER_EPOCH_FOR_EVAL,
                           NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, STAIRCASE, TOWER_NAME,
                           inference, loss)


def maybe_download_and_extract(data_dir, data_url=None, data_md5=None):
  """See cifar10_input.maybe_download_and_extract."""
  import cifar10_input
  return cifar10_input.maybe_download_and_extract(data_dir, data_url, data_md5)


def distorted_inputs(data_dir, batch_size):
  """See cifar10_input.distorted_inputs."""
  import cifar10_input
  return cifar10_input.distorted_inputs(data_dir, batch_size)


def inputs(eval_data, data_dir, batch_size):
  """See cifar10_input.inputs."""
  import cifar10_input
  return cifar10_input.inputs(eval_data, data_dir, batch_size)
