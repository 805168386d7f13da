//! Cloning a VM as a command (`gvfsctl vm`): a running QEMU guest is saved
//! as a golden image with `gvfsctl vm save`, listed by `gvfsctl vm ls`,
//! and cloned by `gvfsctl vm clone` through a node proxy's FUSE mount,
//! lazily and copy-first: each clone ticks on with the digests its disk
//! has and answers a request with the digest of the files it read at boot
//! (from its memory). A lazy clone of an image that is not on a gvfs
//! mount is refused, saying what to do.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; QEMU comes with the test packages (scripts/test.sh).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::clone::guest::{
    Booted, GoldenSize, GuestKit, Qmp, VmConfig, build_golden, create_overlay, kit_dir,
    serial_ticks,
};
use gvfs_testbed::fuse::{MountPoint, mounted};
use gvfs_testbed::proxy::gvfsctl_binary;
use gvfs_testbed::require_fuse;
use gvfs_testbed::{ProxyArgs, process};

/// How long a `gvfsctl vm` command may take.
const COMMAND: Duration = Duration::from_secs(300);

/// How long a clone may take to tick or answer.
const GUEST: Duration = Duration::from_secs(120);

/// The guest: small, as the quick clone run's.
const SIZE: GoldenSize = GoldenSize {
    ram_mib: 128,
    working_set_mib: 8,
    system_mib: 8,
    system_disk_mib: 16,
    disk_files_mib: 32,
};

fn vm(args: &[&str]) -> Result<process::Output> {
    let mut cmd = std::process::Command::new(gvfsctl_binary()?);
    cmd.arg("vm").args(args);
    process::run(&mut cmd, COMMAND)
}

#[test]
fn a_saved_vm_is_cloned_lazily_and_copy_first_through_a_node_mount() -> Result<()> {
    require_fuse!();
    let kit = GuestKit::prepare(&kit_dir()).context("preparing the guest kit")?;
    let origin = tempfile::tempdir()?;
    // A disk with the guest's files (and the digests its ticks and
    // answers must have), from the clone harness.
    let base = origin.path().join("base");
    let golden = build_golden(&kit, &base, 38, SIZE, false)?;
    // The golden VM, as a user runs one: RAM in a file, shared.
    let boot = tempfile::tempdir()?;
    let disk = boot.path().join("disk.qcow2");
    create_overlay(&base.join("disk.qcow2").display().to_string(), &disk)?;
    let mut running = Booted::start(
        &kit,
        boot.path(),
        SIZE.ram_mib,
        &golden.cmdline,
        &boot.path().join("ram"),
        &disk,
    )?;
    let image = origin.path().join("vm1");
    let qmp = running.qmp_path().display().to_string();
    let saved = vm(&["save", "--qmp", &qmp, &image.display().to_string()])?;
    ensure!(
        saved.status.success(),
        "gvfsctl vm save: {}",
        saved.stderr_text()
    );
    running.wait_exit(Duration::from_secs(30))?;
    for name in [
        "mem",
        "state",
        "machine.json",
        "disk.qcow2",
        ".mem.gvfsmeta",
    ] {
        ensure!(image.join(name).is_file(), "no {name} in the golden image");
    }
    let again = vm(&["save", "--qmp", &qmp, &image.display().to_string()])?;
    ensure!(!again.status.success(), "a second save into the same image");

    let listed = vm(&["ls", &origin.path().display().to_string()])?;
    ensure!(
        listed.status.success() && listed.stdout_text().contains("vm1"),
        "gvfsctl vm ls: {}{}",
        listed.stdout_text(),
        listed.stderr_text()
    );

    let unmounted = vm(&["clone", &image.display().to_string()])?;
    let why = unmounted.stderr_text();
    ensure!(
        !unmounted.status.success()
            && why.contains("not on a gvfs mount")
            && why.contains("--copy"),
        "a lazy clone off a gvfs mount: {why}"
    );

    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let node = mounted(
        ProxyArgs::dir(origin.path())
            .cache_dir(cache.path())
            .mount_readahead("0"),
        &mnt,
    )?;
    let through = mnt.path().join("vm1").display().to_string();
    for copy in [false, true] {
        let work = tempfile::tempdir()?;
        let w = work.path().display().to_string();
        let mut args = vec!["clone", &through, "--work", &w, "--detach"];
        if copy {
            args.push("--copy");
        }
        let out = vm(&args)?;
        let kind = if copy { "copy-first" } else { "lazy" };
        ensure!(
            out.status.success() && out.stdout_text().contains(&format!("running ({kind})")),
            "gvfsctl vm clone ({kind}): {}{}",
            out.stdout_text(),
            out.stderr_text()
        );
        let checked = check_clone(work.path(), &golden);
        // The clone ends whatever the checks found.
        let quit = Qmp::handshake(UnixStream::connect(work.path().join("qmp.sock"))?)
            .and_then(|mut q| q.execute("quit", None));
        checked.with_context(|| format!("the {kind} clone"))?;
        quit.with_context(|| format!("quitting the {kind} clone"))?;
    }
    let read = node.stats()?.mount()?.counts.read_bytes;
    ensure!(read > 0, "the clones read nothing through the mount");
    Ok(())
}

/// The clone whose files are in `work` ticks on with the right digests
/// and answers a request with the digest of its boot files.
fn check_clone(work: &Path, golden: &VmConfig) -> Result<()> {
    let serial = work.join("serial.log");
    let deadline = Instant::now() + GUEST;
    let mut ticks = Vec::new();
    while ticks.len() < 3 {
        ensure!(
            Instant::now() < deadline,
            "fewer than 3 ticks within {GUEST:?}: {:?}",
            std::fs::read_to_string(&serial).unwrap_or_default()
        );
        ticks = serial_ticks(&serial, 0).0;
        std::thread::sleep(Duration::from_millis(50));
    }
    for (n, sum) in &ticks {
        let want = &golden.run_sums[(*n % golden.run_sums.len() as u64) as usize];
        ensure!(sum == want, "tick {n} read {sum}, the disk has {want}");
    }
    let mut port = UnixStream::connect(work.join("req.sock"))?;
    port.write_all(b"q1\n")?;
    loop {
        let text = std::fs::read_to_string(&serial).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with("answer q1 ")) {
            let sum = line.trim_end_matches('\r').rsplit(' ').next().unwrap_or("");
            ensure!(
                sum == golden.boot_sum,
                "answered {sum}, the boot files have {}",
                golden.boot_sum
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("no answer within {GUEST:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
