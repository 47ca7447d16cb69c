"""Times one benchmark configuration in this process and prints the result as one line.

    python -m benchmarks.worker '{"kind": "matmul", "size": 2048, "runs": 10}'

python -m benchmarks starts one of these per configuration, so that the virtual CPU
devices, thread pools and memory start clean and peak memory is this process's
own; when one fails it prints the command that reruns it alone. The JSON's kind
names the function that measures it:
  flops, matmul, pipeline   measure_machine.py: the model's FLOPs, the machine
  ours, profile             measure_ours.py: the trainer's own graph and step
  peer, fit                 measure_peers.py: the Keras custom loop and model.fit
The result, a JSON dict of step times and memory, follows RESULT_PREFIX.
"""
import importlib
import json
import os
import sys

from benchmarks.timing import RESULT_PREFIX, BenchmarkError

# Imported on demand: only the peers pay for importing Keras.
MODULE_OF_KIND = dict(flops='measure_machine', matmul='measure_machine',
                      pipeline='measure_machine', ours='measure_ours', profile='measure_ours',
                      peer='measure_peers', fit='measure_peers')


def main(argv):
  if len(argv) != 1:
    sys.exit('usage: python -m benchmarks.worker \'<JSON config>\' (python -m benchmarks '
             'prints the exact command of a configuration that failed)')
  try:
    config = json.loads(argv[0])
  except ValueError as e:
    sys.exit('error: the config is not JSON (%s): %s' % (e, argv[0]))
  kind = config.get('kind') if isinstance(config, dict) else None
  if kind not in MODULE_OF_KIND:
    sys.exit('error: the config\'s "kind" is %r; expected one of %s'
             % (kind, ', '.join(MODULE_OF_KIND)))
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow as tf
  tf.get_logger().setLevel('ERROR')
  measure = getattr(importlib.import_module('benchmarks.' + MODULE_OF_KIND[kind]), kind)
  try:
    result = measure(config)
  except BenchmarkError as e:
    sys.exit('error: %s' % e)
  print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
