"""The suite's own machinery: what keeps its shared fixtures shared."""
import os

import pytest


@pytest.mark.xdist_group('suite')
def test_xdist_group_reaches_the_scheduler_as_the_nodeid_suffix(request):
  # pytest-xdist's loadgroup sends a group's tests to one process by the `@group` suffix
  # its hook puts on each nodeid. Under pytest 9.2 the suffix was silently gone: the
  # Slurm tests ran in three processes at once, each rewriting the Slurm's config as
  # another's sbatch read it ('slurm.conf is empty'), and every module's cluster and
  # trained model was built once per process.
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    pytest.skip('not an xdist worker: no groups to send')
  if not request.config.getvalue('loadgroup'):
    pytest.skip('run without --dist=loadgroup')
  assert request.node.nodeid.endswith('@suite'), request.node.nodeid
