#!/bin/bash
# A Docker daemon of its own on this host, for building deploy/kubernetes/Dockerfile and
# running its image as the manifests' pods (tests/test_containers.py, .ci/run).
#
#   eval "$(bash deploy/kubernetes/local_docker.sh start)"   # as root; sets DOCKER_HOST:
#   export DOCKER_HOST=unix:///tmp/local-docker/docker.sock
#   bash deploy/kubernetes/local_docker.sh status
#   bash deploy/kubernetes/local_docker.sh stop     # stops the dockerd start started, nothing else
#
# Debian's docker.io, started directly (no systemd), remembered by its pid file.
# `start` twice is harmless. It opens no port and touches no firewall:
#   --bridge=none --iptables=false  no docker0, no NAT rules: a container has either
#                                   the host's network (--network=host) or none
#   --data-root                     images and containers apart from any other dockerd
#   -H unix://$STATE/docker.sock    its own socket, not /var/run/docker.sock
#
# Environment:
#   LOCAL_DOCKER_DIR   state directory: socket, pid file, log (/tmp/local-docker)
#   LOCAL_DOCKER_ROOT  dockerd's --data-root (/var/lib/docker-ci): kept across stops,
#                      so built images and layers stay cached
set -euo pipefail

STATE=${LOCAL_DOCKER_DIR:-/tmp/local-docker}
DATA_ROOT=${LOCAL_DOCKER_ROOT:-/var/lib/docker-ci}
SOCKET=$STATE/docker.sock
PID_FILE=$STATE/dockerd.pid
WAIT_SECS=60          # for dockerd to answer before start gives up
export DOCKER_HOST=unix://$SOCKET

install_packages() {
  command -v dockerd >/dev/null && command -v docker >/dev/null && return
  echo "installing docker.io" >&2
  apt-cache show docker.io >/dev/null 2>&1 || apt-get update -qq >&2
  # Its postinst asks invoke-rc.d to start the system's dockerd; without systemd it stays stopped.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >&2
}

running() {
  [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null
}

start() {
  install_packages
  mkdir -p "$STATE" "$DATA_ROOT"
  if ! running; then
    setsid dockerd --bridge=none --iptables=false --ip6tables=false --data-root="$DATA_ROOT" \
      --exec-root="$STATE/exec" --pidfile="$PID_FILE" -H "unix://$SOCKET" \
      >>"$STATE/dockerd.log" 2>&1 &
  fi
  local deadline=$((SECONDS + WAIT_SECS))
  until docker version >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "error: dockerd did not answer on $SOCKET within $WAIT_SECS s; it logged:" >&2
      tail -n 20 "$STATE/dockerd.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  echo "export DOCKER_HOST=$DOCKER_HOST"
}

stop() {
  running || return 0
  local pid
  pid=$(cat "$PID_FILE")
  kill "$pid"     # dockerd stops its containers (10 s each at most), then exits
  for _ in $(seq 150); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}

status() {
  if running; then echo "running: $PID_FILE ($(cat "$PID_FILE")), $DOCKER_HOST"
  else echo "stopped: $PID_FILE"; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
