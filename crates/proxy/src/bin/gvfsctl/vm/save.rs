//! `gvfsctl vm save`: a running QEMU, found by its QMP socket, becomes a
//! golden image directory.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use super::files::{copy_sparse, human, run_tool};
use super::machine::{self, DISK, MACHINE, MEM, STATE};
use gvfs_proxy::qmp::{Qmp, exec_uri};

/// How long the device state may take to save.
const SAVE_TIMEOUT: Duration = Duration::from_secs(300);

/// Saves the QEMU behind `qmp` into `dir`: its device state (stopped,
/// with `x-ignore-shared`), its RAM file, its disk (copied as qcow2, or
/// kept where it is), `machine.json`, and (with `meta`) the memory
/// image's metadata for compress-and-copy. QEMU quits after, or goes on
/// with `keep_running`.
pub(super) fn save(
    qmp_path: &Path,
    dir: &Path,
    copy_disk: bool,
    keep_running: bool,
    meta: bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut qmp = Qmp::connect(qmp_path)?;
    let pid = qmp.peer_pid()?;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("reading QEMU's command line (pid {pid})"))?;
    let argv: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let (program, args) = argv.split_first().context("QEMU's command line is empty")?;
    let qemu = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_or_else(|_| program.clone(), |p| p.display().to_string());
    let parsed = machine::parse(&qemu, args, copy_disk)?;
    ensure!(
        parsed.shared,
        "QEMU maps its RAM file {} private (share=off): its memory is not in the file. Start \
         the golden VM with share=on",
        parsed.mem_path.display()
    );
    if dir.join(MACHINE).exists() {
        bail!(
            "{} already holds a golden image ({MACHINE}); save into a new directory",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let running = qmp.execute("query-status", None)?["running"].as_bool() == Some(true);
    qmp.execute("stop", None)?;
    let saved = (|| {
        qmp.ignore_shared()?;
        qmp.execute(
            "migrate",
            Some(serde_json::json!({ "uri": exec_uri("cat >", &dir.join(STATE))? })),
        )?;
        qmp.wait_migration("saving the device state", SAVE_TIMEOUT)?;
        let mem = dir.join(MEM);
        if !same_file(&parsed.mem_path, &mem) {
            copy_sparse(&parsed.mem_path, &mem)?;
        }
        if let (true, Some(disk)) = (copy_disk, &parsed.disk_path) {
            // QEMU holds the disk open (stopped): share its lock.
            run_tool(
                Command::new("qemu-img")
                    .args(["convert", "-U", "-O", "qcow2"])
                    .arg(disk)
                    .arg(dir.join(DISK)),
                "qemu-img convert (apt-get install qemu-utils)",
            )?;
        }
        parsed.machine.store(dir)?;
        anyhow::Ok(())
    })();
    let after = if keep_running && running {
        qmp.execute("cont", None).map(|_| ())
    } else if keep_running {
        Ok(())
    } else {
        qmp.execute("quit", None).map(|_| ())
    };
    saved?;
    after.context("ending the golden VM after the save")?;
    if meta {
        super::super::meta::meta_gen(&[dir.join(MEM)], "4K", true, true, true)
            .context("making the memory image's metadata")?;
    }
    println!(
        "saved {} as a golden image in {} ({:.1} s): {MEM} {}, {STATE}, {MACHINE}{}{}",
        qemu,
        dir.display(),
        start.elapsed().as_secs_f64(),
        human(parsed.machine.ram_bytes),
        match (&parsed.disk_path, copy_disk) {
            (Some(_), true) => format!(", {DISK}"),
            (Some(d), false) => format!(" (disk kept at {})", d.display()),
            (None, _) => String::new(),
        },
        if meta { ", its metadata" } else { "" }
    );
    Ok(())
}

/// Whether `a` and `b` are one file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}
