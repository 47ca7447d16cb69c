"""deploy/kubernetes's manifests, read with PyYAML, and what the controllers would make
of them: each pod's environment (the JobSet's variables, the TFJob's TF_CONFIG)."""
import json
import os
import re

import yaml

from helpers.processes import ROOT

TFJOB = os.path.join(ROOT, 'deploy', 'kubernetes', 'tfjob.yaml')
JOBSET = os.path.join(ROOT, 'deploy', 'kubernetes', 'jobset.yaml')
TFJOB_ALL_REDUCE = os.path.join(ROOT, 'deploy', 'kubernetes', 'tfjob-all-reduce.yaml')
JOBSET_ALL_REDUCE = os.path.join(ROOT, 'deploy', 'kubernetes', 'jobset-all-reduce.yaml')
TFJOB_PORT = 2222         # the operator's default: no container port named tfjob-port
NAMESPACE = 'default'     # kubectl apply's, without -n
_QUANTITY = re.compile(r'^([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?$')
_UNITS = {None: 1, 'm': 0.001, 'k': 10**3, 'M': 10**6, 'G': 10**9,
          'Ki': 2**10, 'Mi': 2**20, 'Gi': 2**30}


def manifest(path):
  """A manifest's documents, {kind: document}; a kind twice is an error."""
  with open(path) as f:
    documents = [d for d in yaml.safe_load_all(f) if d is not None]
  kinds = {document['kind']: document for document in documents}
  assert len(kinds) == len(documents), 'a kind twice in %s' % path
  return kinds


def quantity(text):
  """A Kubernetes quantity as a number: '2Gi' -> 2147483648, '500m' -> 0.5, '1' -> 1."""
  found = _QUANTITY.match(str(text))
  assert found, 'not a quantity this reader knows: %r' % (text,)
  return float(found.group(1)) * _UNITS[found.group(2)]


def tfjob_hosts(tfjob):
  """{replica type: [host of each replica]}: the operator's per-pod service names,
  <tfjob>-<type>-<index>.<namespace>.svc, for every type (the evaluator's too)."""
  name = tfjob['metadata']['name']
  return {rtype: ['%s-%s-%d.%s.svc' % (name, rtype.lower(), i, NAMESPACE)
                  for i in range(spec.get('replicas', 1))]
          for rtype, spec in tfjob['spec']['tfReplicaSpecs'].items()}


def tf_config(tfjob, rtype, index):
  """TF_CONFIG as Kubeflow's training operator sets it in one TFJob pod: every replica
  type but the evaluator in the cluster (it is no part of the training cluster),
  lower-cased, each host with the port."""
  cluster = {rtype_.lower(): ['%s:%d' % (host, TFJOB_PORT) for host in hosts]
             for rtype_, hosts in tfjob_hosts(tfjob).items() if rtype_ != 'Evaluator'}
  return json.dumps({'cluster': cluster, 'task': {'type': rtype.lower(), 'index': index},
                     'environment': 'cloud'})


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


def jobset_host(jobset, rjob, job_index, completion_index):
  """A JobSet pod's DNS name with enableDNSHostnames: <jobset>-<rjob>-<job>-<pod>.<jobset>."""
  name = jobset['metadata']['name']
  return '%s-%s-%d-%d.%s' % (name, rjob['name'], job_index, completion_index, name)
