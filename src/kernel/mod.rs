//! The Linux kernel NFS client as a test peer: a QEMU guest under TCG boots
//! Debian's kernel, loads the NFS client modules, mounts an export served on
//! this machine's loopback (a gvfs-proxy, a chain of them, or nfs-ganesha)
//! with mount(2) and text options, runs a workload on it and reports each
//! step; `tests/kernel.rs` runs it and compares the origin with what the
//! guest wrote.
//!
//! # The kit
//! Debian's kernel ([`crate::debian_kernel`], the package the clone
//! benchmark uses too) and an initramfs: the static busybox, the NFS client
//! modules and virtio_net's chain ([`ROOT_MODULES`] and what they depend on,
//! read from each module's `depends=`), `nfsmount` ([`NFSMOUNT_C`], a small
//! C program built with `gcc -static` here, since busybox mount cannot mount
//! NFS) and `/init` ([`INIT`]: the workload). Built once under
//! `KIT_DIR/nfs-client` and rebuilt when the script, the helper or
//! [`KIT_VERSION`] change.
//!
//! # The network
//! QEMU's user networking: the guest is 10.0.2.15 and reaches the host's
//! 127.0.0.1 at 10.0.2.2, so the server must listen on 127.0.0.1; no other
//! address is ever dialled. The mount options are
//! `vers=3,proto=tcp,port=P,mountport=M,mountproto=tcp,nolock,addr=10.0.2.2,mountaddr=10.0.2.2`
//! (the kernel then picks rsize = wsize = 1 MiB, hard, timeo=600).
//!
//! # The workload ([`INIT`])
//! Create files and a directory, write 6 MiB and an odd-sized file with
//! `dd`, overwrite across a 1 MiB boundary and at an odd offset, append,
//! read back after `echo 3 > /proc/sys/vm/drop_caches` and compare MD5s
//! with the guest's own copies in RAM; two writers and a reader at once;
//! rename (also over an existing file, and a directory into another), hard
//! links (link counts), a symbolic link, truncate down then up (the end
//! must read as zeros), chmod, a write past the end (a hole), a file removed
//! while open (the kernel's `.nfsXXXX` rename), files written by uid 1000
//! then made read-only (and, with [`Workload::set_mtime`], given an old
//! mtime), remove, a 300-entry directory listed and counted; then umount,
//! remount and check everything again. Results go to the second serial port
//! as lines ([`report`]); the guest then powers off.

pub mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::debian_kernel::{DirLock, KernelPackage, Newc, busybox, kit_dir};
use crate::process::run_ok;
use crate::{Ganesha, Proxy};

use report::tail;
pub use report::{Entry, GuestReport, compare_trees, origin_entries};

/// Bump when the kit changes in a way [`INIT`] and [`NFSMOUNT_C`] do not
/// show (the module list, the archive's layout).
pub const KIT_VERSION: &str = "gvfs-nfs-client-kit 1";
/// The guest's `/init`: the workload (`src/kernel/init.sh`).
pub const INIT: &str = include_str!("init.sh");
/// The mount helper's source (`src/kernel/nfsmount.c`).
pub const NFSMOUNT_C: &str = include_str!("nfsmount.c");
/// The modules the guest loads, with everything they depend on: the PCI
/// transport for virtio, the network card, and NFSv3 (which brings sunrpc,
/// lockd, grace, nfs_acl, nfs, fscache and netfs).
pub const ROOT_MODULES: [&str; 3] = ["virtio_pci", "virtio_net", "nfsv3"];

/// The guest's users: root, and `user` (1000) for writes that are not
/// root's.
const PASSWD: &str = "root:x:0:0:root:/:/bin/sh\nuser:x:1000:1000:user:/:/bin/sh\n";
const GROUP: &str = "root:x:0:\nuser:x:1000:\n";
/// Guest RAM: the workload keeps ~16 MiB of copies in RAM.
const RAM_MIB: u32 = 256;
/// How long a guest may run, boot to power-off. The workload takes ~15-30 s
/// under TCG; each step in the guest is killed after 90 s.
const GUEST_TIMEOUT: Duration = Duration::from_secs(400);
/// How often the guest's results are read while it runs.
const STEP_POLL: Duration = Duration::from_millis(20);
/// How long a build tool (gcc) may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// The address the guest reaches the host's 127.0.0.1 at (QEMU user
/// networking).
pub const HOST_FROM_GUEST: &str = "10.0.2.2";

/// A kernel and initramfs for the NFS client guest.
#[derive(Debug, Clone)]
pub struct NfsClientKit {
    /// The kernel (`-kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`-initrd`), an uncompressed newc archive.
    pub initrd: PathBuf,
}

impl NfsClientKit {
    /// The kit in `KIT_DIR/nfs-client`, built first if missing or stale.
    /// Threads of one process share one build; other processes wait for
    /// it on a lock.
    pub fn shared() -> Result<Self> {
        static BUILDING: Mutex<()> = Mutex::new(());
        let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        Self::prepare(&kit_dir())
    }

    /// The kit in `kits/nfs-client`, built there first if missing or stale;
    /// Debian's kernel package is kept in `kits/debs`.
    pub fn prepare(kits: &Path) -> Result<Self> {
        let dir = kits.join("nfs-client");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _lock = DirLock::take(&dir)?;
        let kit = Self {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.cpio"),
        };
        let stamp_path = dir.join("stamp");
        let stamp = format!("{KIT_VERSION}\n{INIT}\n{NFSMOUNT_C}\n{PASSWD}{GROUP}");
        if std::fs::read_to_string(&stamp_path).ok() == Some(stamp.clone())
            && kit.kernel.is_file()
            && kit.initrd.is_file()
        {
            return Ok(kit);
        }
        std::fs::remove_file(&stamp_path).ok();
        let package = KernelPackage::fetch(kits)?;
        let modules = package
            .load_order(&ROOT_MODULES)
            .context("ordering the guest's modules")?;
        let helper = build_nfsmount(&dir)?;
        let mut cpio = Newc::default();
        for d in [
            "bin",
            "dev",
            "etc",
            "proc",
            "sys",
            "mnt",
            "tmp",
            "lib",
            "lib/modules",
        ] {
            cpio.dir(d);
        }
        cpio.file("etc/passwd", 0o644, PASSWD.as_bytes().to_vec());
        cpio.file("etc/group", 0o644, GROUP.as_bytes().to_vec());
        cpio.char_device("dev/console", 5, 1);
        cpio.file("bin/busybox", 0o755, std::fs::read(busybox()?)?);
        cpio.file("bin/nfsmount", 0o755, helper);
        cpio.file(
            "init",
            0o755,
            INIT.replace("@MODULES@", &modules.join(" ")).into_bytes(),
        );
        for m in &modules {
            let bytes =
                std::fs::read(package.module(m)?).with_context(|| format!("reading module {m}"))?;
            cpio.file(&format!("lib/modules/{m}.ko"), 0o644, bytes);
        }
        let partial = dir.join("initrd.cpio.partial");
        std::fs::write(&partial, cpio.finish())
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &kit.initrd)?;
        std::fs::copy(&package.vmlinuz, &kit.kernel)
            .with_context(|| format!("copying {}", package.vmlinuz.display()))?;
        std::fs::write(&stamp_path, stamp)?;
        Ok(kit)
    }
}

/// Compiles [`NFSMOUNT_C`] with `gcc -static` in `dir`; returns the binary.
fn build_nfsmount(dir: &Path) -> Result<Vec<u8>> {
    let src = dir.join("nfsmount.c");
    let bin = dir.join("nfsmount");
    std::fs::write(&src, NFSMOUNT_C).with_context(|| format!("writing {}", src.display()))?;
    run_ok(
        Command::new("gcc")
            .args(["-static", "-Os", "-Wall", "-o"])
            .arg(&bin)
            .arg(&src),
        TOOL_TIMEOUT,
    )
    .context(
        "building the guest's mount helper with `gcc -static` \
         (apt-get install gcc libc6-dev)",
    )?;
    std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))
}

/// The NFS server the guest mounts: ports on the host's 127.0.0.1.
#[derive(Debug, Clone)]
pub struct Server {
    /// NFS port.
    pub port: u16,
    /// MOUNT port.
    pub mount_port: u16,
    /// The export's path (`/export`).
    pub export: String,
}

impl Server {
    /// A gvfs-proxy (NFS and MOUNT on one port). It must listen on
    /// 127.0.0.1, the only host address the guest reaches.
    pub fn proxy(p: &Proxy) -> Result<Self> {
        ensure!(
            p.ip() == std::net::Ipv4Addr::LOCALHOST,
            "the guest reaches only 127.0.0.1, and the proxy listens on {}",
            p.ip()
        );
        Ok(Self {
            port: p.port(),
            mount_port: p.port(),
            export: p.export().to_owned(),
        })
    }

    /// nfs-ganesha itself.
    pub fn ganesha(g: &Ganesha) -> Self {
        Self {
            port: g.nfs_port(),
            mount_port: g.mount_port(),
            export: crate::ganesha::EXPORT.to_owned(),
        }
    }
}

/// Choices in the guest's workload.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Set a file's mtime (`touch -d`) after writing it, as `cp -p`, tar
    /// and rsync do, and check that the guest, and then the origin, keep
    /// it. On by default.
    pub set_mtime: bool,
}

impl Default for Workload {
    fn default() -> Self {
        Self { set_mtime: true }
    }
}

/// Boots a guest that runs the workload on `server`, waits until it powers
/// off and returns what it reported. Its console and results are kept in
/// `work` (`console.log`, `results.log`, `qemu.log`).
pub fn run_guest(
    kit: &NfsClientKit,
    server: &Server,
    workload: Workload,
    work: &Path,
) -> Result<GuestReport> {
    run_guest_with(kit, server, workload, work, |_| Ok(()))
}

/// [`run_guest`], calling `on_step(NAME)` as soon as the guest reports
/// step NAME done (passed or failed) while it goes on with the next one: a
/// test can restart or cut the server under a running client. An error from
/// `on_step` stops the guest and is returned.
pub fn run_guest_with(
    kit: &NfsClientKit,
    server: &Server,
    workload: Workload,
    work: &Path,
    mut on_step: impl FnMut(&str) -> Result<()>,
) -> Result<GuestReport> {
    let console = work.join("console.log");
    let results = work.join("results.log");
    let log = work.join("qemu.log");
    let cmdline = format!(
        "console=ttyS0 quiet panic=-1 gvfs.server={HOST_FROM_GUEST} gvfs.port={} \
         gvfs.mountport={} gvfs.export={} gvfs.set_mtime={}",
        server.port,
        server.mount_port,
        server.export,
        u8::from(workload.set_mtime)
    );
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg", "-m", &format!("{RAM_MIB}M"), "-smp", "1"])
        .args(["-display", "none", "-monitor", "none", "-nodefaults"])
        .args(["-no-user-config", "-no-reboot"])
        .arg("-kernel")
        .arg(&kit.kernel)
        .arg("-initrd")
        .arg(&kit.initrd)
        .args(["-append", &cmdline])
        .args(["-netdev", "user,id=net0"])
        .args(["-device", "virtio-net-pci,netdev=net0,romfile="])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()));
    let out = std::fs::File::create(&log)?;
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let mut steps_seen = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() >= GUEST_TIMEOUT {
            break None;
        }
        let so_far = GuestReport::parse(&read(&results), String::new(), start.elapsed());
        for (name, _) in so_far.steps.iter().skip(steps_seen) {
            if let Err(e) = on_step(name) {
                child.kill().ok();
                child.wait().ok();
                return Err(e.context(format!("after the guest's step {name}")));
            }
        }
        steps_seen = so_far.steps.len();
        std::thread::sleep(STEP_POLL);
    };
    let Some(status) = status else {
        child.kill().ok();
        child.wait().ok();
        bail!(
            "the guest did not power off within {GUEST_TIMEOUT:?}; results so far:\n{}\n\
             console:\n{}\nQEMU:\n{}",
            read(&results),
            tail(&read(&console), 60),
            read(&log)
        );
    };
    let mut report = GuestReport::parse(&read(&results), read(&console), start.elapsed());
    report.set_mtime = workload.set_mtime;
    ensure!(
        status.success() || report.end.is_some(),
        "QEMU exited ({status}) before the guest finished: {}\nQEMU:\n{}",
        report.summary(),
        read(&log)
    );
    Ok(report)
}
