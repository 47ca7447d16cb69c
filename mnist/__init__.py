"""The MNIST model of the book's chapter 12, under the book's names.

    import mnist
    logits = mnist.inference(images, mnist.l2_regularizer(mnist.REGULARIZATION_RATE))
    total_loss = mnist.loss(logits, labels)

The network and its constants live in mnist/model.py; the data in mnist_input.py.
"""
from mnist.model import (ACTIVATIONS, CLASS_NAMES, CROSS_ENTROPY, INITIAL_LEARNING_RATE,  # noqa: F401
                         INPUT_NODE,
                         LAYER1_NODE, LEARNING_RATE_DECAY_FACTOR, LOSSES,
                         MOVING_AVERAGE_DECAY, NUM_CLASSES, NUM_EPOCHS_PER_DECAY,
                         NUM_EXAMPLES_PER_EPOCH_FOR_EVAL, NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
                         OUTPUT_NODE, REGULARIZATION_RATE, STAIRCASE, TOWER_NAME,
                         get_weight_variable, inference, l2_regularizer, loss)
