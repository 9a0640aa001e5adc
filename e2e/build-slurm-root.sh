#!/usr/bin/env bash
# A root filesystem with the Slurm release Slinky's operator talks to, for make e2e: Slinky slurm-operator 1.1.0
# reads and drains Slurm nodes through slurmrestd's API v0.0.44 (slurm-client api/v0044), which Slurm 24.11
# (Debian trixie, on this machine) does not serve; Debian sid ships Slurm 26.05, whose slurmrestd serves
# data_parser v0.0.42 to v0.0.45. A minimal sid made by debootstrap, with slurmctld, slurmd, slurmrestd, the
# JWT plugins (the operator's tokens), slurm-client and munge from deb.debian.org; the tests run its daemons
# under chroot, each in a private mount namespace (tests/e2e/slurm_root.py).
# Kept once per machine beside the built tools (GPUCLUSTER_TOOL_CACHE), keyed by this script; OUT/slurm-root
# links to it. sid moves and no snapshot archive is reachable here, so versions are not pinned: what was
# installed is in slurm-root/VERSIONS, and the root is refused unless its slurmrestd serves v0.0.44.
# Usage: e2e/build-slurm-root.sh [OUT_DIR]   (default .e2e; needs root, debootstrap and deb.debian.org)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.e2e}")
api=v0.0.44
packages=(slurmctld slurmd slurmrestd slurm-wlm-jwt-plugin slurm-client munge)
cache=${GPUCLUSTER_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpucluster/tools}
root=$cache/slurm-root-$(sha256sum "$0" | cut -c1-16)
mkdir -p "$out" "$cache"

if [[ ! -x $root/usr/sbin/slurmrestd ]]; then
  [[ $(id -u) == 0 ]] || { echo "build-slurm-root: debootstrap and chroot need root" >&2; exit 1; }
  command -v debootstrap >/dev/null 2>&1 || { echo "build-slurm-root: no debootstrap; apt-get install debootstrap" >&2; exit 1; }
  start=$SECONDS
  tmp=$root.tmp.$$
  trap 'rm -rf "$tmp"' EXIT
  echo "build-slurm-root: debootstrap sid into $root" >&2
  debootstrap --variant=minbase sid "$tmp" http://deb.debian.org/debian >"$cache/slurm-root.log" 2>&1 \
    || { tail -n 20 "$cache/slurm-root.log" >&2; echo "build-slurm-root: debootstrap failed ($cache/slurm-root.log)" >&2; exit 1; }
  # sid's Release file can read as expired against this machine's clock; its signature is still checked.
  echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/99gpucluster"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n' >"$tmp/etc/hosts"
  # No daemon starts while packages install (no init runs in the root).
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 0755 "$tmp/usr/sbin/policy-rc.d"
  chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$cache/slurm-root.log" 2>&1
  chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" \
    >>"$cache/slurm-root.log" 2>&1 \
    || { tail -n 20 "$cache/slurm-root.log" >&2; echo "build-slurm-root: apt-get install failed" >&2; exit 1; }
  # slurmrestd refuses to run as root or SlurmUser: its own user.
  chroot "$tmp" useradd --system --no-create-home --shell /usr/sbin/nologin slurmrestd
  chroot "$tmp" apt-get clean
  chroot "$tmp" dpkg-query -W "${packages[@]}" >"$tmp/VERSIONS"
  if ! chroot "$tmp" slurmrestd -d list 2>&1 | grep -qx "data_parser/$api"; then
    echo "build-slurm-root: sid's slurmrestd ($(cut -f2 "$tmp/VERSIONS" | sort -u | tr '\n' ' ')) does not serve" \
      "$api, which Slinky's operator 1.1.0 talks; pin the operator to a release that talks what it serves" >&2
    exit 1
  fi
  mv "$tmp" "$root"
  trap - EXIT
  echo "build-slurm-root: made in $((SECONDS - start)) s: $(tr '\t\n' '= ' <"$root/VERSIONS")" >&2
fi
ln -sfn "$root" "$out/slurm-root"
