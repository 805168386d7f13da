#!/usr/bin/env bash
# A/B of two gvfs-proxy builds through the same benchmarks, in one run:
# the old build and this tree's take turns (old, new, old, new...), each
# time copied into target/release, where the benchmarks look for them.
#
# Usage: scripts/ab.sh OLD_RELEASE_DIR [ROUNDS]
#   OLD_RELEASE_DIR holds the old gvfs-proxy and gvfsctl, e.g. made with
#     git worktree add /tmp/old REV && (cd /tmp/old && cargo build --release -p gvfs-proxy --bins)
#   ROUNDS (default 2): turns per build.
# Environment: AB_MIB (default 512): file size of the throughput and warm
# read benchmarks; AB_PARTS (default throughput,cache,clone).
# Output: target/ab/<build>-<round>-<bench>.txt, and a summary of the
# lines each benchmark reports on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: scripts/ab.sh OLD_RELEASE_DIR [ROUNDS]}
rounds=${2:-2}
mib=${AB_MIB:-512}
parts=${AB_PARTS:-throughput,cache,clone}
for b in gvfs-proxy gvfsctl; do
  [ -x "$old/$b" ] || { echo "no $old/$b" >&2; exit 2; }
done

cargo build --release --workspace --bins
# The benchmarks themselves, built once (they do not depend on which
# gvfs-proxy binary runs under them).
cargo bench --no-run --bench throughput --bench cache >/dev/null
cargo test --release --no-run --bench clone >/dev/null
out=target/ab
mkdir -p "$out/new"
cp target/release/gvfs-proxy target/release/gvfsctl "$out/new/"
restore() { install -m 755 "$out/new/gvfs-proxy" "$out/new/gvfsctl" target/release/; }
trap restore EXIT

has() { [[ ",$parts," == *",$1,"* ]]; }
for round in $(seq "$rounds"); do
  for build in old new; do
    dir=$old
    [ "$build" = new ] && dir=$out/new
    # install, not cp: a new inode, so no hard link to cargo's copy changes.
    install -m 755 "$dir/gvfs-proxy" "$dir/gvfsctl" target/release/
    echo "== round $round: $build ($(sha256sum target/release/gvfs-proxy | cut -c1-12))"
    if has throughput; then
      GVFS_BENCH_MIB=$mib GVFS_BENCH_REPS=1 \
        cargo bench --bench throughput 2>&1 | tee "$out/$build-$round-throughput.txt" \
        | grep -E '^\| ' || true
    fi
    if has cache; then
      GVFS_BENCH_PARTS=warm,latency GVFS_BENCH_WARM_MIB=$mib GVFS_BENCH_REPS=2 \
        cargo bench --bench cache 2>&1 | tee "$out/$build-$round-cache.txt" \
        | grep -E 'warm|p50|p99|x direct|ratio' || true
    fi
    if has clone; then
      # The clone benchmark's quick mode (as tests/clone.rs runs it).
      GVFS_CLONE_OUT=$out/clone-$build-$round \
        cargo test --release --bench clone 2>&1 | tee "$out/$build-$round-clone.txt" \
        | grep -E 'clone|resume|verdict' | head -20 || true
    fi
  done
done
