#!/bin/bash
# A stand-in for python:3.11-slim, made from Debian's packages, for building
# deploy/kubernetes/Dockerfile where no container registry can be reached:
#
#   eval "$(bash deploy/kubernetes/local_docker.sh start)"   # a dockerd; sets DOCKER_HOST
#   bash deploy/kubernetes/make_base_image.sh                # prints the image's name
#   docker build --network=host --build-arg BASE=cifar10-base:bookworm-python3.11 \
#       -f deploy/kubernetes/Dockerfile -t cifar10-dist:local .
#
# Debian 12 (bookworm) ships Python 3.11. debootstrap installs a minimal bookworm
# with python3, python3-venv and ca-certificates; a venv at /opt/venv, first on PATH,
# gives the image what python:3.11-slim has: `python` and `pip` that install into the
# image (Debian's own pip refuses to, PEP 668). `docker import` makes it an image.
# Nothing but Debian's mirror is reached here; the Dockerfile's pip reaches PyPI.
#
# The certificates this host adds to Debian's (/usr/local/share/ca-certificates: a
# network's own CA, say) go into the image too, so that pip in the build trusts what
# this host trusts. This is a stand-in for one machine: push images built on it nowhere.
#
# As root, with a dockerd (local_docker.sh). An image of that name already there is
# kept: remove it (docker rmi) to make it again.
#
# Environment:
#   BASE_IMAGE     the image's name (cifar10-base:bookworm-python3.11)
#   DEBIAN_MIRROR  where debootstrap downloads from (http://deb.debian.org/debian)
set -euo pipefail

IMAGE=${BASE_IMAGE:-cifar10-base:bookworm-python3.11}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm        # Python 3.11, the version the Dockerfile's python:3.11-slim has
PACKAGES=python3,python3-venv,ca-certificates
VENV=/opt/venv

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "$IMAGE"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  apt-cache show debootstrap >/dev/null 2>&1 || apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
fi

ROOTFS=$(mktemp -d /var/tmp/cifar10-base.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
echo "debootstrap $SUITE into $ROOTFS" >&2
debootstrap --variant=minbase --include=$PACKAGES "$SUITE" "$ROOTFS" "$MIRROR" >&2

shopt -s nullglob
local_cas=(/usr/local/share/ca-certificates/*.crt)
if [ ${#local_cas[@]} -gt 0 ]; then
  cp "${local_cas[@]}" "$ROOTFS/usr/local/share/ca-certificates/"
  chroot "$ROOTFS" update-ca-certificates >&2
fi
chroot "$ROOTFS" python3 -m venv "$VENV"
version=$(chroot "$ROOTFS" "$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != 3.11 ]; then
  echo "error: $SUITE's python3 is $version, not 3.11" >&2
  exit 1
fi
# What only debootstrap and apt needed: the downloaded packages and lists.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

tar -C "$ROOTFS" -c . | docker import \
  --change "ENV PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python"]' \
  --message "debootstrap $SUITE ($PACKAGES), a venv at $VENV" - "$IMAGE" >&2
echo "$IMAGE"
