//! A golden image: its disk made from the image's files, then a guest
//! booted on it and saved (memory and device state), and `vm.json`
//! ([`VmConfig`]), what a clone needs to start the same machine and check
//! that it runs on. See the parent module for what each file holds.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::files::{GoldenSize, write_disk_files};
use super::kit::GuestKit;
use super::limits::{QMP_TIMEOUT, TOOL_TIMEOUT};
use super::qemu::{Machine, Qemu, RamMapping};
use crate::process::run_ok;

/// Seconds QEMU may take to boot a golden guest to its third tick.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// What a clone needs to know about its golden image (`vm.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct VmConfig {
    /// The golden image's name.
    pub name: String,
    /// Guest RAM in MiB (`-m`, and the size of `mem`).
    pub ram_mib: u64,
    /// The kernel command line the golden guest booted with.
    pub cmdline: String,
    /// The last `tick N` the golden guest printed before it was saved.
    pub last_tick: u64,
    /// MD5 digests of `run/0` .. `run/R-1`, in order.
    pub run_sums: Vec<String>,
    /// MD5 digest of the `boot/` files one after the other, in the order
    /// the guest's shell lists them (byte order of their names): what a
    /// request is answered with.
    pub boot_sum: String,
}

impl VmConfig {
    /// The JSON text of `vm.json`.
    pub fn to_json(&self) -> String {
        json!({
            "name": self.name,
            "ram_mib": self.ram_mib,
            "cmdline": self.cmdline,
            "last_tick": self.last_tick,
            "run_sums": self.run_sums,
            "boot_sum": self.boot_sum,
        })
        .to_string()
    }

    /// Parses `vm.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).context("vm.json is not JSON")?;
        let str_of = |k: &str| -> Result<String> {
            Ok(v[k]
                .as_str()
                .with_context(|| format!("vm.json: no {k}"))?
                .to_owned())
        };
        let num_of = |k: &str| v[k].as_u64().with_context(|| format!("vm.json: no {k}"));
        let run_sums = v["run_sums"]
            .as_array()
            .context("vm.json: no run_sums")?
            .iter()
            .map(|s| s.as_str().map(str::to_owned).context("vm.json: run_sums"))
            .collect::<Result<Vec<_>>>()?;
        ensure!(!run_sums.is_empty(), "vm.json: run_sums is empty");
        Ok(Self {
            name: str_of("name")?,
            ram_mib: num_of("ram_mib")?,
            cmdline: str_of("cmdline")?,
            last_tick: num_of("last_tick")?,
            run_sums,
            boot_sum: str_of("boot_sum")?,
        })
    }

    /// Reads `vm.json` at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_json(&text)
    }
}

/// Names of a golden image's files.
pub const CONFIG: &str = "vm.json";
/// Guest RAM.
pub const MEM: &str = "mem";
/// Device state.
pub const STATE: &str = "state";
/// The disk.
pub const DISK: &str = "disk.qcow2";
/// Every file of a golden image, in the order a full copy sends them.
pub const FILES: [&str; 4] = [CONFIG, MEM, STATE, DISK];

/// Builds golden image number `seed` in `dir`: its disk, then boots it and
/// saves it; returns its config. A `busy` guest never goes quiet (`gvfs.busy=N`
/// on its kernel command line: the kit's `INIT`).
pub fn build_golden(
    kit: &GuestKit,
    dir: &Path,
    seed: u64,
    size: GoldenSize,
    busy: bool,
) -> Result<VmConfig> {
    std::fs::create_dir_all(dir)?;
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("vm")
        .to_owned();
    let scratch = tempfile::Builder::new()
        .prefix("gvfs-golden-")
        .tempdir()
        .context("scratch directory")?;
    let files = scratch.path().join("files");
    let (run_sums, boot_sum) = write_disk_files(&files, seed, size)?;
    let raw = scratch.path().join("disk.raw");
    // ext4 needs room for its metadata and journal beside the files.
    let fs_mib = size.disk_files_mib + size.disk_files_mib / 8 + 32;
    run_ok(
        Command::new("mke2fs")
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-L",
                &name,
                // 4 KiB blocks at any size (mke2fs makes 1 KiB ones below
                // 512 MiB): a file's blocks are then 4 KiB blocks of the
                // disk, as the census and the zero map count them.
                "-b",
                "4096",
                "-E",
                "root_owner=0:0",
                "-d",
            ])
            .arg(&files)
            .arg(&raw)
            .arg(format!("{fs_mib}M")),
        TOOL_TIMEOUT,
    )
    .context("mke2fs (apt-get install e2fsprogs)")?;
    std::fs::remove_dir_all(&files).ok();
    let disk = dir.join(DISK);
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2"], &[&raw, &disk])?;
    std::fs::remove_file(&raw).ok();

    // Boot it on a throw-away overlay (clones get their own).
    let overlay = scratch.path().join("golden.qcow2");
    create_overlay(&disk.display().to_string(), &overlay)?;
    let mut cmdline = format!("console=ttyS0 quiet panic=-1 gvfs.seed={seed}");
    if busy {
        // 48 MiB of busy data in a guest of 256 MiB or more; a smaller
        // guest (the quick run's) gets 3/16 of its RAM, which it can hold.
        cmdline += &format!(" gvfs.busy={}", (size.ram_mib * 3 / 16).min(48));
    }
    let mem = dir.join(MEM);
    std::fs::remove_file(&mem).ok();
    let machine = Machine {
        kit,
        ram_mib: size.ram_mib,
        cmdline: &cmdline,
        mem: &mem,
        mapping: RamMapping::Shared,
        disk: &overlay,
        incoming: false,
    };
    let mut vm = Qemu::start(&machine, scratch.path())?;
    let ticks = vm.wait_for_tick(|n| n >= 3, BOOT_TIMEOUT)?;
    // The request port works and answers what the clones will expect.
    let sum = vm.request("golden", BOOT_TIMEOUT)?;
    ensure!(
        sum == boot_sum,
        "{name}: the guest answered a request with MD5 {sum}, the boot/ files have {boot_sum}"
    );
    let mut qmp = vm.qmp()?;
    qmp.execute("stop", None)?;
    qmp.ignore_shared()?;
    let state = dir.join(STATE);
    qmp.execute(
        "migrate",
        Some(json!({"uri": format!("exec:cat > '{}'", state.display())})),
    )?;
    qmp.wait_migration("migrate", QMP_TIMEOUT)?;
    // The counter stood where the last complete line says when it stopped.
    let last_tick = vm.ticks()?.last().map_or(ticks, |t| t.0);
    qmp.execute("quit", None).ok();
    vm.wait_exit(QMP_TIMEOUT)?;

    let config = VmConfig {
        name,
        ram_mib: size.ram_mib,
        cmdline,
        last_tick,
        run_sums,
        boot_sum,
    };
    std::fs::write(dir.join(CONFIG), config.to_json())?;
    Ok(config)
}

/// A golden VM booted for `gvfsctl vm save`: its RAM in a file, shared,
/// its console and sockets in a directory. Killed on drop.
pub struct Booted {
    vm: Qemu,
}

impl Booted {
    /// Boots `kit` with `cmdline`, `ram_mib` of RAM in `mem` (shared) and
    /// the disk `disk` (qcow2), its files in `dir` (`qmp.sock`,
    /// `serial.log`, `req.sock`); returns once it has ticked three times.
    pub fn start(
        kit: &GuestKit,
        dir: &Path,
        ram_mib: u64,
        cmdline: &str,
        mem: &Path,
        disk: &Path,
    ) -> Result<Self> {
        let machine = Machine {
            kit,
            ram_mib,
            cmdline,
            mem,
            mapping: RamMapping::Shared,
            disk,
            incoming: false,
        };
        let mut vm = Qemu::start(&machine, dir)?;
        vm.wait_for_tick(|n| n >= 3, BOOT_TIMEOUT)?;
        Ok(Self { vm })
    }

    /// Its QMP socket.
    pub fn qmp_path(&self) -> &Path {
        self.vm.qmp_path()
    }

    /// Waits at most `within` for QEMU to exit (killing it after).
    pub fn wait_exit(&mut self, within: Duration) -> Result<()> {
        self.vm.wait_exit(within)
    }
}

/// Runs `qemu-img ARGS PATHS`.
fn qemu_img(args: &[&str], paths: &[&Path]) -> Result<()> {
    run_ok(
        Command::new("qemu-img").args(args).args(paths),
        TOOL_TIMEOUT,
    )
    .context("qemu-img (apt-get install qemu-utils qemu-block-extra)")?;
    Ok(())
}

/// Creates a qcow2 overlay at `path` on `backing` (a path or an `nfs://`
/// URL), as a clone's own writable disk.
pub fn create_overlay(backing: &str, path: &Path) -> Result<()> {
    run_ok(
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing])
            .arg(path),
        TOOL_TIMEOUT,
    )
    .with_context(|| format!("qemu-img create on {backing}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_config_round_trips_and_refuses_what_is_missing() {
        let c = VmConfig {
            name: "vm1".into(),
            ram_mib: 256,
            cmdline: "console=ttyS0".into(),
            last_tick: 7,
            run_sums: vec!["0123456789abcdef0123456789abcdef".into()],
            boot_sum: "fedcba9876543210fedcba9876543210".into(),
        };
        assert_eq!(VmConfig::from_json(&c.to_json()).expect("parse"), c);
        assert!(VmConfig::from_json("{}").is_err());
        assert!(VmConfig::from_json("not json").is_err());
        assert!(
            VmConfig::from_json(
                r#"{"name":"a","ram_mib":1,"cmdline":"","last_tick":1,"run_sums":[],"boot_sum":""}"#
            )
            .is_err()
        );
        // A vm.json from before requests (no boot_sum) is refused.
        let mut old: Value = serde_json::from_str(&c.to_json()).expect("json");
        old.as_object_mut().expect("object").remove("boot_sum");
        assert!(VmConfig::from_json(&old.to_string()).is_err());
    }
}
