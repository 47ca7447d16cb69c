"""Workers that measure the model and the machine rather than a trainer.

flops: multiply-adds per example of each layer, read from cifar10.inference's graph,
  and the FLOPs of one training step per example.
matmul: the machine's float32 matmul rate, the yardstick for "of matmul".
conv2: conv2's forward and both gradient convolutions, the yardstick for "of conv2".
chains: elementwise ops on a tensor of the LRN's size, one chain against two at once.
pipeline: the input pipeline alone, no model.
"""
import statistics

import numpy as np
import tensorflow as tf

import cifar10
import cifar10_input
from training import placement
from benchmarks.timing import peak_mb, time_steps

CHAIN_OPS = 8                     # elementwise ops in each of chains()' chains


def model_of_one_image():
  """(a graph of cifar10.inference on one image, that image's placeholder): the layers'
  shapes, to read; nothing runs."""
  with tf.Graph().as_default() as graph:
    images = tf.compat.v1.placeholder(tf.float32, [1, cifar10.IMAGE_SIZE,
                                                   cifar10.IMAGE_SIZE, 3])
    cifar10.inference(images)
  return graph, images


def flops(config):
  """Multiply-adds (M) per example of each Conv2D and MatMul of cifar10.inference, and
  what one training step costs per example, counted from them: forward 2 M per layer
  (a multiply and an add each), the weight gradients as many, the input gradients as
  many but for conv1's (its input is the image): 3 x forward - conv1's forward. Biases,
  ReLU, pooling, the LRN and the loss are left out (docs/performance.md, "Of matmul").

  Returns:
    dict: layers, [dict(name, op, macs, input_gradient)]; per_example, FLOPs: forward,
    backward_weights, backward_inputs, total.
  """
  del config
  graph, images = model_of_one_image()
  layers = []
  for op in graph.get_operations():
    if op.type == 'Conv2D':
      _, height, width, out_channels = op.outputs[0].shape
      kernel_h, kernel_w, in_channels, _ = op.inputs[1].shape
      macs = height * width * out_channels * kernel_h * kernel_w * in_channels
    elif op.type == 'MatMul' and op.inputs[1].op.type != 'Const':  # LRN's band: not a layer
      inputs, outputs = op.inputs[1].shape
      macs = inputs * outputs
    else:
      continue
    layers.append(dict(name=op.name.split('/')[0], op=op.type, macs=int(macs),
                       input_gradient=op.inputs[0] is not images))
  forward = sum(2 * layer['macs'] for layer in layers)
  backward_inputs = sum(2 * layer['macs'] for layer in layers if layer['input_gradient'])
  return dict(layers=layers, per_example=dict(
      forward=forward, backward_weights=forward, backward_inputs=backward_inputs,
      total=2 * forward + backward_inputs))


def matmul(config):
  """The machine's float32 matmul rate: an n x n product in a graph session, all cores."""
  tf.compat.v1.disable_eager_execution()
  n = config['size']
  with tf.Graph().as_default():
    # Variables, not constants, so grappler cannot fold the product away.
    normal = tf.compat.v1.random_normal_initializer()
    a = tf.compat.v1.get_variable('a', [n, n], initializer=normal)
    b = tf.compat.v1.get_variable('b', [n, n], initializer=normal)
    product = tf.matmul(a, b)
    with tf.compat.v1.Session(config=placement.session_config(1)) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      # Running the op without fetching its output: no 16 MB copy into numpy.
      durations = time_steps(lambda: sess.run(product.op), 2, config['runs'])
  return dict(durations=durations, gflops=2 * n ** 3 / statistics.median(durations) / 1e9,
              peak_mb=peak_mb())


def conv2(config):
  """conv2's kernels alone: its forward convolution and both of its gradients' (input and
  filter) in one sess.run, as a training step runs them, on this batch size and dtype.

  The yardstick of "of conv2": the model's FLOPs, done at this rate, would take the
  step this long. config: batch_size, dtype ('float32' or 'bfloat16'), runs.
  """
  tf.compat.v1.disable_eager_execution()
  dtype = tf.as_dtype(config['dtype'])
  conv = model_of_one_image()[0].get_operation_by_name('conv2/Conv2D')
  input_shape = [config['batch_size']] + conv.inputs[0].shape.as_list()[1:]
  output_shape = [config['batch_size']] + conv.outputs[0].shape.as_list()[1:]
  filter_shape = conv.inputs[1].shape.as_list()
  macs = int(np.prod(output_shape) * np.prod(filter_shape[:3]))
  with tf.Graph().as_default():
    # Variables, not constants, so grappler cannot fold the kernels away.
    normal = tf.compat.v1.random_normal_initializer()
    inputs, kernel, upstream = [tf.cast(tf.compat.v1.get_variable(name, shape, initializer=normal),
                                        dtype) for name, shape in (
        ('inputs', input_shape), ('kernel', filter_shape), ('upstream', output_shape))]
    strides = [1, 1, 1, 1]
    kernels = [tf.nn.conv2d(inputs, kernel, strides, 'SAME'),
               tf.compat.v1.nn.conv2d_backprop_input(input_shape, kernel, upstream, strides,
                                                     'SAME'),
               tf.compat.v1.nn.conv2d_backprop_filter(inputs, filter_shape, upstream, strides,
                                                      'SAME')]
    with tf.compat.v1.Session(config=placement.session_config(1)) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      durations = time_steps(lambda: sess.run([k.op for k in kernels]), 2, config['runs'])
  return dict(durations=durations, flop=3 * 2 * macs,
              gflops=3 * 2 * macs / statistics.median(durations) / 1e9, peak_mb=peak_mb())


def chains(config):
  """Elementwise ops on float32 tensors of the LRN's size ([batch, 12, 12, 64]): one
  chain of them, then two independent chains in one sess.run, each as long.

  Two chains taking twice one chain's time say the second core adds nothing to such
  ops: they wait on memory, not on arithmetic. config: batch_size, runs.

  Returns:
    dict: one_ms, two_ms (medians), durations of each, ops (CHAIN_OPS).
  """
  tf.compat.v1.disable_eager_execution()
  shape = [config['batch_size'], cifar10.IMAGE_SIZE // 2, cifar10.IMAGE_SIZE // 2, 64]
  with tf.Graph().as_default():
    normal = tf.compat.v1.random_normal_initializer()

    def chain(name):  # CHAIN_OPS ops, each reading two tensors of `shape` and writing one
      x = tf.compat.v1.get_variable(name + '_x', shape, initializer=normal).read_value()
      y = tf.compat.v1.get_variable(name + '_y', shape, initializer=normal).read_value()
      z = x
      for i in range(CHAIN_OPS):
        z = z * y if i % 2 == 0 else z + x
      return z
    first, second = chain('first'), chain('second')
    with tf.compat.v1.Session(config=placement.session_config(1)) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      durations = {}
      for name, ends in (('one', [first]), ('two', [first, second])):
        durations[name] = time_steps(lambda: sess.run([end.op for end in ends]), 2,
                                     config['runs'])
  return dict(durations=durations, ops=CHAIN_OPS, one_ms=1000 * statistics.median(durations['one']),
              two_ms=1000 * statistics.median(durations['two']), peak_mb=peak_mb())


def pipeline(config):
  """The input pipeline alone: distorted_dataset batches, no model."""
  tf.compat.v1.disable_eager_execution()
  with tf.Graph().as_default():
    with tf.device('/cpu:0'):
      dataset = cifar10_input.distorted_dataset(config['data_dir'], config['batch_size'])
      images, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    session_config = placement.session_config(1, placement.SessionOptions(
        intra_op_threads=config['intra'], inter_op_threads=config['inter']))
    with tf.compat.v1.Session(config=session_config) as sess:
      # The op alone: the batch stays in TensorFlow, as it does for the towers.
      durations = time_steps(lambda: sess.run(images.op), config['warmup'],
                             config['steps'])
  return dict(durations=durations, examples_per_step=config['batch_size'],
              peak_mb=peak_mb())
