"""dist_train.py's flags and start-up: what a task refuses, or says, before it trains.

Flags as a user runs them (hosts not on loopback, multi_gpu_train.py's flags it does
not take, values out of range, --helpshort), the warning of a hand-started task, and
a worker that cannot start: no ps task to reach, or a batch too large for memory.
Each process is bounded in time and killed when its test ends, pass or fail.
"""
import hashlib
import os
import re
import shutil
import signal
import sys
import threading
import time

import pytest

import dist_train
import helpers
from distributed import local_cluster


# ---- Flags, as a user runs them ---------------------------------------------------


def test_main_nonloopback_host_without_opt_in_exits_before_serving(tmp_path):
  done = helpers.run(['dist_train.py', '--job_name=ps', '--ps_hosts=10.1.2.3:2222',
                      '--worker_hosts=127.0.0.1:2223', '--train_dir=%s' % tmp_path])
  assert done.code == 1, done.log()
  assert ('error: --ps_hosts names 10.1.2.3:2222, which is not a loopback address'
          in done.err), done.log()
  assert '--allow_nonloopback_hosts' in done.err
  assert 'serving' not in done.out


def test_main_multi_gpu_train_only_flag_exits_naming_it(tmp_path):
  done = helpers.run(['dist_train.py', '--local_cluster=1,1', '--fresh',
                      '--train_dir=%s' % tmp_path])
  assert done.code == 1, done.log()
  assert ('error: --fresh is a multi_gpu_train.py flag that dist_train.py does not take'
          in done.err), done.log()
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('flags, message', [
    (['--local_cluster=1,2', '--sync_replicas', '--replicas_to_aggregate=3'],
     'error: --replicas_to_aggregate=3 is more than the 2 workers: no update could ever '
     'gather that many gradients'),
    (['--local_cluster=1,1', '--step_timeout_secs=%d' % 10 ** 13],
     'error: --step_timeout_secs must be at most 604800 (a week), got %d' % 10 ** 13),
], ids=['replicas', 'seconds'])
def test_main_value_out_of_range_exits_naming_it_before_any_task(tmp_path, flags, message):
  done = helpers.run(['dist_train.py', '--train_dir=%s' % tmp_path, '--synthetic', *flags])
  assert done.code == 1 and done.err.splitlines()[-1] == message, done.log()
  assert 'local cluster:' not in done.out and os.listdir(tmp_path) == []


@pytest.mark.xdist_group('helpshort')
def test_helpshort_lists_multi_gpu_train_flags_it_accepts_not_the_refused(helpshort):
  listed = helpers.listed_flags(helpshort('dist_train.py').out)
  for name in ('dataset', 'data_dir', 'max_steps', 'num_gpus', 'batch_size', 'train_dir',
               'save_every_n_steps', 'sync_replicas', 'local_cluster'):
    assert name in listed, (name, helpshort('dist_train.py').log())
  assert not listed & set(dist_train.REFUSED_FLAGS)


@pytest.mark.xdist_group('helpshort')
def test_helpshort_prints_the_docstring_verbatim(helpshort):
  out = helpshort('dist_train.py').out  # absl exits 1 after the help
  # Line breaks kept (the command lines end in a backslash), no % taken as a format.
  assert dist_train.__doc__.strip() in out
  assert '--task_index=0 \\\n        --ps_hosts=10.0.0.1:2222' in out


def test_training_knobs_edited_in_multi_gpu_train_are_the_distributed_defaults_too(tmp_path):
  # One copy of each knob: before, dist_train.py had its own block, and an edited
  # multi_gpu_train.py BATCH_SIZE left the distributed trainer at 128.
  copy = tmp_path / 'checkout'
  shutil.copytree(helpers.ROOT, copy, ignore=shutil.ignore_patterns('.git', 'tests'))
  program = copy / 'multi_gpu_train.py'
  text, count = re.subn(r'^BATCH_SIZE = 128 ', 'BATCH_SIZE = 16 ', program.read_text(),
                        flags=re.M)
  assert count == 1
  program.write_text(text)
  done = helpers.run([str(copy / 'dist_train.py'), '--helpshort'])
  assert done.code == 0, done.log()
  assert re.search(r'--batch_size: [^(]*\(default: 16 for cifar10, 100 for\s+mnist\)',
                   done.out), done.log()


@pytest.mark.slow
def test_hand_started_task_warning_names_its_port_and_tensorflow_security_advice(tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  done = helpers.run(['dist_train.py', '--job_name=worker', '--task_index=0', '--synthetic',
                      '--ps_hosts=127.0.0.1:%d' % ps_port,
                      '--worker_hosts=127.0.0.1:%d' % worker_port,
                      '--startup_timeout_secs=1', '--train_dir=%s' % tmp_path])
  assert done.code == 138 and 'waited 1 s for the ps task(s)' in done.err, done.log()
  assert ('anyone who can reach port %d of this machine (this task, worker 0)' % worker_port
          in done.out), done.log()
  assert 'tensorflow/blob/master/SECURITY.md' in done.out


# ---- A worker that cannot start ---------------------------------------------------


@pytest.mark.slow
def test_worker_no_ps_reachable_exits_138_after_its_startup_deadline(tasks, sample, tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)  # nothing listens on ps_port
  worker = tasks(['dist_train.py', '--job_name=worker', '--task_index=0',
                  '--ps_hosts=127.0.0.1:%d' % ps_port,
                  '--worker_hosts=127.0.0.1:%d' % worker_port,
                  '--startup_timeout_secs=2', *sample.flags, '--train_dir=%s' % tmp_path])
  assert worker.finish() == 138, worker.log()  # a peer went away: restart this task (>= 128)
  ended = time.time()
  # The security warning comes once TensorFlow is imported, before the wait: then 2 s,
  # not the default 120.
  [warned] = [when for line, when in zip(worker.lines, worker.arrived)
              if 'anyone who can reach port %d' % worker_port in line]
  assert ended - warned < 30, worker.log()
  errors = [line for line in worker.err_lines if line.startswith('error')]
  assert errors == [
      'error: worker 0 waited 2 s for the ps task(s) at 127.0.0.1:%d: nothing accepts '
      'connections there. Start them first (python dist_train.py --job_name=ps '
      '--task_index=i with the same --ps_hosts and --worker_hosts), check --ps_hosts, or '
      'raise --startup_timeout_secs.' % ps_port], worker.log()
  assert 'Traceback' not in worker.text
  assert '--startup_timeout_secs' in worker.text


# A batch whose one step needs more memory than any machine has (about 2 MB an image).
HUGE_BATCH = 10 ** 7
PS_ENDS_SECS = 30  # a ps task ends this soon after its chief gave up (it polls twice a second)


@pytest.mark.slow
def test_chief_batch_too_large_for_memory_stops_in_one_line_its_ps_task_ends_with_it(
    tasks, tmp_path):
  ps_port, worker_port = local_cluster.free_ports(2)
  hosts = ['--ps_hosts=127.0.0.1:%d' % ps_port, '--worker_hosts=127.0.0.1:%d' % worker_port]
  ps = tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  worker = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *hosts,
                  '--synthetic', '--batch_size=%d' % HUGE_BATCH, '--train_dir=%s' % tmp_path])
  assert worker.finish() == 1, worker.log()
  errors = [line for line in worker.err_lines if line.startswith('error')]
  assert len(errors) == 1 and errors[0].startswith(
      'error: one step at --batch_size=%d x 1 towers needs about ' % HUGE_BATCH), worker.log()
  assert 'Traceback' not in worker.text and 'Starting from step 0' not in worker.text
  assert not [name for name in os.listdir(tmp_path) if name.startswith('model.ckpt')]
  assert ps.finish(timeout=PS_ENDS_SECS) == 1, ps.log()  # it served on, before


# ---- Every worker trains the chief's run (distributed/run_match.py) ----------------


def hand_started(num_workers):
  """The --ps_hosts and --worker_hosts flags of a hand-started job with 1 ps task."""
  ports = local_cluster.free_ports(1 + num_workers)
  return ['--ps_hosts=127.0.0.1:%d' % ports[0],
          '--worker_hosts=%s' % ','.join('127.0.0.1:%d' % p for p in ports[1:])]


@pytest.mark.slow
def test_sync_chief_without_its_other_worker_waits_then_exits_138_ps_ends_with_it(
    tasks, tmp_path):
  hosts = hand_started(2)
  ps = tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  chief = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *hosts,
                 *helpers.STEADY_FLAGS, '--sync_replicas', '--startup_timeout_secs=5',
                 '--max_steps=50', '--train_dir=%s' % tmp_path])
  assert chief.finish() == 138, chief.log()
  # The job is over: the ps task ends with the chief's code (it served on, before).
  assert ps.finish(timeout=PS_ENDS_SECS) == 138, ps.log()
  assert ps.out_lines[-1] == ('ps task 0: the chief gave up (exit 138); nothing is left to '
                              'serve: ending with it'), ps.log()
  assert 'worker 0: sync: waiting for worker(s) 1 to join, up to 5 s' in chief.out_lines
  errors = [line for line in chief.err_lines if line.startswith('error')]
  assert len(errors) == 1 and errors[0].startswith(
      'error: worker 0 waited 5 s for worker(s) 1 to join.'), chief.log()
  assert 'Traceback' not in chief.text and 'training from global step' not in chief.text
  assert helpers.global_step(tmp_path) == 0  # the step-0 checkpoint, and no update


@pytest.mark.slow
def test_sync_chief_with_backup_workers_trains_without_waiting_for_the_others(tasks,
                                                                            tmp_path):
  # --replicas_to_aggregate=1 of 2 workers: the user asked for updates without worker 1.
  hosts = hand_started(2)
  tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  chief = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *hosts,
                 *helpers.STEADY_FLAGS, '--sync_replicas', '--replicas_to_aggregate=1',
                 '--startup_timeout_secs=600', '--max_steps=5',
                 '--train_dir=%s' % tmp_path])
  chief.wait_for(lambda line: line.startswith('worker 0 done: '), 'the chief done')
  assert not [line for line in chief.lines if 'waiting for worker(s)' in line], chief.log()
  assert helpers.global_step(tmp_path) == 5


@pytest.mark.slow
def test_worker_built_from_other_model_constants_refused_in_one_line_chief_unharmed(
    tasks, tmp_path):
  # The worker runs a copy of the project whose MNIST hidden layer and learning rate
  # differ: as a worker started from another checkout would.
  copy = helpers.other_checkout(tmp_path, 'mnist/model.py', [
      (r'^%s = .*$' % name, '%s = %s' % (name, value))
      for name, value in (('LAYER1_NODE', 600), ('INITIAL_LEARNING_RATE', 0.5))])
  hosts = hand_started(2)
  flags = [*hosts, *helpers.STEADY_FLAGS, '--max_steps=50', '--startup_timeout_secs=60']
  tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  chief = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *flags,
                 '--train_dir=%s' % (tmp_path / 'train')])
  other = tasks([sys.executable, '-u', str(copy / 'dist_train.py'), '--job_name=worker',
                 '--task_index=1', *flags])
  assert other.finish() == 1, other.log()
  errors = [line for line in other.err_lines if line.startswith('error')]
  assert errors == [
      'error: worker 1 does not train what the chief (worker 0 at %s) trains: '
      'mnist/model.py INITIAL_LEARNING_RATE is 0.5 here and 0.001 on the chief; '
      'mnist/model.py LAYER1_NODE is 600 here and 500 on the chief. Start every task '
      'from the same code and the same flags.' % hosts[1].split('=')[1].split(',')[0]], \
      other.log()
  assert 'Traceback' not in other.text and 'training from global step' not in other.text
  assert chief.finish() == 0, chief.log()  # async: it trains alone, as it would anyway
  assert helpers.global_step(tmp_path / 'train') == 50


def _other_worker(case, sample, tmp_path):
  """(argv start, flags, what its error line says) of a worker 1 that differs from a chief
  reading `sample`: in its flags, its data or its code."""
  program = ['dist_train.py']
  if case == 'synthetic':
    return program, ['--synthetic'], '--synthetic is true here and false on the chief'
  if case == 'fp16':
    return program, sample.flags + ['--use_fp16'], ('--use_fp16 is true here and false on '
                                                   'the chief')
  if case == 'relabelled':  # a copy of the data whose first label is another class
    copy = tmp_path / 'relabelled'
    shutil.copytree(sample.dir, copy)
    batch = copy / 'cifar-10-batches-bin' / 'data_batch_1.bin'
    data = bytearray(batch.read_bytes())
    data[0] = (data[0] + 1) % 10
    batch.write_bytes(bytes(data))
    return program, ['--data_dir=%s' % copy, '--data_md5=%s' % sample.md5], (
        'md5 of data_batch_1.bin is "%s" here' % hashlib.md5(data).hexdigest())
  # 'edited code': a checkout whose model uses sigmoid for relu, its constants unchanged
  copy = helpers.other_checkout(tmp_path, 'cifar10/model.py',
                                [(r'\btf\.nn\.relu\b', 'tf.nn.sigmoid')])
  return [sys.executable, '-u', str(copy / 'dist_train.py')], sample.flags, (
      'its training graph (tower 0: the model, its loss and gradients, devices aside) is '
      'not the chief\'s: the code differs')


@pytest.mark.slow
@pytest.mark.parametrize('case, mode', [('synthetic', 'sync'), ('fp16', 'sync'),
                                        ('relabelled', 'sync'), ('edited code', 'sync'),
                                        ('edited code', 'async')])
def test_worker_training_something_else_refused_before_its_session_sync_job_ends(
    case, mode, sample, tasks, tmp_path):
  hosts = hand_started(2)
  flags = [*hosts, '--batch_size=4', '--summary_steps=0', '--max_steps=20',
           '--startup_timeout_secs=120'] + (['--sync_replicas'] if mode == 'sync' else [])
  program, own_flags, expected = _other_worker(case, sample, tmp_path)
  ps = tasks(['dist_train.py', '--job_name=ps', '--task_index=0', *hosts])
  chief = tasks(['dist_train.py', '--job_name=worker', '--task_index=0', *flags,
                 *sample.flags, '--train_dir=%s' % (tmp_path / 'train')])
  other = tasks(program + ['--job_name=worker', '--task_index=1', *flags, *own_flags])
  assert other.finish() == 1, other.log()
  errors = [line for line in other.err_lines if line.startswith('error')]
  assert len(errors) == 1 and expected in errors[0], other.log()
  assert 'Traceback' not in other.text and 'training from global step' not in other.text
  if mode == 'async':  # the chief trains alone, as it would anyway
    assert chief.finish() == 0 and ps.finish() == 0, chief.log()
    return
  # Sync: the chief stops at once, naming it (it waited --startup_timeout_secs, before),
  # and the ps task with it.
  assert chief.finish() == 1, chief.log()
  assert [line for line in chief.err_lines if line.startswith('error')] == [
      'error: worker 0: worker(s) 1 refused to join: they do not train what this chief '
      'trains (their own error line says what differs). Start every task from the same '
      'code and the same flags.'], chief.log()
  assert ps.finish(timeout=PS_ENDS_SECS) == 1, ps.log()
  assert helpers.global_step(tmp_path / 'train') == 0  # no update


@pytest.mark.slow
def test_worker_sigterm_during_download_stops_at_once_removing_the_partial_file(tasks,
                                                                              tmp_path):
  # As multi_gpu_train.py's: each worker downloads its own copy of the data.
  data_dir = tmp_path / 'data'
  sent = threading.Event()

  def chunks():  # 10 MB announced, a byte every 0.5 s
    for chunk in helpers.drip(0.5, 200)():
      yield chunk
      sent.set()
  with helpers.serve_stream({'Content-Length': str(10 ** 7)}, chunks) as url:
    worker = tasks(['dist_train.py', '--job_name=worker', '--task_index=1', *hand_started(2),
                    '--data_dir=%s' % data_dir, '--data_url=%scifar-10-binary.tar.gz' % url])
    helpers.wait_until(sent.is_set, 'the first byte sent', worker)
    worker.send(signal.SIGTERM)
    assert worker.finish(timeout=15) == 143, worker.log()
  assert worker.out_lines[-1] == (
      'Stopped by SIGTERM during the download of %scifar-10-binary.tar.gz; the partial file '
      'is removed; nothing else was written.' % url), worker.log()
  assert 'Traceback' not in worker.err, worker.log()
  assert os.listdir(tmp_path) == []
