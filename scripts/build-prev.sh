#!/usr/bin/env bash
# Builds the gvfs-proxy of the newest commit before HEAD that changed code,
# for the hot upgrade from it that the quick clone run's "lazy restart"
# makes (tests/clone.rs; src/clone/restart.rs reads GVFS_PREV_BIN), and
# prints the binary's path. It builds in this checkout, before this
# commit's own build, so that build recompiles only what changed since.
# Prints nothing (and the upgrade is from this build to itself) when there
# is no such commit (a shallow clone), the tree has changes not committed,
# or that commit does not build.
set -uo pipefail
cd "$(dirname "$0")/.."

prev=$(git log -1 --format=%H HEAD~1 -- crates vendor Cargo.toml Cargo.lock 2>/dev/null) || exit 0
[ -n "$prev" ] || exit 0
if ! git diff --quiet || ! git diff --cached --quiet; then
  echo "build-prev: uncommitted changes; the hot upgrade is from this build" >&2
  exit 0
fi
back=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
git -c advice.detachedHead=false checkout -q "$prev" || exit 0
target=${CARGO_TARGET_DIR:-target}
out=""
if cargo build --locked -q -p gvfs-proxy --bin gvfs-proxy >&2; then
  mkdir -p "$target/prev"
  cp "$target/debug/gvfs-proxy" "$target/prev/gvfs-proxy"
  out=$(cd "$target/prev" && pwd)/gvfs-proxy
  echo "build-prev: gvfs-proxy of ${prev:0:7} for the hot upgrade" >&2
else
  echo "build-prev: ${prev:0:7} does not build; the hot upgrade is from this build" >&2
fi
git checkout -q "$back"
echo "$out"
