"""A script run as `python script.py ...` runs, in a child forked from a loaded process.

A fresh interpreter spends seconds of CPU loading TensorFlow before the script's
first line (or `python -c`'s code's: the tests' runs). A process that has loaded it
forks instead, and the child becomes the program: its argv, environment, working
directory and Python's signal dispositions; this project's modules and absl's parsed
flags forgotten, so that the script imports and parses its own; the script run as
__main__; os._exit with its exit code.

    --local_cluster's tasks (distributed/local_cluster.py): forked from the launcher.
    The tests' programs (tests/helpers/forkserver.py): forked from a server.

Only a parent that has made no session or server, and runs no thread of its own, may
fork so: a fork copies a lock another thread holds, and a session's threads do not
come along (tensorflow#2448). TensorFlow starts no thread before a session or server;
numpy's OpenBLAS, whose pool starts at import, stops it across a fork (pthread_atfork,
OpenBLAS#343). Nor may one that may have initialised CUDA: a forked child cannot use
it (CUDA's programming guide). fork_safe() says whether this process may.

What stays of the parent: the modules of TensorFlow, numpy and absl, and TensorFlow's
process-wide generator, which unseeded ops draw from and siblings may share (numpy's
and Python's are reseeded). The child ends in os._exit: Python's own exit, which would
tear TensorFlow's modules down, does not run, as in multiprocessing's children.
"""
import atexit
import builtins
import functools
import glob
import io
import os
import runpy
import signal
import sys
import threading
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fork_safe():
  """None where a child forked from this process can run TensorFlow, else why not."""
  if threading.active_count() != 1:
    return 'this process runs %d Python threads' % threading.active_count()
  if glob.glob('/dev/nvidia[0-9]*'):
    return 'a GPU is here, and CUDA initialised in a parent does not work in its child'
  return None


def run_script(argv, env, cwd):
  """In the forked child: becomes `argv` and runs it: `python [-u] script.py ...`, or
  `python [-u] -c CODE ...`.

  Standard streams are the caller's to set first (file descriptors 0, 1, 2). Never
  returns: os._exit with the code `python script.py` would exit with.
  """
  unbuffered = argv[1] == '-u'
  program = argv[2 if unbuffered else 1:]
  signal.set_wakeup_fd(-1)
  python_signal_dispositions()
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(env)
  unbuffered = unbuffered or bool(os.environ.get('PYTHONUNBUFFERED'))
  sys.stdout = sys.__stdout__ = io.TextIOWrapper(
      io.FileIO(1, 'w', closefd=False) if unbuffered else io.BufferedWriter(
          io.FileIO(1, 'w', closefd=False)), encoding=sys.stdout.encoding,
      write_through=unbuffered)
  sys.orig_argv = list(argv)
  if program[0] == '-c':  # as Python sets them for -c: argv[0] '-c', the path's first ''
    sys.argv, sys.path[0] = ['-c'] + program[2:], ''
    run = functools.partial(exec_as_main, program[1])
  else:
    sys.argv = program
    sys.path[0] = os.path.dirname(os.path.realpath(program[0]))
    run = functools.partial(runpy.run_path, program[0], run_name='__main__')
  forget_project()
  import numpy
  numpy.random.seed()  # as a fresh process's (Python's own random reseeds itself)
  # The programs choose oneDNN before TensorFlow loads (training/machine.py); loaded as
  # that choice says, the choice is made here as a fresh program makes it, not reported
  # as made too late.
  from training import machine
  machine.choose(sys.argv, tensorflow_imported=False)
  os._exit(run_as_main(run))


def exec_as_main(code):
  """Runs `python -c code`'s code in a new __main__ module."""
  main = types.ModuleType('__main__')
  main.__builtins__ = builtins
  sys.modules['__main__'] = main
  exec(compile(code, '<string>', 'exec'), main.__dict__)  # pylint: disable=exec-used


def forget_project():
  """This project's modules out of sys.modules, the flags they (and __main__) defined out
  of absl's, and absl's own flags unparsed: the script imports, defines and parses its
  own, as in a fresh process."""
  own = {name[:-3] for name in os.listdir(ROOT) if name.endswith('.py')} | {
      name for name in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, name,
                                                                       '__init__.py'))}
  for name, module in list(sys.modules.items()):
    path = getattr(module, '__file__', None) or ''
    if name.split('.')[0] in own and path.startswith(ROOT + os.sep):
      del sys.modules[name]
  if 'absl.flags' in sys.modules:
    flag_values = sys.modules['absl.flags'].FLAGS
    for name in list(flag_values):
      module = flag_values.find_module_defining_flag(name) or ''
      if name in flag_values and (module == '__main__' or module.split('.')[0] in own):
        delattr(flag_values, name)
    flag_values.unparse_flags()


def python_signal_dispositions():
  """What a fresh Python starts with: SIGINT raises KeyboardInterrupt, SIGPIPE and
  SIGXFSZ ignored (errors instead), every other signal's default, none blocked."""
  for signum in signal.valid_signals():
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
      try:
        signal.signal(signum, signal.SIG_DFL)
      except (OSError, ValueError):  # the C library's own (SIGRTMIN's first two)
        pass
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGPIPE, signal.SIG_IGN)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_SETMASK, [])


def run_as_main(run):
  """Calls run(), the program as __main__; returns the exit code Python would exit with."""
  code = 0
  try:
    run()
  except SystemExit as e:
    code = exit_code(e.code)
  except KeyboardInterrupt:  # Python dies of the signal, after the traceback
    traceback.print_exc()
    die_of(signal.SIGINT)
  except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
  threading._shutdown()  # as at a fresh interpreter's end: non-daemon threads, atexit
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      code = 120  # Python's own code when flushing at exit fails
  return code


def exit_code(code):
  """sys.exit(code)'s exit status: None 0, an integer itself, anything else printed, 1."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xff
  print(code, file=sys.stderr)
  return 1


def die_of(signum):
  sys.stdout.flush()
  sys.stderr.flush()
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)
