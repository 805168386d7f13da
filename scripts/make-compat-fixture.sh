#!/usr/bin/env bash
# Writes the fixture of tests/compat.rs: cache directories (block cache,
# file cache, metadata index) and the ext4 image of their dir: origin, as an
# OLD gvfs-proxy left them, for this build to read.
#
# Usage: scripts/make-compat-fixture.sh OLD_BIN_DIR [REV]
#   OLD_BIN_DIR  the directory holding the old build's gvfs-proxy and
#                gvfsctl, for example:
#                  git worktree add /tmp/old cd59195
#                  (cd /tmp/old && cargo build --release -p gvfs-proxy --bins)
#                  scripts/make-compat-fixture.sh /tmp/old/target/release
#   REV          the commit they were built from (default: the short HEAD of
#                the git work tree OLD_BIN_DIR is in)
#
# Writes tests/fixtures/compat-REV/: fixture.tar.gz, stats-killed.json,
# stats-stopped.json and README.txt (what it holds, with sha256 sums). The
# work is the ignored test `make_fixture` in tests/compat.rs, which drives
# the old binaries only (this build's test client and libnfs are the
# clients). Runs as root: it loop-mounts an ext4 image (mkfs.ext4, mount
# -o loop); also needs tar, gzip, sha256sum and libnfs-utils (nfs-cat,
# nfs-cp). A fixture of another REV is read once FIXTURE in tests/compat.rs
# names it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
bins=$(cd "$1" && pwd)
for b in gvfs-proxy gvfsctl; do
  [ -x "$bins/$b" ] || { echo "no $bins/$b" >&2; exit 2; }
done
rev=${2:-$(git -C "$bins" rev-parse --short HEAD)}
out=$PWD/tests/fixtures/compat-$rev
mkdir -p "$out"

GVFS_COMPAT_OLD_BINS=$bins GVFS_COMPAT_REV=$rev GVFS_COMPAT_OUT=$out \
  cargo test --locked --test compat -- --ignored --exact make_fixture
ls -l "$out"
