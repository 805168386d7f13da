//! The on-disk formats stay readable: block caches, file caches and
//! metadata indexes written by an older gvfs-proxy open with this build,
//! which reports nothing lost, serves what the old proxy held, dirty bytes
//! the origin never got included, and writes them back.
//!
//! The fixture, `tests/fixtures/compat-cd59195/`, was written by the
//! binaries of commit cd59195 (the last before the restructuring of the
//! crates) with [`make_fixture`] below; `scripts/make-compat-fixture.sh
//! OLD_BIN_DIR` writes it again (see there). It is an ext4 image of the
//! `dir:` origin and two cache directories, one from a proxy killed with
//! SIGKILL, one from a proxy stopped with SIGTERM and
//! `--no-writeback-on-exit`, each holding only committed writes. The origin
//! travels as an image because everything in a cache is keyed by file
//! handle, and a `dir:` origin's handles name inodes and their birth times;
//! the metadata files and the files held whole are also checked against
//! the origin's ctime, which no copy of a file keeps. So the tests
//! loop-mount the image (as root, as the tests run; `mount -o loop`) and
//! unpack with `tar` and `gzip`. The killed cache is opened twice, as after
//! a crash of the proxy alone and as after one of the whole system (its
//! `boot-id` set to this boot's, or another's), since recovery differs.
//!
//! Each scenario's files (`SCENARIO-NAME` in the export, see [`specs`]):
//! blocks read whole through the old proxy (clean blocks) and then written
//! to (dirty blocks, one write past the end of the file), blocks written
//! and never read (partial sub-blocks), a file created through the proxy
//! whose data only the cache has, a file held whole by compress-and-copy
//! with held writes, one held whole and clean, and one with a zero map.
//! Every byte is text naming its file and offset ([`pattern`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::nfs3_types::nfs3::stable_how;
use gvfs_testbed::data::{compare_bytes, write_sparse_chunks};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::process;
use gvfs_testbed::{Proxy, ProxyArgs, WritePolicy};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The fixture this build must read, under `tests/fixtures/`.
const FIXTURE: &str = "compat-cd59195";

/// The scenarios: how each old caching proxy stopped.
const SCENARIOS: [(&str, Stop); 2] = [("killed", Stop::Kill), ("stopped", Stop::Term)];

/// Longest any helper command (mount, tar, gvfsctl) may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGKILL after the last COMMIT: a crash, as far as the cache knows.
    Kill,
    /// SIGTERM with `--no-writeback-on-exit`: a clean shutdown that leaves
    /// the dirty data in the cache.
    Term,
}

/// How a file of a scenario came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Read whole through the old proxy (clean blocks), then written to.
    Blocks,
    /// Never read through the old proxy, only written to (partial
    /// sub-blocks: only the bytes written are known).
    Cold,
    /// Created through the old proxy by `nfs-cp`: empty at the origin.
    New,
    /// Marked for compress-and-copy, held whole in the file cache, then
    /// written to (held writes).
    Held,
    /// Marked for compress-and-copy and held whole, clean.
    Kept,
    /// With a zero map (no compress-and-copy), read whole.
    Zeros,
}

/// A file of each scenario: what the origin holds and the writes the old
/// proxy took (and kept) after reading what `kind` says.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    kind: Kind,
    /// Size at the origin.
    size: u64,
    /// Extents `(offset, len)` of text at the origin; the rest are holes.
    data: &'static [(u64, u64)],
    /// Writes `(offset, len, FILE_SYNC)` (UNSTABLE unless FILE_SYNC),
    /// followed by a COMMIT of the file. A `New` file's only write is
    /// `nfs-cp`'s, then a COMMIT.
    writes: &'static [(u64, u64, bool)],
}

fn specs() -> [Spec; 6] {
    [
        Spec {
            name: "blocks.bin",
            kind: Kind::Blocks,
            size: 256 * KIB,
            data: &[(0, 256 * KIB)],
            // A whole block, a few bytes inside one, and past the end.
            writes: &[
                (64 * KIB, 64 * KIB, false),
                (150_000, 100, false),
                (256 * KIB + 1000, 3000, false),
            ],
        },
        Spec {
            name: "cold.bin",
            kind: Kind::Cold,
            size: 64 * KIB,
            data: &[(0, 64 * KIB)],
            writes: &[(5000, 300, false), (40_000, 5000, false)],
        },
        Spec {
            name: "new.bin",
            kind: Kind::New,
            size: 0,
            data: &[],
            writes: &[(0, 100_000, false)],
        },
        Spec {
            name: "image.raw",
            kind: Kind::Held,
            size: 4 * MIB,
            data: &[(0, 32 * KIB), (3 * MIB, 32 * KIB)],
            // Into a chunk of data, and into a chunk of zeros (a hole).
            writes: &[(3 * MIB + 100, 200, true), (MIB + 4096, 8192, false)],
        },
        Spec {
            name: "kept.raw",
            kind: Kind::Kept,
            size: 2 * MIB,
            data: &[(0, 16 * KIB), (MIB + 512 * KIB, 16 * KIB)],
            writes: &[],
        },
        Spec {
            name: "zeros.raw",
            kind: Kind::Zeros,
            size: MIB,
            data: &[(512 * KIB, 8 * KIB)],
            writes: &[],
        },
    ]
}

/// Bytes per line of [`pattern`].
const LINE: u64 = 32;

/// `len` bytes of `tag`'s text from byte `offset`: 32-byte lines, each the
/// tag (cut or padded to 20 characters) and the line's own offset, so bytes
/// out of place or from another write show, and the fixture compresses.
fn pattern(tag: &str, offset: u64, len: u64) -> Vec<u8> {
    let skip = (offset % LINE) as usize;
    let len = len as usize;
    let mut line = offset / LINE;
    let mut out = Vec::with_capacity(skip + len + LINE as usize);
    while out.len() < skip + len {
        out.extend_from_slice(format!("{tag:<20.20} {:010x}\n", line * LINE).as_bytes());
        line += 1;
    }
    out[skip..skip + len].to_vec()
}

/// The tag of the `i`th write into `file`.
fn write_tag(file: &str, i: usize) -> String {
    format!("{file}#{i}")
}

impl Spec {
    fn file(&self, scenario: &str) -> String {
        format!("{scenario}-{}", self.name)
    }

    /// What the origin holds until a write-back.
    fn at_origin(&self, scenario: &str) -> Vec<u8> {
        let file = self.file(scenario);
        let mut b = vec![0u8; self.size as usize];
        for &(at, len) in self.data {
            b[at as usize..(at + len) as usize].copy_from_slice(&pattern(&file, at, len));
        }
        b
    }

    /// What the caching proxy serves, and the origin holds after a
    /// write-back.
    fn served(&self, scenario: &str) -> Vec<u8> {
        let file = self.file(scenario);
        let mut b = self.at_origin(scenario);
        for (i, &(at, len, _)) in self.writes.iter().enumerate() {
            let end = (at + len) as usize;
            if b.len() < end {
                b.resize(end, 0);
            }
            b[at as usize..end].copy_from_slice(&pattern(&write_tag(&file, i), at, len));
        }
        b
    }
}

/// The arguments of each scenario's caching proxy, old and new alike (the
/// geometry must match the banks'): a small block cache (8 MiB in 2 banks,
/// 8-way, 64 KiB blocks), write-back, the metadata layer and its file cache.
fn caching_args(upstream: String, cache_dir: &Path) -> ProxyArgs {
    ProxyArgs::new(upstream)
        .cache(cache_dir, "8M")
        .cache_banks(2)
        .cache_ways(8)
        .block_size("64K")
        .write_policy(WritePolicy::WriteBack)
        .no_writeback_on_exit()
        .meta()
        .file_cache_size("64M")
}

/// A filesystem image loop-mounted at a directory; unmounted when dropped.
#[derive(Debug)]
struct LoopMount {
    dir: Option<PathBuf>,
}

impl LoopMount {
    fn mount(image: &Path, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut cmd = Command::new("mount");
        cmd.args(["-o", "loop"]).arg(image).arg(dir);
        process::run_ok(&mut cmd, TOOL_TIMEOUT)
            .context("loop-mounting the origin's ext4 image (the tests run as root)")?;
        Ok(Self {
            dir: Some(dir.to_path_buf()),
        })
    }

    /// Unmounts now, failing if it cannot (so the image is complete).
    fn unmount(mut self) -> Result<()> {
        if let Some(dir) = self.dir.take() {
            process::run_ok(Command::new("umount").arg(&dir), TOOL_TIMEOUT)?;
        }
        Ok(())
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take()
            && !Command::new("umount")
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&dir).status();
        }
    }
}

/// Checks what the origin (the mounted export) holds against `want`.
fn check_origin(
    export: &Path,
    scenario: &str,
    when: &str,
    want: impl Fn(&Spec) -> Vec<u8>,
) -> Result<()> {
    for spec in specs() {
        let file = spec.file(scenario);
        let got = std::fs::read(export.join(&file)).with_context(|| format!("reading {file}"))?;
        compare_bytes(&want(&spec), &got)
            .with_context(|| format!("{file} at the origin {when}"))?;
    }
    Ok(())
}

/// Fails if the proxy logged a warning or an error (metadata ignored, data
/// set aside, a bank lost...).
fn check_quiet(p: &Proxy, when: &str) -> Result<()> {
    let out = p.output();
    let loud: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    ensure!(
        loud.is_empty(),
        "the proxy complained {when}:\n{}",
        loud.join("\n")
    );
    Ok(())
}

/// The number at a dotted `path` (`"cache.dirty_bytes"`) of a stats
/// snapshot, 0 when absent. Untyped on purpose: the snapshots here are the
/// JSON of two versions of the proxy (the old one's recorded in the
/// fixture), and [`counters`] checks that each key is there.
fn n(v: &serde_json::Value, path: &str) -> u64 {
    path.split('.').fold(v, |v, k| &v[k]).as_u64().unwrap_or(0)
}

/// The counters that say something was lost or refused: all must be 0.
const LOSS: [&str; 9] = [
    "cache.banks_lost",
    "cache.dirty_sub_blocks_lost",
    "cache.corrupt_clean_dropped",
    "cache.store_errors",
    "meta.meta_rejected",
    "meta.meta_untrusted",
    "file_cache.files_failed",
    "file_cache.write_back_conflicts",
    "file_cache.evicted",
];

/// The other counters the checks read.
const COUNTED: [&str; 9] = [
    "cache.dirty_bytes",
    "cache.cached_bytes",
    "cache.frames_in_use",
    "cache.fetched_bytes",
    "file_cache.cached_bytes",
    "file_cache.dirty_files",
    "file_cache.written_back_files",
    "file_cache.chunks_fetched",
    "meta.copy_reads",
];

/// `gvfsctl stats --json` of `p`, which must have every counter the checks
/// read (one renamed would otherwise read as 0 and pass).
fn counters(p: &Proxy) -> Result<serde_json::Value> {
    let s = p.stats_json()?;
    for k in LOSS.iter().chain(&COUNTED) {
        let v = k.split('.').fold(&s, |v, k| &v[k]);
        ensure!(v.is_u64(), "gvfsctl stats --json has no counter {k}: {s}");
    }
    Ok(s)
}

fn check_no_loss(p: &Proxy, s: &serde_json::Value, when: &str) -> Result<()> {
    for k in LOSS {
        ensure!(
            n(s, k) == 0,
            "{k} is {} {when}: {s}\nproxy output:\n{}",
            n(s, k),
            p.output()
        );
    }
    Ok(())
}

/// Which boot the `boot-id` of a cache directory names: an unclean
/// shutdown in this boot was the proxy's crash alone (what it wrote and
/// did not sync is in the page cache), in another one the system's (the
/// disk may have kept any part of it).
#[derive(Debug, Clone, Copy)]
enum Boot {
    /// As the fixture recorded it (another boot, unless it was made in
    /// this one); for a cache shut down cleanly, where it does not matter.
    AsRecorded,
    /// This boot.
    This,
    /// Another boot.
    Other,
}

#[test]
fn a_cache_of_an_old_proxy_killed_alone_opens_serves_and_writes_back() -> Result<()> {
    open_old_cache("killed", Boot::This)
}

#[test]
fn a_cache_of_an_old_proxy_killed_with_its_system_opens_serves_and_writes_back() -> Result<()> {
    open_old_cache("killed", Boot::Other)
}

#[test]
fn a_cache_of_an_old_proxy_stopped_cleanly_opens_serves_and_writes_back() -> Result<()> {
    open_old_cache("stopped", Boot::AsRecorded)
}

/// Unpacks the fixture, mounts its origin, opens `scenario`'s cache (its
/// `boot-id` set as `boot` says) with this build's proxies, and checks it.
fn open_old_cache(scenario: &str, boot: Boot) -> Result<()> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE);
    let work = tempfile::tempdir()?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf")
        .arg(fixture.join("fixture.tar.gz"))
        .arg("-C")
        .arg(work.path());
    process::run_ok(&mut tar, TOOL_TIMEOUT).context("unpacking the fixture")?;
    let cache_dir = work.path().join(format!("cache-{scenario}"));
    let boot_id = match boot {
        Boot::AsRecorded => None,
        Boot::This => Some(
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .context("reading this boot's id")?,
        ),
        Boot::Other => Some("00000000-0000-4000-8000-000000000000".to_owned()),
    };
    if let Some(id) = boot_id {
        std::fs::write(cache_dir.join("boot-id"), id.trim())?;
    }
    let _mount = LoopMount::mount(&work.path().join("origin.img"), &work.path().join("origin"))?;
    let export = work.path().join("origin/export");
    check_origin(&export, scenario, "as the old proxy left it", |s| {
        s.at_origin(scenario)
    })?;

    // Below the caching proxy, as when the fixture was made: a proxy that
    // answers the extension program (compress-and-copy) over dir:.
    let server = Proxy::spawn(ProxyArgs::dir(&export))?;
    let p = Proxy::spawn(caching_args(server.upstream_url(), &cache_dir))
        .context("opening the cache")?;
    let old: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture.join(format!("stats-{scenario}.json")))
            .context("the old proxy's stats")?,
    )?;
    check_opened(&p, &old, &cache_dir).context("the cache as opened")?;
    check_reads(&p, scenario).context("reads through the cache")?;
    p.write_back().context("write-back")?;
    let s = counters(&p)?;
    check_no_loss(&p, &s, "after the write-back")?;
    ensure!(
        n(&s, "cache.dirty_bytes") == 0
            && n(&s, "file_cache.dirty_files") == 0
            && n(&s, "file_cache.written_back_files") == 1,
        "the write-back left dirty data: {s}"
    );
    check_quiet(&p, "at any time")?;
    check_origin(&export, scenario, "after the write-back", |s| {
        s.served(scenario)
    })
}

/// Right after the open, before any call: nothing lost, and as much dirty
/// and cached data as the old proxy had just before it stopped.
fn check_opened(p: &Proxy, old: &serde_json::Value, cache_dir: &Path) -> Result<()> {
    let s = counters(p)?;
    check_no_loss(p, &s, "at the open")?;
    check_quiet(p, "at the open")?;
    for k in [
        "cache.dirty_bytes",
        "cache.cached_bytes",
        "cache.frames_in_use",
        "file_cache.cached_bytes",
        "file_cache.dirty_files",
    ] {
        ensure!(
            n(&s, k) == n(old, k) && n(old, k) > 0,
            "{k}: {} now, {} when the old proxy stopped: {s}",
            n(&s, k),
            n(old, k)
        );
    }
    let quarantine = cache_dir.join("quarantine");
    ensure!(
        !quarantine.exists() || std::fs::read_dir(&quarantine)?.next().is_none(),
        "the cache set data aside in {}",
        quarantine.display()
    );
    Ok(())
}

/// Every file reads as the old proxy's clients left it; the blocks it
/// cached and the files it held whole are served without going upstream.
fn check_reads(p: &Proxy, scenario: &str) -> Result<()> {
    for spec in specs() {
        let file = spec.file(scenario);
        let before = counters(p)?;
        let got = nfs_cat(&p.url(&file))?;
        compare_bytes(&spec.served(scenario), &got).with_context(|| format!("{file} as served"))?;
        if spec.kind == Kind::Blocks || spec.kind == Kind::New {
            let s = counters(p)?;
            ensure!(
                n(&s, "cache.fetched_bytes") == n(&before, "cache.fetched_bytes"),
                "{file}: blocks the old proxy cached were fetched again: {s}"
            );
        }
    }
    let s = counters(p)?;
    check_no_loss(p, &s, "after the reads")?;
    ensure!(
        n(&s, "file_cache.chunks_fetched") == 0 && n(&s, "meta.copy_reads") > 0,
        "the files held whole were not served from the file cache: {s}"
    );
    Ok(())
}

/// Writes the fixture with the old binaries: run by
/// `scripts/make-compat-fixture.sh`, which sets `GVFS_COMPAT_OLD_BINS` (the
/// directory of the old `gvfs-proxy` and `gvfsctl`), `GVFS_COMPAT_REV` (the
/// commit they were built from) and `GVFS_COMPAT_OUT` (where to write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; run by scripts/make-compat-fixture.sh"]
async fn make_fixture() -> Result<()> {
    let var = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
    let bins = PathBuf::from(var("GVFS_COMPAT_OLD_BINS")?);
    let rev = var("GVFS_COMPAT_REV")?;
    let out = PathBuf::from(var("GVFS_COMPAT_OUT")?);
    let old_proxy = bins.join("gvfs-proxy");
    let old_ctl = |args: &[&str]| -> Result<String> {
        let mut cmd = Command::new(bins.join("gvfsctl"));
        cmd.args(args);
        Ok(process::run_ok(&mut cmd, TOOL_TIMEOUT)?.stdout_text())
    };
    let stats = |p: &Proxy| -> Result<serde_json::Value> {
        let control = p.control_path().display().to_string();
        let text = old_ctl(&["--control", &control, "stats", "--json"])?;
        serde_json::from_str(&text).context("parsing the old gvfsctl's stats")
    };

    let work = tempfile::tempdir()?;
    let image = work.path().join("origin.img");
    std::fs::File::create(&image)?.set_len(16 * MIB)?;
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-q", "-F", "-I", "256", "-O", "^has_journal"])
        .arg(&image);
    process::run_ok(&mut mkfs, TOOL_TIMEOUT)?;
    let mount = LoopMount::mount(&image, &work.path().join("origin"))?;
    let export = work.path().join("origin/export");
    std::fs::create_dir(&export)?;
    for (scenario, _) in SCENARIOS {
        for spec in specs() {
            let path = export.join(spec.file(scenario));
            if spec.kind == Kind::New {
                continue;
            }
            let bytes = spec.at_origin(scenario);
            let chunks: Vec<(u64, &[u8])> = spec
                .data
                .iter()
                .map(|&(at, len)| (at, &bytes[at as usize..(at + len) as usize]))
                .collect();
            write_sparse_chunks(&path, spec.size, &chunks)?;
            let path_s = path.display().to_string();
            match spec.kind {
                Kind::Held | Kind::Kept => {
                    old_ctl(&["meta", "gen", &path_s, "--compress"])?;
                }
                Kind::Zeros => {
                    old_ctl(&["meta", "gen", &path_s])?;
                }
                _ => {}
            }
        }
    }

    let mut server = Proxy::spawn(ProxyArgs::dir(&export).binary(&old_proxy))?;
    for (scenario, stop) in SCENARIOS {
        let cache_dir = work.path().join(format!("cache-{scenario}"));
        let args = caching_args(server.upstream_url(), &cache_dir).binary(&old_proxy);
        let mut p = Proxy::spawn(args)?;
        // Reads first: clean blocks, and the files held whole.
        for spec in specs() {
            if matches!(spec.kind, Kind::Cold | Kind::New) {
                continue;
            }
            let file = spec.file(scenario);
            compare_bytes(&spec.at_origin(scenario), &nfs_cat(&p.url(&file))?)
                .with_context(|| format!("reading {file} through the old proxy"))?;
        }
        let mut done = false;
        for _ in 0..300 {
            if n(&stats(&p)?, "file_cache.files_complete") >= 2 {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ensure!(
            done,
            "the old proxy did not fetch the files whole: {}",
            stats(&p)?
        );

        // Then the writes, each file's committed.
        let nfs = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
        for spec in specs() {
            let file = spec.file(scenario);
            if spec.kind == Kind::New {
                let local = work.path().join(&file);
                std::fs::write(&local, spec.served(scenario))?;
                nfs_cp(&local.display().to_string(), &p.url(&file))?;
            }
            let fh = nfs.resolve(&file).await?.context("no such file")?;
            if spec.kind == Kind::New {
                nfs.commit(&fh).await?;
                continue;
            }
            for (i, &(at, len, sync)) in spec.writes.iter().enumerate() {
                let how = if sync {
                    stable_how::FILE_SYNC
                } else {
                    stable_how::UNSTABLE
                };
                nfs.write(&fh, at, &pattern(&write_tag(&file, i), at, len), how)
                    .await?;
            }
            if !spec.writes.is_empty() {
                nfs.commit(&fh).await?;
            }
        }
        let s = stats(&p)?;
        ensure!(
            n(&s, "cache.dirty_bytes") > 0
                && n(&s, "cache.evictions") == 0
                && n(&s, "file_cache.dirty_files") == 1
                && n(&s, "file_cache.files_complete") == 2
                && n(&s, "meta.meta_rejected") == 0,
            "the old proxy does not hold what it should: {s}"
        );
        std::fs::create_dir_all(&out)?;
        std::fs::write(
            out.join(format!("stats-{scenario}.json")),
            serde_json::to_string_pretty(&s)? + "\n",
        )?;
        match stop {
            Stop::Kill => p.kill(),
            Stop::Term => {
                p.terminate()?;
            }
        }
    }
    server.terminate()?;
    for (scenario, _) in SCENARIOS {
        check_origin(&export, scenario, "after the old proxies stopped", |s| {
            s.at_origin(scenario)
        })?;
    }
    let mut listing = String::new();
    for (scenario, _) in SCENARIOS {
        for spec in specs() {
            listing += &format!(
                "  {:<19} {:<7} origin {} ({} bytes)\n  {:<19} {:<7} served {} ({} bytes)\n",
                spec.file(scenario),
                format!("{:?}", spec.kind),
                sha256(&spec.at_origin(scenario))?,
                spec.at_origin(scenario).len(),
                "",
                "",
                sha256(&spec.served(scenario))?,
                spec.served(scenario).len(),
            );
        }
    }
    mount.unmount()?;
    let proxy_line = caching_args(String::new(), Path::new("CACHE/cache-SCENARIO"))
        .extra
        .join(" ");

    let tar = out.join("fixture.tar");
    let _ = std::fs::remove_file(out.join("fixture.tar.gz"));
    let mut cmd = Command::new("tar");
    cmd.args(["--sparse", "--numeric-owner", "--sort=name", "-cf"])
        .arg(&tar)
        .arg("-C")
        .arg(work.path())
        .args(["origin.img", "cache-killed", "cache-stopped"]);
    process::run_ok(&mut cmd, TOOL_TIMEOUT)?;
    process::run_ok(Command::new("gzip").arg("-9n").arg(&tar), TOOL_TIMEOUT)?;
    let mut list = Command::new("tar");
    list.arg("-tvzf").arg(out.join("fixture.tar.gz"));
    let contents = process::run_ok(&mut list, TOOL_TIMEOUT)?.stdout_text();
    std::fs::write(
        out.join("README.txt"),
        readme(&rev, &proxy_line, &listing, &contents),
    )?;
    Ok(())
}

fn sha256(bytes: &[u8]) -> Result<String> {
    let f = tempfile::NamedTempFile::new()?;
    std::fs::write(f.path(), bytes)?;
    let out = process::run_ok(Command::new("sha256sum").arg(f.path()), TOOL_TIMEOUT)?;
    match out.stdout_text().split_whitespace().next() {
        Some(sum) => Ok(sum.to_owned()),
        None => bail!("sha256sum printed nothing"),
    }
}

fn readme(rev: &str, proxy_line: &str, listing: &str, contents: &str) -> String {
    let range = |at: u64, len: u64| format!("[{at}, +{len})");
    let mut writes = String::new();
    for spec in specs() {
        let data: Vec<String> = spec.data.iter().map(|&(at, len)| range(at, len)).collect();
        writes += &format!(
            "  {:<10} {:?}: {} bytes at the origin, text at {}\n",
            spec.name,
            spec.kind,
            spec.size,
            if data.is_empty() {
                "none".to_owned()
            } else {
                data.join(" ")
            },
        );
        for &(at, len, sync) in spec.writes {
            writes += &format!(
                "             write {} {}\n",
                range(at, len),
                match (spec.kind, sync) {
                    (Kind::New, _) => "by nfs-cp",
                    (_, true) => "FILE_SYNC",
                    (_, false) => "UNSTABLE",
                }
            );
        }
    }
    format!(
        "\
On-disk state written by gvfs-proxy and gvfsctl built from commit {rev},
for tests/compat.rs (which this build must read). Made by
scripts/make-compat-fixture.sh (the test's make_fixture); run it again to
remake it.

fixture.tar.gz (tar --sparse, gzip):
  origin.img      ext4 image of the dir: origin (its directory /export is
                  the export), as the old proxies left it: none of the
                  writes below reached it
  cache-killed/   cache directory of a caching proxy killed with SIGKILL
                  after its last COMMIT
  cache-stopped/  cache directory of a caching proxy stopped with SIGTERM
                  under --no-writeback-on-exit
    bank-000.gvfs bank-001.gvfs  block cache (format version 2): clean
                  blocks, dirty blocks, partial sub-blocks
    files/HEX     a file held whole by compress-and-copy (the image.raw
                  and kept.raw of that scenario; HEX is the file handle)
    meta.sled/    the metadata index (file cache records, zero maps)
    writers, boot-id, lock
stats-killed.json, stats-stopped.json: `gvfsctl stats --json` of each old
caching proxy just before it stopped.

Setup: an old gvfs-proxy over dir:ORIGIN/export (no cache; it answers the
extension program), and one caching proxy per scenario over it, with:
  {proxy_line}
Each caching proxy read the Blocks, Held, Kept and Zeros files whole
(nfs-cat), waited for the file cache to hold the Held and Kept ones, then
wrote (the project's NFS client; UNSTABLE unless FILE_SYNC, then a COMMIT
of each file written; the New file created by nfs-cp, then a COMMIT). Each
scenario's files, SCENARIO-NAME in the export, as [offset, +length):
{writes}
Every byte is text: 32-byte lines \"TAG OFFSET\\n\", TAG the file's name at
the origin and the write's FILE#I (I from 0), padded to 20 characters,
OFFSET the line's offset in the file, 10 hex digits; the rest are zeros
(holes). tests/compat.rs (specs, pattern) computes the same bytes.

Files in the export, sha256 of what the origin holds (origin) and of what
the caching proxy serves and the origin holds after a write-back (served):
{listing}
Archive contents:
{contents}"
    )
}
