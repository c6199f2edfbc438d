#!/usr/bin/env bash
# Builds the stage images' base here, where no image can be pulled: a Debian bookworm root made with
# debootstrap, Python 3.11 in a venv on PATH (as python:3.11-slim has pip on PATH), the machine's
# CA certificates (so pip inside a build passes the egress proxy's TLS), imported under the name the
# Dockerfiles' FROM uses. The root file system is cached; a present image is kept.
#   usage: scripts/build-base-image.sh ENGINE NAME     e.g. podman python:3.11.11-slim-bookworm
#   GAGAR_BASE_CACHE   cache folder (default /var/cache/gagar/base)
#   DEBIAN_MIRROR      default http://deb.debian.org/debian
set -euo pipefail
engine=${1:?usage: build-base-image.sh ENGINE NAME}
name=${2:?usage: build-base-image.sh ENGINE NAME}
cache=${GAGAR_BASE_CACHE:-/var/cache/gagar/base}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
tarball="$cache/bookworm-python3.tar"

if "$engine" image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name present" >&2
  exit 0
fi
if [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  rootfs="$cache/rootfs"
  rm -rf "$rootfs"
  start=$(date +%s)
  nice -n 10 debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >&2
  for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -e "$crt" ] && cp "$crt" "$rootfs/usr/local/share/ca-certificates/"
  done
  chroot "$rootfs" update-ca-certificates >&2
  chroot "$rootfs" python3 -m venv /opt/python >&2
  printf 'deb %s bookworm main\n' "$mirror" > "$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$rootfs"
  echo "base root file system built in $(($(date +%s) - start)) s" >&2
fi
bundle=/etc/ssl/certs/ca-certificates.crt
"$engine" import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "ENV PIP_CERT=$bundle" --change "ENV SSL_CERT_FILE=$bundle" --change "ENV REQUESTS_CA_BUNDLE=$bundle" \
  --change 'CMD ["python3"]' \
  "$tarball" "$name" >&2
echo "imported base image $name" >&2
