"""Times one benchmark configuration in this process and prints the result as one line.

    python -m benchmarks.worker '{"kind": "matmul", "size": 2048, "runs": 10}'

python -m benchmarks runs one of these per configuration, so that the virtual CPU
devices, thread pools and memory start clean and peak memory is this process's
own; when one fails it prints the command that reruns it alone. It forks each from
a parent that has imported TensorFlow and nothing else (`--parent`, one per worker
environment: serve()), which spares each configuration the seconds of importing
it; the child is a process of its own all the same, with no session, device or
thread pool made before its config is read. The JSON's kind names the function
that measures it:
  flops, matmul, conv2,     measure_machine.py: the model's FLOPs, the machine's
  chains, pipeline          rates, the input alone
  ours, profile             measure_ours.py: the trainer's own graph and step
  peer, fit                 measure_peers.py: the Keras custom loop and model.fit
The result, a JSON dict of step times and memory, follows RESULT_PREFIX.
"""
import atexit
import importlib
import json
import os
import sys
import threading

from benchmarks.timing import RESULT_PREFIX, BenchmarkError

# Imported on demand: only the peers pay for importing Keras.
MODULE_OF_KIND = dict(flops='measure_machine', matmul='measure_machine',
                      conv2='measure_machine', chains='measure_machine',
                      pipeline='measure_machine', ours='measure_ours', profile='measure_ours',
                      peer='measure_peers', fit='measure_peers')


def main(argv):
  if argv == ['--parent']:
    serve(sys.stdin, sys.stdout)
    return
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


def serve(requests, answers):
  """--parent: imports TensorFlow, then for each request line (JSON: config, out, err)
  forks a child that runs main([config]) with its stdout and stderr in the files out
  and err; answers `pid N` as it starts and `exit CODE` (Popen's) once it has ended.

  Ends when requests does. One child at a time, as the runner runs them.
  """
  import tensorflow  # noqa: F401  (the seconds a fresh worker would spend on it)
  if threading.active_count() != 1 or len(os.listdir('/proc/self/task')) != 1:
    sys.exit('error: the worker parent has %d threads after importing TensorFlow; a fork '
             'would copy locks they hold (is OPENBLAS_NUM_THREADS=1 set?)'
             % len(os.listdir('/proc/self/task')))
  for line in requests:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
      run_child(request)
    answers.write('pid %d\n' % pid)
    answers.flush()
    answers.write('exit %d\n' % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    answers.flush()


def run_child(request):
  """In the forked child: stdout and stderr to the request's files, stdin closed, then
  main([config]); ends in os._exit with the code a fresh worker would exit with, once
  Python's exit functions have run."""
  code = 0
  try:
    for fd, path in ((1, request['out']), (2, request['err'])):
      with open(path, 'w') as f:
        os.dup2(f.fileno(), fd)
    os.close(0)
    main([request['config']])
  except SystemExit as e:
    if e.code not in (None, 0):
      code = e.code if isinstance(e.code, int) else 1
      if not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
  except BaseException:  # as a fresh interpreter: the traceback, exit status 1
    sys.excepthook(*sys.exc_info())
    code = 1
  finally:
    atexit._run_exitfuncs()  # as Python's exit would: autograph's files in /tmp go
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


if __name__ == '__main__':
  main(sys.argv[1:])
