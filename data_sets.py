"""The data sets the trainers train on: a model package and an input module each.

The model package gives inference(images), loss(logits, labels) and the constants
the trainers' build() reads; the input module gives prepare, train_records,
train_dataset, seeded_dataset, synthetic_dataset, eval_dataset and check_train_files
(a file changed under a running trainer: training/steps.stop_on_changed_data). A
third data set is one more package, one more input module and one more line here.
"""
import collections

import cifar10
import cifar10_input
import mnist
import mnist_input

DataSet = collections.namedtuple('DataSet', ['model', 'input'])
DATASETS = {'cifar10': DataSet(cifar10, cifar10_input), 'mnist': DataSet(mnist, mnist_input)}
