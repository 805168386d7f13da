//! `gvfsctl vm`: cloning a VM as a command. `save` turns a running QEMU
//! into a golden image directory, `clone` starts an unmodified QEMU from
//! one (lazily through a gvfs mount, or after a copy), `ls` lists them.
//!
//! A golden image directory holds `mem` (guest RAM), `state` (the device
//! state, saved with `x-ignore-shared`, so without RAM), `machine.json`
//! (the QEMU binary and command line, [`machine`]), `disk.qcow2` (unless
//! the disk was kept where it was), and `.mem.gvfsmeta` (the metadata a
//! proxy fetches the memory image by: compress-and-copy, zero map).

mod clone;
mod files;
mod machine;
mod save;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use files::human;
use machine::{MACHINE, MEM, Machine, STATE};

#[derive(Debug, Subcommand)]
pub(super) enum VmCmd {
    /// Save the running QEMU behind a QMP socket as a golden image in DIR:
    /// its RAM (QEMU must map it from a file, shared: -object
    /// memory-backend-file,id=ram,size=SIZE,mem-path=FILE,share=on
    /// -machine memory-backend=ram), its device state, its command line,
    /// its disk and the memory image's metadata. QEMU quits after, unless
    /// --keep-running.
    Save {
        /// The golden QEMU's QMP socket (-qmp unix:PATH,server=on,wait=off).
        #[arg(long, value_name = "SOCKET")]
        qmp: PathBuf,
        /// The golden image's directory (made; must not hold one already).
        dir: PathBuf,
        /// The disk: copied into DIR as disk.qcow2, or kept where it is
        /// (clones' overlays sit on it there; it must not change).
        #[arg(long, value_enum, default_value_t = DiskMode::Copy)]
        disk: DiskMode,
        /// Let the golden VM run on after the save.
        #[arg(long)]
        keep_running: bool,
        /// Make no metadata for the memory image (`gvfsctl meta gen
        /// --compress` makes it later).
        #[arg(long)]
        no_meta: bool,
    },
    /// Start a clone of the golden image DIR and resume it. Lazy by
    /// default: DIR must be on a gvfs FUSE mount (gvfs-proxy --mount MNT
    /// --mount-readahead 0), and the clone maps DIR/mem private and
    /// read-only, so its pages come through the node's cache as the guest
    /// touches them (huge-page advice off, as no-huge-pages does). Prints
    /// when the guest runs, then waits for QEMU and exits with its status.
    Clone {
        /// The golden image's directory.
        dir: PathBuf,
        /// Copy the memory image first (copy-first; works anywhere).
        #[arg(long)]
        copy: bool,
        /// The clone's own files: its disk overlay, state, QMP socket,
        /// serial logs (default: a new directory under $XDG_RUNTIME_DIR or
        /// /tmp).
        #[arg(long, value_name = "WORKDIR")]
        work: Option<PathBuf>,
        /// Leave QEMU running and exit once the guest runs.
        #[arg(long)]
        detach: bool,
        /// More QEMU arguments (after `--`).
        #[arg(last = true, allow_hyphen_values = true)]
        qemu_args: Vec<OsString>,
    },
    /// List the golden images under DIR: RAM, memory image on disk,
    /// metadata, learned working-set profile, disk.
    Ls {
        /// Where to look (it and its subdirectories); default: here.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

/// Where a saved golden image's disk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum DiskMode {
    /// Into the image as disk.qcow2.
    Copy,
    /// Where it is.
    Keep,
}

/// `gvfsctl vm ...`.
pub(super) fn vm(cmd: VmCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        VmCmd::Save {
            qmp,
            dir,
            disk,
            keep_running,
            no_meta,
        } => save::save(&qmp, &dir, disk == DiskMode::Copy, keep_running, !no_meta)
            .map(|()| ExitCode::SUCCESS),
        VmCmd::Clone {
            dir,
            copy,
            work,
            detach,
            qemu_args,
        } => clone::clone(clone::CloneArgs {
            dir,
            copy,
            work,
            detach,
            extra: qemu_args,
        }),
        VmCmd::Ls { dir } => ls(&dir).map(|()| ExitCode::SUCCESS),
    }
}

/// Prints the golden images in `dir` and its subdirectories.
fn ls(dir: &Path) -> anyhow::Result<()> {
    let mut found = Vec::new();
    if dir.join(MACHINE).is_file() {
        found.push(dir.to_path_buf());
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join(MACHINE).is_file())
        .collect();
    subdirs.sort();
    found.extend(subdirs);
    if found.is_empty() {
        println!(
            "no golden images in {} (`gvfsctl vm save` makes one)",
            dir.display()
        );
        return Ok(());
    }
    println!(
        "{:<24} {:>8} {:>18} {:>9} {:>8}  disk",
        "image", "RAM", "mem on disk", "metadata", "profile"
    );
    for image in found {
        let name = image.file_name().map_or_else(
            || image.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let line = match Machine::load(&image) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                let mem = std::fs::metadata(image.join(MEM));
                let on_disk = mem.as_ref().map_or("missing".to_string(), |md| {
                    format!("{} of {}", human(md.blocks() * 512), human(md.len()))
                });
                let beside = |suffix: &str| {
                    let there = image.join(format!(".{MEM}{suffix}")).exists();
                    if there { "yes" } else { "no" }
                };
                let disk = match &m.disk {
                    None => "none".to_string(),
                    Some(d) => d.kept.clone().unwrap_or_else(|| machine::DISK.to_string()),
                };
                let state = if image.join(STATE).is_file() {
                    ""
                } else {
                    "  (no state!)"
                };
                format!(
                    "{name:<24} {:>8} {on_disk:>18} {:>9} {:>8}  {disk}{state}",
                    human(m.ram_bytes),
                    beside(".gvfsmeta"),
                    beside(gvfs_ext::profile::PROFILE_SUFFIX)
                )
            }
            Err(e) => format!("{name:<24} unreadable: {e:#}"),
        };
        println!("{line}");
    }
    Ok(())
}
