//! The guest side of the clone benchmark: a kernel and initramfs (the
//! "kit"), golden images made by booting and suspending a guest, and the
//! resume of a clone, all with an unmodified QEMU under TCG.
//!
//! # The kit
//! Debian's kernel ([`crate::debian_kernel`]: `linux-image-amd64`, fetched
//! with `apt-get download`, no root needed) and an initramfs written here
//! as a `newc` archive: the static busybox, the eleven modules the guest needs
//! for a virtio disk with ext4, and [`INIT`]. Built once under
//! `target/gvfs-guest/` and reused while [`KIT_STAMP`] is unchanged.
//!
//! # A golden image (one directory)
//! - `disk.qcow2`: an ext4 file system (`mke2fs -d`, 4 KiB blocks, no root
//!   needed) with the files of [`files`]: system files the same on every
//!   image (`sys/`, read at boot, and `usr/`), the image's own working set
//!   (`boot/`, read at boot), `run/` (small files the running guest reads,
//!   one per tick) and `data/` (the rest of its own files, never read);
//! - `mem`: guest RAM as a raw file (`memory-backend-file`), mostly zeros;
//!   its pages of the kernel and of the system files are in the other
//!   images' too ([`super::census`] counts them);
//! - `state`: the device state, saved with `x-ignore-shared` so it leaves
//!   RAM out (a few hundred KB);
//! - `vm.json` ([`VmConfig`]): what a clone needs to start the same machine
//!   and check that it runs on.
//!
//! The guest prints `tick N MD5` about ten times a second, where MD5 is the
//! digest of `run/(N mod R)` read from its disk. A clone is verified running
//! when its serial line continues the golden counter with the right digest:
//! the memory, the device state and the disk all came through intact.
//!
//! # Requests (time to responsiveness)
//! The guest also answers requests on its second serial port (`ttyS1`, a
//! unix socket `req.sock` on the host): a line `ID` gets `answer ID MD5` on
//! the console, MD5 being the digest of the `boot/` files read again from
//! the guest's page cache, so from the memory image ([`VmConfig::boot_sum`]).
//! A clone answers once it is verified running ([`resume_clone`]): the
//! answer is real work on a sizable part of the guest's memory, which a
//! lazy clone has to bring in first.
//!
//! # Two ways to map a clone's memory ([`RamMapping`])
//! A copy-first clone maps its own copy of `mem` shared (`share=on`); a
//! lazy clone maps the golden `mem` itself privately and read-only
//! (`share=off,readonly=on,rom=off`): pages are read when the guest first
//! touches them, its writes stay in QEMU's private copy and the golden file
//! is never written.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::debian_kernel::{KernelPackage, Newc, busybox};
use crate::process::{self, run_ok};

/// Changes whenever the kit's content would change (init script, modules).
pub const KIT_STAMP: &str = "gvfs-guest-kit 3";

pub mod files;
pub use files::GoldenSize;
use files::write_disk_files;

/// Modules the guest loads, in dependency order (read from each module's
/// `depends=`; Debian's package ships no modules.dep).
const MODULES: [&str; 11] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "crc16",
    "mbcache",
    "jbd2",
    "crc32c_generic",
    "ext4",
];

/// The guest's /init.
pub const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /lib/modules/$m.ko || echo "gvfs-guest: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do usleep 50000; i=$((i+1)); done
mkdir -p /mnt
mount -t ext4 -o ro /dev/vda /mnt || echo "gvfs-guest: mount failed"
# The system files every image shares, then this image's own working set:
# both stay in the page cache, so in the memory image.
for f in /mnt/sys/* /mnt/boot/*; do [ -f "$f" ] && cat "$f"; done > /dev/null
# Requests on the second serial port: each line is an id, answered on the
# console with the MD5 of the boot/ files (from the page cache by now).
(
  stty -echo 2>/dev/null
  while read -r id; do
    set -- $(cat /mnt/boot/* | md5sum)
    echo "answer $id $1"
  done
  echo "gvfs-guest: the request port closed"
) < /dev/ttyS1 &
runs=$(ls /mnt/run | wc -l)
echo "gvfs-guest ready runs=$runs"
n=0
while :; do
  n=$((n+1))
  set -- $(md5sum /mnt/run/$((n % runs)))
  echo "tick $n $1"
  usleep 100000
done
"#;

/// Seconds QEMU may take to boot a golden guest to its third tick.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a QMP reply, or a command-line tool, may take.
const QMP_TIMEOUT: Duration = Duration::from_secs(60);
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
const MIB: u64 = 1 << 20;

/// A kernel and initramfs for the guest.
#[derive(Debug, Clone)]
pub struct GuestKit {
    /// The kernel (`-kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`-initrd`), an uncompressed newc archive.
    pub initrd: PathBuf,
}

pub use crate::debian_kernel::kit_dir;

impl GuestKit {
    /// The kit in `dir`, built there first if it is missing or stale.
    pub fn prepare(dir: &Path) -> Result<Self> {
        let kit = Self {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.cpio"),
        };
        let stamp = dir.join("stamp");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(KIT_STAMP)
            && kit.kernel.is_file()
            && kit.initrd.is_file()
        {
            return Ok(kit);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let package = KernelPackage::fetch(dir)?;
        std::fs::copy(&package.vmlinuz, &kit.kernel)
            .with_context(|| format!("copying {}", package.vmlinuz.display()))?;
        write_initramfs(&kit.initrd, &package)?;
        std::fs::write(&stamp, KIT_STAMP)?;
        Ok(kit)
    }
}

/// Writes the initramfs: busybox, the modules, /init and /dev/console.
fn write_initramfs(path: &Path, package: &KernelPackage) -> Result<()> {
    let mut cpio = Newc::default();
    for dir in ["bin", "dev", "proc", "sys", "mnt", "lib", "lib/modules"] {
        cpio.dir(dir);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, std::fs::read(busybox()?)?);
    let init = INIT.replace("MODULES", &MODULES.join(" "));
    cpio.file("init", 0o755, init.into_bytes());
    for m in MODULES {
        cpio.file(
            &format!("lib/modules/{m}.ko"),
            0o644,
            std::fs::read(package.module(m)?)?,
        );
    }
    std::fs::write(path, cpio.finish()).with_context(|| format!("writing {}", path.display()))
}

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
/// saves it; returns its config.
pub fn build_golden(kit: &GuestKit, dir: &Path, seed: u64, size: GoldenSize) -> Result<VmConfig> {
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
    let cmdline = format!("console=ttyS0 quiet panic=-1 gvfs.seed={seed}");
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
    set_ignore_shared(&mut qmp)?;
    let state = dir.join(STATE);
    qmp.execute(
        "migrate",
        Some(json!({"uri": format!("exec:cat > '{}'", state.display())})),
    )?;
    wait_migration(&mut qmp, "migrate")?;
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

/// How QEMU maps guest RAM from its memory file
/// (`memory-backend-file`'s options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamMapping {
    /// `share=on`: the file is the guest's RAM, its writes land there (a
    /// golden guest being built, a copy-first clone's own copy).
    Shared,
    /// `share=off,readonly=on,rom=off`: the file (a golden image's) is
    /// opened read-only and mapped private and writable: pages are read
    /// when the guest first touches them and its writes stay in QEMU (a
    /// lazy clone). QEMU 8.2 or later.
    Private,
}

impl RamMapping {
    fn options(self) -> &'static str {
        match self {
            RamMapping::Shared => "share=on",
            RamMapping::Private => "share=off,readonly=on,rom=off",
        }
    }
}

/// What the harness watches while a clone resumes; every part optional.
#[derive(Default, Clone, Copy)]
pub struct Watch<'a> {
    /// Bytes moved so far (across the WAN), read the moment the guest is
    /// verified running and the moment it has answered its request.
    pub bytes: Option<&'a (dyn Fn() -> u64 + Sync)>,
    /// Called right before `cont` (the device state is loaded).
    pub resuming: Option<&'a (dyn Fn() + Sync)>,
}

/// A clone's resume, as measured.
#[derive(Debug, Clone, Copy)]
pub struct Resumed {
    /// QEMU start to the device state loaded, seconds.
    pub incoming_secs: f64,
    /// `cont` to the first verified tick, seconds.
    pub run_secs: f64,
    /// When the guest was verified running.
    pub running: Instant,
    /// When it had answered its request with the right digest.
    pub answered: Instant,
    /// [`Watch::bytes`] at `running` (0 without it).
    pub bytes_running: u64,
    /// [`Watch::bytes`] at `answered` (0 without it).
    pub bytes_answered: u64,
}

/// Resumes a clone whose files are in `dir` (`vm.json` and `state` copied
/// there, and `disk.qcow2` the overlay) with its RAM in `ram`, mapped as
/// `mapping` says (`dir/mem` copied there, shared; or a golden `mem`,
/// private): starts QEMU with `-incoming defer`, loads the state,
/// continues it, and waits until the guest prints the tick after the golden
/// one's last with the right digest (verified running). Then sends it a
/// request and waits for the answer with the digest of the `boot/` files
/// (responsive).
pub fn resume_clone(
    kit: &GuestKit,
    dir: &Path,
    ram: &Path,
    mapping: RamMapping,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<Resumed> {
    let config = VmConfig::load(&dir.join(CONFIG))?;
    let start = Instant::now();
    let machine = Machine {
        kit,
        ram_mib: config.ram_mib,
        cmdline: &config.cmdline,
        mem: ram,
        mapping,
        disk: &dir.join(DISK),
        incoming: true,
    };
    let mut vm = Qemu::start(&machine, dir)?;
    let mut qmp = vm.qmp()?;
    set_ignore_shared(&mut qmp)?;
    qmp.execute(
        "migrate-incoming",
        Some(json!({"uri": format!("exec:cat '{}'", dir.join(STATE).display())})),
    )?;
    wait_migration(&mut qmp, "migrate-incoming")?;
    let incoming_secs = start.elapsed().as_secs_f64();
    if let Some(resuming) = watch.resuming {
        resuming();
    }
    let cont = Instant::now();
    qmp.execute("cont", None)?;
    let last = config.last_tick;
    let remaining = timeout.saturating_sub(start.elapsed());
    let tick = vm.wait_for_tick(|n| n > last, remaining)?;
    let running = Instant::now();
    let bytes_running = watch.bytes.map_or(0, |b| b());
    let run_secs = cont.elapsed().as_secs_f64();
    let (n, sum) = vm
        .ticks()?
        .into_iter()
        .find(|t| t.0 == tick)
        .context("the tick line went away")?;
    // The first line may finish one the golden guest had begun.
    ensure!(
        n <= last + 2,
        "{}: the clone printed tick {n} after the golden image's {last}: it did not resume \
         from the saved state",
        config.name
    );
    let want = &config.run_sums[(n % config.run_sums.len() as u64) as usize];
    ensure!(
        &sum == want,
        "{}: tick {n} read run/{} with MD5 {sum}, the disk has {want}",
        config.name,
        n % config.run_sums.len() as u64
    );
    let id = format!(
        "r{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let sum = vm.request(&id, timeout.saturating_sub(start.elapsed()))?;
    let answered = Instant::now();
    let bytes_answered = watch.bytes.map_or(0, |b| b());
    ensure!(
        sum == config.boot_sum,
        "{}: request {id} was answered with MD5 {sum}, the boot/ files have {}",
        config.name,
        config.boot_sum
    );
    qmp.execute("quit", None).ok();
    vm.wait_exit(QMP_TIMEOUT)?;
    Ok(Resumed {
        incoming_secs,
        run_secs,
        running,
        answered,
        bytes_running,
        bytes_answered,
    })
}

/// What QEMU is started with.
struct Machine<'a> {
    kit: &'a GuestKit,
    ram_mib: u64,
    cmdline: &'a str,
    mem: &'a Path,
    mapping: RamMapping,
    disk: &'a Path,
    incoming: bool,
}

/// A running `qemu-system-x86_64`, killed on drop.
struct Qemu {
    child: Child,
    qmp: PathBuf,
    serial: PathBuf,
    /// The second serial port's socket: requests to the guest.
    requests: PathBuf,
    log: PathBuf,
}

impl Qemu {
    fn start(m: &Machine<'_>, dir: &Path) -> Result<Self> {
        let qmp = dir.join("qmp.sock");
        let serial = dir.join("serial.log");
        let requests = dir.join("req.sock");
        let log = dir.join("qemu.log");
        std::fs::remove_file(&qmp).ok();
        std::fs::remove_file(&requests).ok();
        // A lazy clone's QEMU runs under `gvfsctl no-huge-pages`: its
        // huge-page advice on guest RAM would make Linux read the mapped
        // memory image 4 MiB around each first fault.
        let mut cmd = if m.mapping == RamMapping::Private {
            let mut c = Command::new(crate::proxy::gvfsctl_binary()?);
            c.args(["no-huge-pages", "--", "qemu-system-x86_64"]);
            c
        } else {
            Command::new("qemu-system-x86_64")
        };
        cmd.args(["-accel", "tcg", "-machine", "pc,memory-backend=mem"])
            .args(["-m", &format!("{}M", m.ram_mib), "-smp", "1"])
            .args(["-display", "none", "-monitor", "none", "-nodefaults"])
            .args(["-no-user-config", "-no-reboot"])
            .arg("-kernel")
            .arg(&m.kit.kernel)
            .arg("-initrd")
            .arg(&m.kit.initrd)
            .args(["-append", m.cmdline])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=mem,size={}M,mem-path={},{}",
                m.ram_mib,
                m.mem.display(),
                m.mapping.options()
            ))
            .arg("-drive")
            .arg(format!(
                "file={},format=qcow2,if=virtio,id=disk0",
                m.disk.display()
            ))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-chardev")
            .arg(format!(
                "socket,id=req,path={},server=on,wait=off",
                requests.display()
            ))
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .args(["-serial", "chardev:req"]);
        if m.incoming {
            cmd.args(["-incoming", "defer"]);
        }
        let out = File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
        Ok(Self {
            child,
            qmp,
            serial,
            requests,
            log,
        })
    }

    /// Connects to its QMP socket (QEMU creates it as it starts).
    fn qmp(&mut self) -> Result<Qmp> {
        let deadline = Instant::now() + QMP_TIMEOUT;
        loop {
            if let Ok(s) = UnixStream::connect(&self.qmp) {
                return Qmp::handshake(s);
            }
            self.check_alive()?;
            ensure!(
                Instant::now() < deadline,
                "no QMP socket from QEMU: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("QEMU exited ({status}): {}", self.log_text());
        }
        Ok(())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Complete `WORD A MD5` lines printed so far, as (A, MD5).
    fn lines_of(&self, word: &str) -> Vec<(String, String)> {
        let text = std::fs::read(&self.serial).unwrap_or_default();
        serial_lines(&String::from_utf8_lossy(&text), word)
    }

    /// Complete `tick N MD5` lines printed so far.
    fn ticks(&self) -> Result<Vec<(u64, String)>> {
        Ok(self
            .lines_of("tick")
            .into_iter()
            .filter_map(|(n, sum)| Some((n.parse().ok()?, sum)))
            .collect())
    }

    /// Sends request `id` (no spaces) to the guest on its second serial
    /// port and waits for its `answer ID MD5` line; returns MD5.
    fn request(&mut self, id: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut port = UnixStream::connect(&self.requests)
            .with_context(|| format!("connecting to {}", self.requests.display()))?;
        port.write_all(format!("{id}\n").as_bytes())
            .context("writing a request to the guest")?;
        loop {
            if let Some((_, sum)) = self.lines_of("answer").into_iter().find(|a| a.0 == id) {
                return Ok(sum);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let serial = std::fs::read(&self.serial).unwrap_or_default();
                bail!(
                    "the guest did not answer request {id} within {timeout:?}; serial:\n{}\nQEMU:\n{}",
                    String::from_utf8_lossy(&serial),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for a tick line whose number satisfies `pred`; returns it.
    fn wait_for_tick(&mut self, pred: impl Fn(u64) -> bool, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = self.ticks()?.into_iter().find(|t| pred(t.0)) {
                return Ok(t.0);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let serial = std::fs::read(&self.serial).unwrap_or_default();
                bail!(
                    "the guest did not tick on within {timeout:?}; serial:\n{}\nQEMU:\n{}",
                    String::from_utf8_lossy(&serial),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        if process::wait_timeout(&mut self.child, timeout)?.is_none() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
        Ok(())
    }
}

/// The complete lines of `text` (a serial log) that are `WORD A MD5`, as
/// (A, MD5); the part after the last newline is not complete.
fn serial_lines(text: &str, word: &str) -> Vec<(String, String)> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop();
    lines
        .into_iter()
        .filter_map(|l| {
            let mut w = l.trim_end_matches('\r').split(' ');
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some(first), Some(a), Some(sum), None) if first == word && sum.len() == 32 => {
                    Some((a.to_owned(), sum.to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// A QMP connection: one JSON command per line, events skipped.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Reads QEMU's greeting on `stream` (a connected QMP socket) and
    /// enters command mode (`qmp_capabilities`).
    pub fn handshake(stream: UnixStream) -> Result<Self> {
        stream.set_read_timeout(Some(QMP_TIMEOUT))?;
        stream.set_write_timeout(Some(QMP_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read_message()?;
        ensure!(
            greeting.get("QMP").is_some(),
            "not a QMP greeting: {greeting}"
        );
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<Value> {
        let mut line = String::new();
        // A QMP message is a line of JSON; QEMU's are small.
        let n = (&mut self.reader)
            .take(1 << 20)
            .read_line(&mut line)
            .context("reading from QMP")?;
        ensure!(n > 0, "QEMU closed its QMP socket");
        serde_json::from_str(&line).with_context(|| format!("QMP sent {line:?}"))
    }

    /// Runs `command`; returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        writeln!(self.writer, "{msg}").context("writing to QMP")?;
        loop {
            let reply = self.read_message()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                bail!("QMP {command}: {e}");
            }
        }
    }
}

use std::io::Read as _;

/// Leaves the shared RAM (the `mem` file) out of the migration stream.
fn set_ignore_shared(qmp: &mut Qmp) -> Result<()> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
    )?;
    Ok(())
}

/// Polls `query-migrate` until the migration `what` completes.
fn wait_migration(qmp: &mut Qmp, what: &str) -> Result<()> {
    let deadline = Instant::now() + QMP_TIMEOUT;
    loop {
        let r = qmp.execute("query-migrate", None)?;
        match r["status"].as_str() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => bail!("{what} failed: {r}"),
            _ => {}
        }
        ensure!(Instant::now() < deadline, "{what} did not complete: {r}");
        std::thread::sleep(Duration::from_millis(5));
    }
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

    #[test]
    fn serial_lines_are_complete_three_word_lines() {
        let log = "tick 41 0123456789abcdef0123456789abcdef\r\n\
                   answer r7 fedcba9876543210fedcba9876543210\r\n\
                   gvfs-guest ready runs=8\n\
                   tick 42 0123456789abcdef0123456789abcdef extra\n\
                   answer r8 fedcba98765432";
        assert_eq!(
            serial_lines(log, "tick"),
            [(
                "41".to_owned(),
                "0123456789abcdef0123456789abcdef".to_owned()
            )]
        );
        assert_eq!(
            serial_lines(log, "answer"),
            [(
                "r7".to_owned(),
                "fedcba9876543210fedcba9876543210".to_owned()
            )]
        );
    }
}
