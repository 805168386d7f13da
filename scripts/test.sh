#!/usr/bin/env bash
# Installs the system packages the tests need, then runs every test.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# QEMU loads its nfs:// driver (block-nfs.so, in qemu-block-extra) only when
# it was built for the same QEMU version, so qemu-block-extra must come from
# the same suite as the installed qemu-utils (bookworm-backports on images
# that ship QEMU 10 from there).
backports=()
if dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q 'bpo12'; then
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      | sudo_ tee /etc/apt/sources.list.d/gvfs-backports.sources >/dev/null
  fi
  backports=(-t bookworm-backports)
fi
sudo_ apt-get update -qq
# The clone benchmark's quick run (tests/clone.rs) boots guests with
# qemu-system-x86, a busybox-static initramfs, an ext4 disk made by mke2fs,
# and Debian's kernel, which it fetches itself with `apt-get download`; its
# chart needs a TTF font. The kernel NFS client suite (tests/kernel.rs) boots
# the same kernel and busybox, with a mount helper built by `gcc -static`.
# The FUSE front end's tests (tests/fuse_*.rs) mount through /dev/fuse and
# clear mounts with fusermount3 (Debian's fuse3). The guide's test
# (tests/guide.rs) reads the metrics endpoint with curl.
sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${backports[@]}" \
  nfs-ganesha nfs-ganesha-vfs libnfs-utils qemu-utils qemu-block-extra \
  qemu-system-x86 busybox-static e2fsprogs fonts-dejavu-core gcc libc6-dev fuse3 curl >/dev/null

# No new import circle between a crate's files and no new source file over
# 800 lines (scripts/check-structure.known lists the old ones; it only shrinks).
python3 scripts/check-structure.py
# The protocol core stays sans-IO: it builds without its tokio side.
cargo check --locked -p gvfs-nfs --no-default-features
# The previous code commit's gvfs-proxy, for the hot upgrade from it in the
# quick clone run (built first: this commit's build then redoes only what
# changed).
GVFS_PREV_BIN=$(scripts/build-prev.sh)
export GVFS_PREV_BIN
# The integration tests run the real gvfs-proxy binary: build it first.
cargo build --locked --workspace --bins
cargo test --locked --workspace "$@"
