//! One lazy clone of a golden VM through a node proxy, timed, with where
//! the time went:
//!
//! ```text
//! sudo cargo run --release --example clone     # about a minute, most of it building the image
//! ```
//!
//! It is the clone benchmark's lazy WAN-S1 scenario (`gvfs_testbed::clone`,
//! `cargo bench --bench clone`) cut down to one small image and one
//! clone: QEMU builds a golden guest (Debian's kernel, a busybox
//! initramfs, 128 MiB of RAM kept in a raw file, a qcow2 disk), saved with
//! its metadata (`gvfsctl meta gen --compress`) on nfs-ganesha; an
//! image-server proxy in front of it takes TLS peers across an emulated
//! WAN (`gvfs-wanlink`'s relay: 40 ms RTT, 50 Mbit/s); a node proxy with a
//! cache and a FUSE mount is the compute node. The clone copies the
//! guest's config and device state, makes a qcow2 overlay on the golden
//! disk (`nfs://` through the node proxy), and starts QEMU with its RAM
//! mapped from the golden memory image on the node's mount, so the guest
//! resumes at once and the node fetches the pages it touches first.
//!
//! Needs root (nfs-ganesha's portmapper and QEMU's `nfs://` use port 111),
//! QEMU, FUSE, nfs-ganesha, busybox-static and e2fsprogs (`scripts/test.sh`
//! installs them); without one of them it says what is missing and exits
//! 0. The first run fetches Debian's kernel package with `apt-get
//! download` (kept under `target/gvfs-guest`). Every address is on
//! 127.0.0.0/8.

mod common;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use gvfs_testbed::clone::{self, Scenario, Settings};

const MIB: f64 = (1 << 20) as f64;

fn main() -> ExitCode {
    let missing = missing();
    if !missing.is_empty() {
        println!("The clone example needs what this machine lacks; nothing was run:");
        for m in &missing {
            println!("  - {m}");
        }
        println!(
            "(scripts/test.sh installs the packages; `cargo run --example site` needs none of this)"
        );
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("clone: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the clone needs that is not here, each with how to get it.
fn missing() -> Vec<String> {
    let which = gvfs_testbed::fuse::which;
    let mut out = Vec::new();
    for (tool, package) in [
        (
            "qemu-system-x86_64",
            "QEMU: apt-get install qemu-system-x86",
        ),
        (
            "qemu-img",
            "QEMU's qemu-img with its nfs:// driver: apt-get install qemu-utils qemu-block-extra",
        ),
        (
            "ganesha.nfsd",
            "nfs-ganesha: apt-get install nfs-ganesha nfs-ganesha-vfs",
        ),
        ("mke2fs", "mke2fs: apt-get install e2fsprogs"),
    ] {
        if which(tool).is_none() {
            out.push(format!("{tool} ({package})"));
        }
    }
    if gvfs_testbed::debian_kernel::busybox().is_err() {
        out.push("a static busybox (apt-get install busybox-static)".to_owned());
    }
    if let Some(why) = gvfs_testbed::fuse::unavailable() {
        out.push(format!("FUSE: {why}"));
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        out.push(
            "root: nfs-ganesha's portmapper and the node proxy QEMU reaches listen on port 111"
                .to_owned(),
        );
    }
    out
}

fn run() -> Result<()> {
    common::build_binaries()?;
    let mut s = Settings::quick();
    s.images = 1;
    s.clones = 1;
    s.scenarios = vec![Scenario::LazyWanS1];
    // The benchmark's WAN.
    s.rtt = Duration::from_millis(40);
    s.mbit = 50;
    println!(
        "one lazy clone of a golden guest of {} MiB RAM through a node proxy, across an \
         emulated WAN of {} ms RTT and {} Mbit/s (building the golden image first)",
        s.size.ram_mib,
        s.rtt.as_millis(),
        s.mbit
    );
    let outcome = clone::run(&s)?;
    let r = outcome
        .records
        .first()
        .context("the run recorded no clone")?;
    let f = r.fetch.unwrap_or_default();
    println!("\n{} clone of golden image {}:", r.scenario, r.image);
    println!(
        "  {:6.2} s  clone: start to the guest verified running on from the golden one",
        r.total_secs
    );
    println!(
        "  {:6.2} s    copying its config and device state from the node's mount",
        r.copy_secs
    );
    println!(
        "  {:6.2} s    making the qcow2 overlay on the golden disk (nfs:// through the node)",
        r.overlay_secs
    );
    println!(
        "  {:6.2} s    QEMU: start, resume with RAM mapped from the mount, to the verified tick",
        r.resume_secs
    );
    if let Some(at) = r.responsive_secs {
        println!("  {at:6.2} s  the guest answered a request that reads its files from memory");
    }
    match r.whole_local_secs {
        Some(at) => println!(
            "  {at:6.2} s  the node held the whole memory image (fetched in the background)"
        ),
        None => println!("           the node did not hold the whole memory image in time"),
    }
    println!(
        "across the WAN: {:.1} MiB until the guest ran, {:.1} MiB in all",
        r.wan_running_bytes.unwrap_or(0) as f64 / MIB,
        r.wan_bytes as f64 / MIB
    );
    println!(
        "the node's file cache received {:.1} MiB (zstd): {:.1} MiB for reads that were \
         waiting (the guest's page faults), {:.1} MiB in the background",
        f.wire_bytes as f64 / MIB,
        f.demand_wire_bytes as f64 / MIB,
        f.background_wire_bytes as f64 / MIB
    );
    println!(
        "{} reads waited for their chunk, {:.1} ms each on average; the mount answered {:.1} MiB \
         of reads (the kernel's, for the guest's faults)",
        f.faults_waited,
        f.fault_wait_micros as f64 / 1e3 / f.faults_waited.max(1) as f64,
        f.mount_read_bytes as f64 / MIB
    );
    for (label, calls) in &outcome.wan_calls {
        let calls: Vec<String> = calls.iter().map(|(p, n)| format!("{p} {n}")).collect();
        println!("calls across the WAN ({label}): {}", calls.join(", "));
    }
    for note in &outcome.notes {
        println!("{note}");
    }
    println!("\nThe whole benchmark, every scenario and 8 images: cargo bench --bench clone");
    Ok(())
}
