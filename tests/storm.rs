//! A lazy storm without QEMU: a site (a `dir:` origin, a PKI, a WAN of
//! 10 ms and 200 Mbit/s, a LAN proxy, nodes with FUSE mounts at
//! `--mount-readahead 0`) and a synthetic trace of a guest's page faults
//! over a 48 MiB sparse image whose working-set profile the image server
//! holds. Four replays (`gvfs_testbed::clone::replay`, as the clone bench's
//! storm runs them, here on threads) map the image on their node's mount
//! at once and check every byte they read. Then a neighbour: one node
//! copies a 64 MiB file through the same LAN proxy while another replays.
//!
//! Asserts are functional: what each replay read is the origin's, the
//! profile and demand bytes that crossed the WAN before the last replay
//! ended are the profile's pieces and the demand's (not whole chunks), the
//! copy and the replay both finish. The times are the clone bench's (`lazy storm N`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::clone::replay::{Mapped, replay};
use gvfs_testbed::clone::trace::{Entry, Mark, Trace};
use gvfs_testbed::data::{compare_bytes, compare_files, write_sparse_file};
use gvfs_testbed::fuse::{self, MountPoint};
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::require_fuse;
use gvfs_testbed::{Origin, Proxy, ProxyArgs, Site, Tier};
use gvfs_wanlink::LinkConfig;

const MIB: u64 = 1 << 20;
/// The file cache's chunk.
const CHUNK: u64 = MIB;
/// Its piece, the unit of a profile and of a demand fetch with one.
const PIECE: u64 = 8 << 10;
/// The image: 48 chunks, some of them holes.
const IMAGE_SIZE: u64 = 48 * MIB;
const ZERO_CHUNKS: [u64; 6] = [3, 19, 20, 21, 35, 46];
/// The chunks whose first piece the guest touches first, in order: its
/// working-set profile.
const PROFILED: [u64; 12] = [30, 7, 41, 12, 1, 44, 25, 9, 16, 38, 5, 28];
/// Chunks it touches later that the profile does not name (demand).
const DEMAND: [u64; 4] = [2, 11, 27, 40];
/// The bulk file the neighbour copies.
const BULK_SIZE: u64 = 64 * MIB;
/// Nodes replaying at once.
const STORM: usize = 4;
/// How long a learning may take to end and be sent: 3 s of quiet, a
/// 250 ms tick, and room for a slow machine.
const LEARN_WAIT: Duration = Duration::from_secs(30);

/// A sparse file of `size` bytes (data for `seed` in every chunk but
/// `zeros`) with its metadata (`gvfsctl meta gen --compress`).
fn image(path: &Path, size: u64, zeros: &[u64], seed: u64) -> Result<()> {
    let extents: Vec<(u64, u64)> = (0..size.div_ceil(CHUNK))
        .filter(|c| !zeros.contains(c))
        .map(|c| (c * CHUNK, CHUNK.min(size - c * CHUNK)))
        .collect();
    write_sparse_file(path, size, seed, &extents)?;
    gvfsctl(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    Ok(())
}

/// The guest's trace: the profiled pieces (two pages each), then the
/// demand ones (a page each), a millisecond of thought between reads;
/// running after the profiled ones, answered at the end.
fn synthetic_trace() -> Trace {
    let think = Duration::from_millis(1);
    let mut entries: Vec<Entry> = PROFILED
        .iter()
        .map(|c| Entry {
            offset: c * CHUNK,
            len: PIECE as u32,
            think,
        })
        .collect();
    entries.extend(DEMAND.iter().map(|c| Entry {
        offset: c * CHUNK + 64 * 1024,
        len: 4096,
        think,
    }));
    Trace {
        running: Mark {
            entries: PROFILED.len(),
            tail: Duration::from_millis(2),
        },
        answered: Mark {
            entries: entries.len(),
            tail: Duration::from_millis(2),
        },
        entries,
        before_resume: Duration::ZERO,
    }
}

/// Replays `trace` on `mem` (a node's mount), checking every byte it
/// reads against `origin`.
fn replay_checked(trace: &Trace, mem: &Path, origin: &Path) -> Result<()> {
    let map = Mapped::open(mem)?;
    let origin = File::open(origin)?;
    replay(
        trace,
        &map,
        |e, got| {
            let mut want = vec![0u8; got.len()];
            origin.read_exact_at(&mut want, e.offset)?;
            compare_bytes(&want, got).with_context(|| format!("the read at {}", e.offset))
        },
        |_, _| {},
    )?;
    Ok(())
}

/// Bytes through the site's WAN link, both ways.
fn wan_bytes(site: &Site) -> Result<u64> {
    let s = site.wan()?.stats();
    Ok(s.upstream_bytes + s.downstream_bytes)
}

/// A node outside the site's LAN, straight across the WAN to the image
/// server with a certificate of its own, reads the profiled pieces and
/// goes quiet: its profile is sent, and the image server keeps it.
fn teach(site: &Site) -> Result<()> {
    let pki = site.pki().context("the site has a PKI")?;
    pki.issue("teacher")?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let url = format!(
        "gvfs://{}/export?name={}",
        site.wan()?.local_addr(),
        site.image_server().name()
    );
    let teacher: Proxy = fuse::mounted(
        pki.args("teacher", ProxyArgs::new(url))
            .cache(cache.path(), "128M")
            .mount_readahead("0"),
        &mnt,
    )?;
    let f = File::open(mnt.path().join("golden.mem"))?;
    let mut page = vec![0u8; 4096];
    for c in PROFILED {
        f.read_exact_at(&mut page, c * CHUNK + 512)?;
    }
    drop(f);
    teacher.wait_for("file_cache.profiles_sent", LEARN_WAIT, |s| {
        s.file_cache.counts.profiles_sent >= 1
    })?;
    let up = site.image_server().stats()?;
    ensure!(
        up.ext.profiles_stored >= 1,
        "the image server did not keep the profile: {up}"
    );
    Ok(())
}

#[test]
fn four_nodes_replay_a_learned_clone_at_once_through_one_lan_proxy() -> Result<()> {
    require_fuse!();
    let node = Tier::new()
        .cache("128M")
        .mount()
        .args(|a| a.mount_readahead("0"));
    let site = Site::builder(Origin::Dir)
        .pki()
        .wan(LinkConfig::from_rtt(
            Duration::from_millis(10),
            Some(200_000_000),
        ))
        .lan(Tier::new().cache("512M"))
        .nodes(STORM + 2, node)
        .start_with(|dir| {
            image(&dir.join("golden.mem"), IMAGE_SIZE, &ZERO_CHUNKS, 37)?;
            image(&dir.join("bulk.raw"), BULK_SIZE, &[], 38)
        })?;
    let origin = site.origin_dir().join("golden.mem");
    teach(&site)?;

    // The storm: four nodes replay the trace at once.
    let trace = synthetic_trace();
    let before = wan_bytes(&site)?;
    std::thread::scope(|s| -> Result<()> {
        let replays: Vec<_> = (0..STORM)
            .map(|i| {
                let (trace, origin) = (&trace, &origin);
                let mem = site.node(i).and_then(|n| n.path("golden.mem"));
                s.spawn(move || replay_checked(trace, &mem?, origin))
            })
            .collect();
        for (i, r) in replays.into_iter().enumerate() {
            r.join()
                .map_err(|_| anyhow::anyhow!("replay {i} panicked"))?
                .with_context(|| format!("replay {i}"))?;
        }
        Ok(())
    })?;
    let crossed = wan_bytes(&site)? - before;
    let profile = PROFILED.len() as u64 * PIECE;
    let demand = DEMAND.len() as u64 * PIECE;
    let lan = site.lan()?.stats()?;
    let up = site.image_server().stats()?;
    ensure!(
        up.ext.profiles_served >= 1,
        "the LAN proxy did not get the profile: {up}"
    );
    // The working set crosses the WAN once for the four nodes: what the LAN
    // proxy fetched as profile or demand before the last replay ended is
    // the profile's pieces and the demand's (30% for framing), not their
    // whole 1 MiB chunks. (At d204fe1, before FETCH_CLASS, 20.3 MB crossed
    // for 128 KiB: the nodes' profile runs reached the LAN as background
    // and were widened to whole chunks.) The LAN's own background stream
    // goes on meanwhile, below them and within its cap (the gate).
    let fc = &lan.file_cache.counts;
    let working = fc.profile_wire_bytes + fc.demand_wire_bytes;
    ensure!(
        working * 10 <= (profile + demand) * 13,
        "{working} B of profile and demand crossed the WAN for {profile} B of profile and \
         {demand} B of demand ({crossed} B in all); the LAN proxy: {lan}"
    );

    // A neighbour: node B copies the 64 MiB bulk file while node A replays;
    // both finish, every byte right.
    let (a, b) = (site.node(STORM)?, site.node(STORM + 1)?);
    let bulk = site.origin_dir().join("bulk.raw");
    std::thread::scope(|s| -> Result<()> {
        let copy = s.spawn(|| compare_files(&bulk, &b.path("bulk.raw")?));
        replay_checked(&trace, &a.path("golden.mem")?, &origin).context("node A's replay")?;
        copy.join()
            .map_err(|_| anyhow::anyhow!("the copy panicked"))?
            .context("node B's copy")
    })?;
    Ok(())
}
