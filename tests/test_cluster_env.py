"""cluster_env.py: the cluster --job_name, --task_index, --ps_hosts and --worker_hosts
name, and the one check every source's cluster passes.

Each test hands from_flags host lists written by hand and checks the cluster, or the
one line refusing it, naming the flag to fix.
"""
import pytest

from distributed import cluster_env
from training import errors


def test_from_flags_good_lists_keep_order():
  cluster = cluster_env.from_flags('worker', 1, '127.0.0.1:2222', '127.0.0.1:2223, localhost:2224')
  assert cluster[:4] == (['127.0.0.1:2222'], ['127.0.0.1:2223', 'localhost:2224'], 'worker', 1)


@pytest.mark.parametrize('value, named', [
    ('', 'is empty'), ('127.0.0.1', "'127.0.0.1'"), ('127.0.0.1:0', "'127.0.0.1:0'"),
    ('127.0.0.1:x', "'127.0.0.1:x'"), ('127.0.0.1:1,,127.0.0.1:2', "''"),
    ('127.0.0.1:65536', "'127.0.0.1:65536' is not host:port with a port 1..65535"),
    ('127.0.0.1:1,127.0.0.1:1', 'worker 0 and worker 1 are both at 127.0.0.1:1')])
def test_from_flags_bad_worker_hosts_raises_naming_it(value, named):
  with pytest.raises(errors.ClusterError, match='^--worker_hosts') as error:
    cluster_env.from_flags('ps', 0, '127.0.0.1:2222', value)
  assert named in str(error.value)


@pytest.mark.parametrize('ps, worker, expected', [
    ('127.0.0.1:2222', '127.0.0.1:2223,127.0.0.1:2222',
     '--ps_hosts and --worker_hosts: ps 0 and worker 1 are both at 127.0.0.1:2222; each task '
     'listens on a port of its own: give every task its own host:port'),
    # Every loopback name is this machine, whose servers listen on every interface.
    ('localhost:2222', '127.0.0.2:2222',
     '--ps_hosts and --worker_hosts: ps 0 and worker 0 are both at localhost:2222 and '
     '127.0.0.2:2222, one port of one machine; each task listens on a port of its own: give '
     'every task its own host:port'),
], ids=['same_entry', 'two_loopback_names'])
def test_from_flags_ps_and_worker_at_one_host_port_raises_naming_both(ps, worker, expected):
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.from_flags('worker', 0, ps, worker)
  assert str(error.value) == expected


@pytest.mark.parametrize('job_name, task_index', [('worker', 2), ('worker', -1), ('ps', 1)])
def test_from_flags_task_index_outside_its_job_raises_naming_it(job_name, task_index):
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.from_flags(job_name, task_index, '127.0.0.1:2222',
                           '127.0.0.1:2223,127.0.0.1:2224')
  count = 1 if job_name == 'ps' else 2
  assert str(error.value) == '--task_index=%d is not a %s task: --%s_hosts lists %d (0..%d)' % (
      task_index, job_name, job_name, count, count - 1)


def test_is_loopback_only_loopback_addresses_pass():
  assert all(cluster_env.is_loopback(h) for h in
             ['127.0.0.1:1', '127.8.9.10:1', 'localhost:1', '[::1]:1'])
  assert not any(cluster_env.is_loopback(h) for h in
                 ['10.0.0.5:1', '0.0.0.0:1', 'myhost:1', 'localhost.evil.com:1', '[::]:1'])


def test_check_loopback_remote_worker_raises_with_reason_and_opt_in():
  with pytest.raises(errors.ClusterError) as error:
    cluster_env.check_loopback(['127.0.0.1:2222'], ['127.0.0.1:2223', '192.168.1.7:2222'])
  message = str(error.value)
  for part in ('--worker_hosts names 192.168.1.7:2222', 'no authentication',
               '--allow_nonloopback_hosts'):
    assert part in message
