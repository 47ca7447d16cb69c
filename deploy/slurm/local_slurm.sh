#!/bin/bash
# A real Slurm on this one host, from Debian's packages, for trying
# deploy/slurm/train.sbatch with real sbatch (and for tests/test_slurm.py).
#
#   bash deploy/slurm/local_slurm.sh start     # as root; prints the variables to export
#   export SLURM_CONF=/tmp/local-slurm/slurm.conf
#   sbatch --chdir="$PWD" deploy/slurm/train.sbatch --synthetic --max_steps=20 ...
#   bash deploy/slurm/local_slurm.sh status
#   bash deploy/slurm/local_slurm.sh stop      # kills what start started, nothing else
#
# Debian 12 (bookworm) ships Slurm 22.05. No systemd here: every daemon is
# started directly, in the background, and remembered by its pid file in the
# state directory. `start` twice is harmless: what runs already is kept.
#
# What listens where (CommunicationParameters=NoInAddrAny binds the slurmd's and
# srun to 127.0.0.1, the address their names have here):
#   munged     unix socket $STATE/munge/munge.socket (a munged of our own, own key)
#   slurmctld  0.0.0.0:$CTLD_PORT (6817): Slurm 22.05's slurmctld binds every
#              interface whatever NoInAddrAny says; munge still authenticates
#              every request, and only this host holds the key.
#   slurmd nI  127.0.0.1:$((CTLD_PORT + I)) (6818, 6819, ...): one per node, `slurmd -N nI`
#   srun       127.0.0.1, ports for its tasks' I/O from SrunPortRange (60001-60999)
#   the tasks  dist_train.py: every interface (TensorFlow's servers), on the ports
#              srun reserved for the step: MpiParams=ports (12000-12999) hands every
#              step SLURM_STEP_RESV_PORTS (e.g. 12001-12005), which dist_train.py
#              reads (distributed/cluster_slurm.py); with srun --resv-ports=0,
#              none: 8888 + index on the node (--slurm_port_base).
#
# Environment:
#   LOCAL_SLURM_DIR    state directory: config, logs, spools, pid files (/tmp/local-slurm)
#   LOCAL_SLURM_NODES  how many nodes n1..nN (2)
#   LOCAL_SLURM_CPUS   CPUs each node declares, whatever the host has (16: the shipped
#                      train.sbatch asks 2 tasks x 8 CPUs per node)
#   LOCAL_SLURM_PORT   slurmctld's port; the nodes take the next ones (6817)
#   LOCAL_SLURM_HOSTS  1: add the node names to /etc/hosts as 127.0.0.1 if they do not
#                      resolve; 0: leave /etc/hosts alone (1)
#
# Why /etc/hosts: Slurm itself reaches the nodes at NodeAddr=127.0.0.1, but a job's
# tasks see only node names (SLURM_STEP_NODELIST=n1), and dist_train.py's tasks
# connect to each other by those names. start adds one line, marked with this
# script's name, and stop removes it.
#
# One host, several nodes: Slurm is happy, but two tasks on different nodes that
# pick the same port (srun's reserved ports: each node reserves from the same range;
# without them, 8888 + index on the node) collide on 127.0.0.1. Train on one node:
#   sbatch --nodes=1 --ntasks-per-node=4 ... deploy/slurm/train.sbatch ...
set -euo pipefail

STATE=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
export SLURM_CONF=$STATE/slurm.conf   # what sinfo, scancel, squeue below read
NODES=${LOCAL_SLURM_NODES:-2}
CPUS=${LOCAL_SLURM_CPUS:-16}
CTLD_PORT=${LOCAL_SLURM_PORT:-6817}
WAIT_SECS=60          # for the daemons to come up before start gives up
PACKAGES=(slurmctld slurmd slurm-client munge)
HOSTS_MARK='# deploy/slurm/local_slurm.sh'
CONF=$SLURM_CONF
MUNGE_SOCKET=$STATE/munge/munge.socket

node_names() {
  seq -f 'n%g' 1 "$NODES"
}

install_packages() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing ${missing[*]}"
  # An image without package lists cannot find them: update only then.
  apt-cache show "${missing[0]}" >/dev/null 2>&1 || apt-get update -qq
  # The packages' postinst scripts try to start the daemons with invoke-rc.d;
  # without systemd (or with a policy-rc.d that says no) they stay stopped.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The config on stdout.
conf_text() {
  local host
  host=$(hostname -s)
  # slurmctld starts only on the host SlurmctldHost names: this one, at 127.0.0.1.
  cat <<EOF
# Written by deploy/slurm/local_slurm.sh; rewritten by every start.
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
CommunicationParameters=NoInAddrAny
SrunPortRange=60001-60999
# Each step gets (tasks per node + 1) ports from here, the same on every node
# (SLURM_STEP_RESV_PORTS=12005-12007), unless srun --resv-ports=0. Without
# MpiParams=ports, srun --resv-ports is refused (ESLURM_PORTS_INVALID).
MpiDefault=none
MpiParams=ports=12000-12999
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's restart (120 s by default): 10 s is enough here.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
# Root runs everything: no slurm user to create, and every job's files are reachable.
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
# %n is the node's name, so the slurmd's on this host keep apart.
SlurmdSpoolDir=$STATE/%n/spool
SlurmdPidFile=$STATE/%n/slurmd.pid
SlurmdLogFile=$STATE/log/slurmd-%n.log
# No cgroups without systemd: processes are found through /proc, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
# No slurmdbd, so sacct has nothing to read; a finished job stays in
# scontrol show job for MinJobAge seconds, and one line per finished job goes
# to the jobcomp file.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
MinJobAge=3600
SchedulerType=sched/backfill
# A requeued job becomes eligible again while no event wakes the scheduler: it
# waited up to a minute (sched_interval=60 by default) for the next pass.
SchedulerParameters=sched_interval=5,bf_interval=5
# CPUs, not whole nodes: several tasks and jobs share a node.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# A node may declare more CPUs than the host has.
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# Seconds between a job's SIGTERM and its SIGKILL at its time limit or scancel.
KillWait=30
# Longer than KillWait. srun --kill-on-bad-exit, once a task has exited 143 on
# a stop, asks slurmctld to SIGTERM the step and SIGKILL it after KillWait; slurmd
# answers when that is done. Past MessageTimeout (10 s by default) slurmctld
# gives up and sends the same request again 60 s later, to the same job and
# step ID. On a cluster with the default cred_expire a requeued job has not
# started again by then; here (cred_expire=10 above) it has, and that late
# request stopped its new run.
MessageTimeout=45
SlurmctldDebug=info
SlurmdDebug=info
EOF
  local port=$CTLD_PORT
  for node in $(node_names); do
    port=$((port + 1))
    echo "NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$host Port=$port CPUs=$CPUS State=UNKNOWN"
  done
  echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

# Running daemons keep the config they started with: a different one needs a restart.
write_conf() {
  local text
  text=$(conf_text)
  if running "$STATE/slurmctld.pid" && [ "$text" != "$(cat "$CONF")" ]; then
    echo "error: Slurm runs with another $CONF; run \`$0 stop\` first" >&2
    exit 1
  fi
  echo "$text" >"$CONF"
}

add_hosts() {
  [ "${LOCAL_SLURM_HOSTS:-1}" = 1 ] || return 0
  local missing=()
  for node in $(node_names); do
    getent hosts "$node" >/dev/null || missing+=("$node")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "127.0.0.1 ${missing[*]} $HOSTS_MARK" >>/etc/hosts
}

remove_hosts() {
  # sed -i replaces the file; /etc/hosts may be a mount point, so write it in place.
  local kept
  kept=$(grep -v -F "$HOSTS_MARK" /etc/hosts || true)
  [ "$kept" = "$(cat /etc/hosts)" ] || echo "$kept" >/etc/hosts
}

# Runs when the pid file names a live process.
running() {
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_munge() {
  running "$STATE/munge/munged.pid" && return
  [ -f "$STATE/munge/munge.key" ] || mungekey --create --keyfile="$STATE/munge/munge.key"
  chmod 711 "$STATE/munge"   # others reach the socket, not the key
  chmod 600 "$STATE/munge/munge.key"
  munged --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/munged.seed"
}

start_slurmctld() {
  running "$STATE/slurmctld.pid" && return
  # -i: ignore the state of a previous run (its jobs and nodes) that this config may not match.
  slurmctld -f "$CONF" -i
}

start_slurmd() {
  local node=$1
  running "$STATE/$node/slurmd.pid" && return
  slurmd -f "$CONF" -N "$node"
}

wait_idle() {
  local deadline=$((SECONDS + WAIT_SECS)) idle
  while :; do
    idle=$(sinfo -h -N -t idle,mix,alloc -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$NODES" ] && return
    if [ $SECONDS -ge $deadline ]; then
      echo "error: $NODES nodes not idle within $WAIT_SECS s; see $STATE/log/" >&2
      sinfo -N -l >&2 || true
      tail -n 5 "$STATE"/log/*.log >&2 || true
      exit 1
    fi
    sleep 1
  done
}

start() {
  install_packages
  mkdir -p "$STATE"/{log,ctld,munge}
  for node in $(node_names); do mkdir -p "$STATE/$node/spool"; done
  write_conf
  add_hosts
  start_munge
  start_slurmctld
  for node in $(node_names); do start_slurmd "$node"; done
  wait_idle
  echo "export SLURM_CONF=$CONF"
}

stop_pid() {
  local pid_file=$1 pid
  running "$pid_file" || return 0
  pid=$(cat "$pid_file")
  kill "$pid"
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}

squeue_ids() {
  squeue -h -o %A "$@"
}

# slurmstepd's (a job's processes) outlive their slurmd: end the jobs first,
# at once (SIGKILL, not KillWait's grace), then wait for their processes to go.
cancel_jobs() {
  running "$STATE/slurmctld.pid" || return 0
  local ids deadline=$((SECONDS + 20))
  mapfile -t ids < <(squeue_ids)
  [ ${#ids[@]} -eq 0 ] && return
  scancel --quiet --full --signal=KILL "${ids[@]}" || true
  scancel --quiet "${ids[@]}" || true
  while [ -n "$(squeue_ids -t R,CG)" ] && [ $SECONDS -lt $deadline ]; do
    sleep 1
  done
}

stop() {
  cancel_jobs
  # Every node's, also of a start with another LOCAL_SLURM_NODES.
  for pid_file in "$STATE"/*/slurmd.pid; do stop_pid "$pid_file"; done
  stop_pid "$STATE/slurmctld.pid"
  stop_pid "$STATE/munge/munged.pid"
  remove_hosts
}

status() {
  for pid_file in "$STATE/munge/munged.pid" "$STATE/slurmctld.pid" $(node_names | sed "s|.*|$STATE/&/slurmd.pid|"); do
    if running "$pid_file"; then echo "running: $pid_file ($(cat "$pid_file"))"
    else echo "stopped: $pid_file"; fi
  done
  sinfo -N || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
