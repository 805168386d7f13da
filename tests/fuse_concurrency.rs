//! Concurrent writers and readers on the FUSE mount (`gvfs-proxy --mount
//! DIR`), every byte checked while they run and after, through the mount
//! and at the origin, without and with a block cache.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::data::{MIB, compare_bytes, random_bytes, random_bytes_at};
use gvfs_testbed::fuse::{self, MountPoint, drop_caches, mounted};
use gvfs_testbed::require_fuse;
use gvfs_testbed::tree::{Model, check_tree};
use gvfs_testbed::{Proxy, ProxyArgs};

const WRITERS: usize = 4;
const READERS: usize = 4;
/// Each writer's own file, each reader's file, each writer's region of the
/// shared file.
const PART: usize = 2 * MIB;
/// Chunk of the writers' and readers' calls: not a multiple of a page.
const CHUNK: usize = 100_003;
const SHARED_OLD: u64 = 900;

/// The writers' content of the shared file's `[at, at + n)`: writer w
/// writes seed 200 + w over its region `[w * PART, (w + 1) * PART)`.
fn shared_new(at: u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut pos = at;
    let end = at + n as u64;
    while pos < end {
        let w = pos / PART as u64;
        let region_end = ((w + 1) * PART as u64).min(end);
        out.extend(random_bytes_at(200 + w, pos, (region_end - pos) as usize));
        pos = region_end;
    }
    out
}

/// Four writers (each its own file and its own region of a shared file)
/// and four readers (each a file of its own written before, and the
/// shared file while it is being written) at once; every byte checked
/// while running and after, through the mount and at the origin.
fn concurrency(front: &Proxy, mnt: &MountPoint, origin: &Path, write_back: bool) -> Result<()> {
    let root = Arc::new(mnt.path().to_path_buf());
    let shared_len = (WRITERS * PART) as u64;
    // Written before: the readers' files, and the shared file's old content.
    for r in 0..READERS {
        fs::write(
            root.join(format!("ro-{r}")),
            random_bytes(100 + r as u64, PART),
        )?;
    }
    fs::write(
        root.join("shared"),
        random_bytes(SHARED_OLD, shared_len as usize),
    )?;
    drop_caches();
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let root = root.clone();
        threads.push(std::thread::spawn(move || -> Result<()> {
            let seed = 200 + w as u64;
            let own = File::create(root.join(format!("own-{w}")))?;
            let shared = OpenOptions::new().write(true).open(root.join("shared"))?;
            let base = (w * PART) as u64;
            let mut off = 0;
            while off < PART {
                let n = CHUNK.min(PART - off);
                own.write_all_at(&random_bytes_at(seed, off as u64, n), off as u64)
                    .with_context(|| format!("writer {w}: own file at {off}"))?;
                let at = base + off as u64;
                shared
                    .write_all_at(&random_bytes_at(seed, at, n), at)
                    .with_context(|| format!("writer {w}: shared file at {at}"))?;
                off += n;
            }
            own.sync_all()?;
            shared.sync_all()?;
            Ok(())
        }));
    }
    for r in 0..READERS {
        let root = root.clone();
        threads.push(std::thread::spawn(move || -> Result<()> {
            let mine = File::open(root.join(format!("ro-{r}")))?;
            let shared = File::open(root.join("shared"))?;
            let mut buf = vec![0u8; CHUNK];
            for pass in 0..2 {
                let mut off = 0;
                while off < PART {
                    let n = CHUNK.min(PART - off);
                    mine.read_exact_at(&mut buf[..n], off as u64)?;
                    compare_bytes(&random_bytes_at(100 + r as u64, off as u64, n), &buf[..n])
                        .with_context(|| format!("reader {r} pass {pass}: own file at {off}"))?;
                    off += n;
                }
                // The shared file, while the writers write it: each byte is
                // the old content or the writer's new one.
                let mut at = (r * CHUNK) as u64 % shared_len;
                let mut done = 0u64;
                while done < shared_len {
                    let n = (CHUNK as u64).min(shared_len - at) as usize;
                    shared.read_exact_at(&mut buf[..n], at)?;
                    let old = random_bytes_at(SHARED_OLD, at, n);
                    let new = shared_new(at, n);
                    let writer = (at / PART as u64) as usize;
                    if let Some(i) = (0..n).find(|&i| buf[i] != old[i] && buf[i] != new[i]) {
                        bail!(
                            "reader {r} pass {pass}: shared file byte {} (writer {writer}'s \
                             region) is {:#04x}, neither the old {:#04x} nor the new {:#04x}",
                            at + i as u64,
                            buf[i],
                            old[i],
                            new[i]
                        );
                    }
                    done += n as u64;
                    at = (at + n as u64) % shared_len;
                }
            }
            Ok(())
        }));
    }
    let mut errors = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Err(_) => errors.push("a thread panicked".into()),
        }
    }
    ensure!(
        errors.is_empty(),
        "concurrent calls failed:\n{}\nproxy output:\n{}",
        errors.join("\n"),
        front.output()
    );
    let mut model = Model::default();
    let mode = 0o666 & !fuse::umask()?;
    for r in 0..READERS {
        model.file(&format!("ro-{r}"), random_bytes(100 + r as u64, PART), mode);
    }
    let mut shared = Vec::with_capacity(shared_len as usize);
    for w in 0..WRITERS {
        model.file(
            &format!("own-{w}"),
            random_bytes(200 + w as u64, PART),
            mode,
        );
        shared.extend(random_bytes_at(200 + w as u64, (w * PART) as u64, PART));
    }
    model.file("shared", shared, mode);
    drop_caches();
    check_tree(mnt.path(), &model, "through the mount")?;
    if write_back {
        front.write_back()?;
    }
    check_tree(origin, &model, "at the origin")
}

#[test]
fn concurrent_writers_and_readers_on_the_dir_origin() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    concurrency(&p, &mnt, origin.path(), false)
}

#[test]
fn concurrent_writers_and_readers_through_a_block_cache() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(
        ProxyArgs::dir(origin.path()).cache(cache.path(), "64M"),
        &mnt,
    )?;
    concurrency(&p, &mnt, origin.path(), true)
}
