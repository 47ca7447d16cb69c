"""deploy/: the manifests and the Slurm script name only flags the programs take, and
the JobSet manifest gives each pod the variables cluster_jobset.from_jobset reads.

PyYAML is not a dependency: small readers take what is checked from the manifests,
which are written as plain block YAML for that reason (replica_specs: each TFJob
replica's `command:` list; read_yaml: the whole of jobset.yaml).
"""
import os
import re

import pytest

from distributed import cluster_jobset
import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TFJOB = os.path.join(ROOT, 'deploy', 'kubernetes', 'tfjob.yaml')
JOBSET = os.path.join(ROOT, 'deploy', 'kubernetes', 'jobset.yaml')
SBATCH = os.path.join(ROOT, 'deploy', 'slurm', 'train.sbatch')
DOCKERFILE = os.path.join(ROOT, 'deploy', 'kubernetes', 'Dockerfile')
FLAG = re.compile(r'^--(?:no)?([a-z_0-9]+)(?:=|$)')


def replica_specs(text):
  """{'PS': {'command': [...], 'restartPolicy': 'ExitCode', 'container': 'tensorflow'}, ...}"""
  specs, current, in_command, command_indent = {}, None, False, 0
  for line in text.splitlines():
    stripped = line.split(' #')[0].rstrip() if not line.lstrip().startswith('#') else ''
    if not stripped:
      continue
    indent = len(stripped) - len(stripped.lstrip())
    replica = re.match(r'^    (PS|Chief|Master|Worker|Evaluator):$', stripped)
    if replica:
      current = specs.setdefault(replica.group(1), {'command': []})
      in_command = False
      continue
    if current is None:
      continue
    if in_command:
      item = re.match(r'^\s*- (.+)$', stripped)
      if item and indent >= command_indent:
        current['command'].append(item.group(1).strip('"\''))
        continue
      in_command = False
    key = re.match(r'^\s*(?:- )?(\w+): *(.*)$', stripped)
    if key and key.group(1) == 'command':
      in_command, command_indent = True, indent
    elif key and key.group(1) == 'restartPolicy':
      current['restartPolicy'] = key.group(2)
    elif key and key.group(1) == 'name' and stripped.lstrip().startswith('- name:'):
      current.setdefault('container', key.group(2))
  return specs


def read_yaml(text):
  """The documents of a manifest in plain block YAML, as PyYAML reads them: [dict, ...].

  Mappings and lists by indentation, `- key: value` list items, `[a, b]` lists of
  scalars, quoted strings, whole numbers, true and false; a comment is a line
  starting with `#` or what follows ` #` outside quotes. No anchors, no `|`.
  """
  documents = []
  for part in re.split(r'^---[ \t]*$', text, flags=re.M):
    lines = [(len(line) - len(line.lstrip()), line.strip())
             for line in map(_uncommented, part.splitlines()) if line.strip()]
    if lines:
      value, end = _read_block(lines, 0)
      assert end == len(lines), 'unread YAML from %r' % (lines[end],)
      documents.append(value)
  return documents


def _uncommented(line):
  quote = None
  for i, char in enumerate(line):
    if quote:
      quote = None if char == quote else quote
    elif char in '\'"':
      quote = char
    elif char == '#' and (i == 0 or line[i - 1] in ' \t'):
      return line[:i].rstrip()
  return line.rstrip()


def _read_block(lines, i):
  """The mapping or list starting at lines[i], at that line's indent: (value, next i)."""
  indent = lines[i][0]
  if lines[i][1] == '-' or lines[i][1].startswith('- '):
    items = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith('-'):
      rest = lines[i][1][1:].strip()
      if not rest:
        item, i = _read_block(lines, i + 1)
      elif re.match(r'^[\w./-]+:( |$)', rest):  # `- key: value`: a mapping at indent + 2
        lines[i] = (indent + 2, rest)
        item, i = _read_block(lines, i)
      else:
        item, i = _scalar(rest), i + 1
      items.append(item)
    return items, i
  mapping = {}
  while i < len(lines) and lines[i][0] == indent:
    key, colon, rest = lines[i][1].partition(':')
    assert colon and (not rest or rest.startswith(' ')), 'not key: value: %r' % lines[i][1]
    rest = rest.strip()
    if rest:
      mapping[key], i = _scalar(rest), i + 1
    elif i + 1 < len(lines) and (lines[i + 1][0] > indent or (
        lines[i + 1][0] == indent and lines[i + 1][1].startswith('-'))):
      mapping[key], i = _read_block(lines, i + 1)
    else:
      mapping[key], i = None, i + 1
  return mapping, i


def _scalar(text):
  if text[0] in '\'"':
    assert text[-1] == text[0], 'unclosed quote: %r' % text
    return text[1:-1].replace("''", "'") if text[0] == "'" else text[1:-1]
  if text.startswith('['):
    return [_scalar(item.strip()) for item in text[1:-1].split(',') if item.strip()]
  if re.fullmatch(r'-?[0-9]+', text):
    return int(text)
  return {'true': True, 'false': False}.get(text, text)


def jobset_manifest():
  """jobset.yaml's documents: {kind: the document}."""
  with open(JOBSET) as f:
    return {document['kind']: document for document in read_yaml(f.read())}


def pod_environment(jobset, rjob, job_index, completion_index):
  """The variables one pod of a JobSet sees: its container's env, each fieldRef given
  the label or annotation JobSet (and the Job controller) puts on the pod, plus the
  JOB_COMPLETION_INDEX Kubernetes sets in an Indexed Job's pods. A fieldRef to
  anything else raises KeyError: nothing would fill it in."""
  job = rjob['template']['spec']
  indexed = job.get('completionMode') == 'Indexed'
  metadata = {  # as jobset_controller.go's labelAndAnnotateObject sets them, both ways
      'jobset.sigs.k8s.io/jobset-name': jobset['metadata']['name'],
      'jobset.sigs.k8s.io/replicatedjob-name': rjob['name'],
      'jobset.sigs.k8s.io/replicatedjob-replicas': str(rjob.get('replicas', 1)),
      'jobset.sigs.k8s.io/job-index': str(job_index),
  }
  if indexed:
    metadata['batch.kubernetes.io/job-completion-index'] = str(completion_index)
  fields = {'metadata.%s[\'%s\']' % (kind, key): value
            for kind in ('labels', 'annotations') for key, value in metadata.items()}
  container, = job['template']['spec']['containers']
  env = {'JOB_COMPLETION_INDEX': str(completion_index)} if indexed else {}
  for variable in container.get('env', []):
    if 'value' in variable:
      assert isinstance(variable['value'], str), variable  # the API takes strings only
      env[variable['name']] = variable['value']
    else:
      env[variable['name']] = fields[variable['valueFrom']['fieldRef']['fieldPath']]
  return env


def sbatch_command(text):
  """The srun line's argv, continuation lines joined, from `python` on."""
  joined = re.sub(r'\\\n', ' ', text)
  line = next(l for l in joined.splitlines() if l.strip().startswith('srun '))
  words = line.split()
  return words[words.index('python'):]


def flags_of(argv):
  return [FLAG.match(word).group(1) for word in argv if word.startswith('--')]


def unknown_flags(argv, known_flags):
  """The flags argv names that its program (argv[1]) does not take, in order."""
  return [flag for flag in flags_of(argv) if flag not in known_flags[argv[1]]]


@pytest.fixture
def known_flags(helpshort):
  """{'dist_train.py': the flags it lists, 'cifar10_eval.py': the flags it lists}.

  Each program's own --helpshort (tests/test_first_run.py checks that it lists every
  flag the program accepts and no other), not the flags this process happens to hold;
  read for each test from helpshort's runs, which start each program once a process.
  """
  return {program: helpers.listed_flags(helpshort(program).out)
          for program in ('dist_train.py', 'cifar10_eval.py')}


def test_tfjob_manifest_four_replicas_exit_code_container_tensorflow():
  with open(TFJOB) as f:
    text = f.read()
  assert re.search(r'^apiVersion: kubeflow.org/v1\nkind: TFJob$', text, re.M)
  specs = replica_specs(text)
  assert sorted(specs) == ['Chief', 'Evaluator', 'PS', 'Worker']
  for name, spec in specs.items():
    assert spec['restartPolicy'] == 'ExitCode', name
    assert spec['container'] == 'tensorflow', name  # the operator's TF_CONFIG goes there
  # TF_CONFIG gives each its part, the evaluator's included.
  assert [specs[n]['command'][:3] for n in ('PS', 'Chief', 'Worker', 'Evaluator')] == [
      ['python', 'dist_train.py', '--cluster=tf_config']] * 4
  for name in ('Chief', 'Worker', 'Evaluator'):  # the chief writes, the evaluator reads
    assert '--train_dir=/shared/train' in specs[name]['command']
  # The evaluator ends at the chief's last step.
  assert ([c for c in specs['Chief']['command'] if c.startswith('--max_steps=')] ==
          [c for c in specs['Evaluator']['command'] if c.startswith('--max_steps=')])


@pytest.mark.xdist_group('helpshort')
def test_tfjob_manifest_names_only_flags_the_programs_take(known_flags):
  with open(TFJOB) as f:
    specs = replica_specs(f.read())
  for name, spec in specs.items():
    assert flags_of(spec['command']), name
    assert unknown_flags(spec['command'], known_flags) == [], name


@pytest.mark.xdist_group('helpshort')
def test_sbatch_script_one_srun_step_names_only_dist_train_flags(known_flags):
  with open(SBATCH) as f:
    text = f.read()
  assert len(re.findall(r'^\s*srun ', text, re.M)) == 1
  argv = sbatch_command(text)
  assert argv[:4] == ['python', 'dist_train.py', '--cluster=slurm', '--num_ps=1']
  assert unknown_flags(argv, known_flags) == []


@pytest.mark.xdist_group('helpshort')
def test_flag_reader_catches_an_unknown_flag(known_flags):
  # The checks above would pass on anything if the reader found no flags.
  argv = sbatch_command('srun --label \\\n  python dist_train.py --num_gpu=4 --train_dir=/x\n')
  assert flags_of(argv) == ['num_gpu', 'train_dir']
  assert 'num_gpu' not in known_flags['dist_train.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']
  specs = replica_specs('    PS:\n      restartPolicy: ExitCode\n      template:\n'
                        '        spec:\n          containers:\n            - name: tensorflow\n'
                        '              command:\n                - python\n'
                        '                - dist_train.py\n                - --bogus=1\n'
                        '              volumeMounts:\n                - name: shared\n')
  assert specs == {'PS': {'command': ['python', 'dist_train.py', '--bogus=1'],
                          'restartPolicy': 'ExitCode', 'container': 'tensorflow'}}


@pytest.mark.xdist_group('helpshort')
def test_flag_check_refuses_a_flag_only_the_other_program_takes(known_flags):
  # The evaluator's --checkpoint_dir given to dist_train.py, the trainer's --num_gpus
  # given to cifar10_eval.py: each is a real flag, of the wrong program.
  assert 'checkpoint_dir' in known_flags['cifar10_eval.py']
  assert 'num_gpus' in known_flags['dist_train.py']
  assert unknown_flags(['python', 'dist_train.py', '--cluster=tf_config',
                        '--checkpoint_dir=/shared/train'], known_flags) == ['checkpoint_dir']
  assert unknown_flags(['python', 'cifar10_eval.py', '--run_once', '--num_gpus=2'],
                       known_flags) == ['num_gpus']


# ---- JobSet ---------------------------------------------------------------------

def test_jobset_manifest_ps_and_worker_one_indexed_job_each_cluster_jobset():
  manifest = jobset_manifest()
  assert sorted(manifest) == ['JobSet', 'NetworkPolicy', 'PersistentVolumeClaim']
  jobset = manifest['JobSet']
  assert jobset['apiVersion'] == 'jobset.x-k8s.io/v1alpha2'
  assert jobset['spec']['network'] == {'enableDNSHostnames': True}  # subdomain: the name
  rjobs = {rjob['name']: rjob for rjob in jobset['spec']['replicatedJobs']}
  assert list(rjobs) == ['ps', 'worker']
  for name, rjob in rjobs.items():
    job = rjob['template']['spec']
    assert rjob['replicas'] == 1, name
    assert job['completionMode'] == 'Indexed', name
    assert job['parallelism'] == job['completions'] >= 1, name  # every task at once
    assert job['template']['spec']['restartPolicy'] == 'Never', name  # podFailurePolicy's
    assert job['podFailurePolicy']['rules'] == [
        {'action': 'Ignore', 'onPodConditions': [{'type': 'DisruptionTarget'}]},
        {'action': 'FailJob', 'onExitCodes': {'operator': 'In', 'values': [1]}}], name
    container, = job['template']['spec']['containers']
    assert container['command'][:3] == ['python', 'dist_train.py', '--cluster=jobset'], name
  worker = rjobs['worker']['template']['spec']['template']['spec']
  assert '--train_dir=/shared/train' in worker['containers'][0]['command']
  assert worker['containers'][0]['volumeMounts'] == [{'name': 'shared', 'mountPath': '/shared'}]
  assert worker['volumes'][0]['persistentVolumeClaim']['claimName'] == (
      manifest['PersistentVolumeClaim']['metadata']['name'])
  assert rjobs['worker']['dependsOn'] == [{'name': 'ps', 'status': 'Ready'}]


def test_jobset_manifest_every_pods_environment_gives_from_jobset_its_own_task():
  # What each pod would see, fed to the discovery: the manifest and the code agree.
  jobset = jobset_manifest()['JobSet']
  name = jobset['metadata']['name']
  tasks, clusters = [], []
  for rjob in jobset['spec']['replicatedJobs']:
    job = rjob['template']['spec']
    port = job['template']['spec']['containers'][0]['ports'][0]['containerPort']
    for index in range(job['completions']):
      cluster = cluster_jobset.from_jobset(pod_environment(jobset, rjob, 0, index))
      clusters.append(cluster)
      tasks.append((cluster.job_name, cluster.task_index))
      # JobSet's DNS name for it: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>
      own_hosts = cluster.ps_hosts if cluster.job_name == 'ps' else cluster.worker_hosts
      assert own_hosts[cluster.task_index] == '%s-%s-0-%d.%s:%d' % (
          name, rjob['name'], index, name, port)
  num_ps = sum(job == 'ps' for job, _ in tasks)
  assert tasks == [('ps', i) for i in range(num_ps)] + [
      ('worker', i) for i in range(len(tasks) - num_ps)]
  assert num_ps >= 1 and len(tasks) > num_ps
  assert len({(tuple(c.ps_hosts), tuple(c.worker_hosts)) for c in clusters}) == 1
  chief = clusters[num_ps]
  assert chief.description.endswith('this task: worker 0, the chief (pod %s-worker-0-0)' % name)


def test_jobset_manifest_done_with_workers_fails_on_exit_1_grace_for_the_chief():
  spec = jobset_manifest()['JobSet']['spec']
  assert spec['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['worker']}
  assert spec['failurePolicy']['maxRestarts'] >= 1  # other Job failures: RestartJobSet
  assert [(rule['action'], rule['onJobFailureReasons'])
          for rule in spec['failurePolicy']['rules']] == [('FailJobSet', ['PodFailurePolicy'])]
  rjobs = {rjob['name']: rjob for rjob in spec['replicatedJobs']}
  pod = rjobs['worker']['template']['spec']['template']['spec']
  assert pod['terminationGracePeriodSeconds'] > 30  # past Kubernetes' default: the save
  for rjob in rjobs.values():
    resources = rjob['template']['spec']['template']['spec']['containers'][0]['resources']
    assert resources['limits']['memory'] == resources['requests']['memory'], rjob['name']


def test_jobset_manifest_network_policy_admits_only_the_jobsets_pods_on_the_task_port():
  manifest = jobset_manifest()
  policy, jobset = manifest['NetworkPolicy']['spec'], manifest['JobSet']
  own_pods = {'matchLabels': {'jobset.sigs.k8s.io/jobset-name': jobset['metadata']['name']}}
  ports = {container['ports'][0]['containerPort']
           for rjob in jobset['spec']['replicatedJobs']
           for container in rjob['template']['spec']['template']['spec']['containers']}
  assert policy['podSelector'] == own_pods
  assert policy['policyTypes'] == ['Ingress']
  assert policy['ingress'] == [{'from': [{'podSelector': own_pods}],
                                'ports': [{'protocol': 'TCP', 'port': port} for port in ports]}]


@pytest.mark.xdist_group('helpshort')
def test_jobset_manifest_names_only_flags_the_programs_take(known_flags):
  for rjob in jobset_manifest()['JobSet']['spec']['replicatedJobs']:
    container, = rjob['template']['spec']['template']['spec']['containers']
    assert unknown_flags(container['command'], known_flags) == [], rjob['name']


def test_yaml_reader_reads_nesting_lists_quotes_and_comments_as_written():
  text = ('a: 1  # one\nb:\n  - name: x\n    values: [1, 2]\n  - "q # not a comment"\n'
          'c:\n- \'it\'\'s\'\n---\n# only a comment\nd: true\ne:\n')
  assert read_yaml(text) == [{'a': 1, 'b': [{'name': 'x', 'values': [1, 2]},
                                           'q # not a comment'], 'c': ["it's"]},
                             {'d': True, 'e': None}]


def test_yaml_reader_reads_both_manifests_as_pyyaml_does():
  yaml = pytest.importorskip('yaml')  # not a dependency; where it is installed
  for path in (JOBSET, TFJOB):
    with open(path) as f:
      text = f.read()
    assert read_yaml(text) == [d for d in yaml.safe_load_all(text) if d is not None], path


def test_dockerfile_python_311_slim_installs_requirements_then_copies_repo():
  with open(DOCKERFILE) as f:
    lines = [l for l in f.read().splitlines() if l and not l.startswith('#')]
  assert lines[0] == 'FROM python:3.11-slim'
  steps = [l.split()[0] + ' ' + l.split()[1] for l in lines]
  assert steps.index('COPY requirements.txt') < steps.index('RUN pip') < steps.index('COPY .')
