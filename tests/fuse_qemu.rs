//! An unmodified QEMU (`qemu-system-x86_64 -accel tcg`) running a VM whose
//! RAM and disk are files on the proxy's FUSE mount (`gvfs-proxy --mount`),
//! as the guide's "A FUSE mount" (docs/guide/first-proxy.md) shows and PEERS.md's QEMU sections describe:
//!
//! - *Shared RAM and a qcow2 disk*: guest RAM is `memory-backend-file` on
//!   the mount with `share=on` (QEMU maps the file `MAP_SHARED`), the disk a
//!   qcow2 image made there by `qemu-img`. The RAM file is first written
//!   with a known pattern through the mount; the paused guest's physical
//!   memory (HMP `xp`) must show it (QEMU mapped the file through FUSE).
//!   The firmware (SeaBIOS) then runs, writes low memory and reads the
//!   disk; the guest's memory saved by `pmemsave` must then be the origin's
//!   file byte for byte once the proxy has written back, and differ from
//!   the pattern below 1 MiB (the guest's stores reached the file through
//!   the shared mapping, the kernel's write-back and the proxy).
//!   `qemu-img check` passes on the disk, through the mount and at the
//!   origin.
//! - *Lazy clone*: guest RAM maps a golden file privately and read-only
//!   (`share=off,readonly=on,rom=off`). The guest sees the golden pattern,
//!   runs and writes its private copy, and the golden file, at the origin
//!   and through the mount, is unchanged.
//!
//! QEMU is driven over QMP with the clone benchmark's client
//! ([`gvfs_testbed::clone::guest::Qmp`]). Skipped (with a message) when FUSE
//! (`/dev/fuse`, `fusermount3`), `qemu-system-x86_64` or `qemu-img` is
//! missing.

use std::fs::{self, File};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::clone::guest::Qmp;
use gvfs_testbed::data::{compare_bytes, compare_file_with, compare_files, random_bytes};
use gvfs_testbed::fuse::{self, MountPoint, drop_caches};
use gvfs_testbed::libnfs::qemu_img;
use gvfs_testbed::process;
use gvfs_testbed::{Proxy, ProxyArgs};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
/// Guest RAM, and the size of the memory files.
const RAM: u64 = 64 * MIB;
/// Guest physical addresses checked with `xp` while the guest is paused
/// (none below 1 MiB, where the BIOS ROM and the VGA window sit).
const PROBES: [u64; 4] = [MIB + 0x10, 16 * MIB, 40 * MIB + 0x1234, RAM - 8];
/// Guest physical addresses SeaBIOS leaves alone (it writes below 1 MiB,
/// and its tables near 48 MiB and at the top of RAM).
const UNTOUCHED: [u64; 2] = [16 * MIB, 40 * MIB + 0x1234];
/// The firmware's stores land below this (its data areas, stack, shadow).
const LOW: u64 = MIB;
/// How long QEMU may take to start, answer, reach a state, or exit.
const QEMU_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the firmware runs on after it has visibly started.
const RUN_ON: Duration = Duration::from_millis(1000);

/// Returns from the test (passing) with a message when FUSE or QEMU is
/// missing.
macro_rules! require_fuse_and_qemu {
    () => {
        if let Some(why) = gvfs_testbed::fuse::unavailable() {
            eprintln!("skipping: {why}");
            return Ok(());
        }
        for tool in ["qemu-system-x86_64", "qemu-img"] {
            if gvfs_testbed::fuse::which(tool).is_none() {
                eprintln!(
                    "skipping: {tool} is not installed (apt-get install qemu-system-x86 qemu-utils)"
                );
                return Ok(());
            }
        }
    };
}

/// An origin directory, a cache directory, and a proxy with its block cache
/// and its FUSE mount:
/// `gvfs-proxy --listen 127.0.0.1:0 --upstream dir:ORIGIN --cache-dir CACHE
/// --cache-size 256M --mount MNT`.
struct Setup {
    origin: tempfile::TempDir,
    /// Files outside the mount: QEMU's socket and log, memory dumps.
    local: tempfile::TempDir,
    mnt: MountPoint,
    proxy: Proxy,
    _cache: tempfile::TempDir,
}

impl Setup {
    fn new() -> Result<Self> {
        let origin = tempfile::tempdir()?;
        let cache = tempfile::tempdir()?;
        let local = tempfile::tempdir()?;
        let mnt = MountPoint::new()?;
        let proxy = fuse::mounted(
            ProxyArgs::dir(origin.path()).cache(cache.path(), "256M"),
            &mnt,
        )?;
        Ok(Self {
            origin,
            local,
            mnt,
            proxy,
            _cache: cache,
        })
    }

    fn on_mount(&self, name: &str) -> PathBuf {
        self.mnt.path().join(name)
    }

    fn at_origin(&self, name: &str) -> PathBuf {
        self.origin.path().join(name)
    }

    fn local(&self, name: &str) -> PathBuf {
        self.local.path().join(name)
    }

    /// Runs `f`; an error carries the proxy's output.
    fn run(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<()> {
        f(self).with_context(|| format!("proxy output:\n{}", self.proxy.output()))
    }
}

/// A `qemu-system-x86_64` we started, paused (`-S`), with a QMP socket;
/// killed (by its own pid) on drop if it is still running.
struct Vm {
    child: Child,
    qmp: Qmp,
    log: PathBuf,
}

impl Vm {
    /// Starts QEMU with `machine` (the memory backend and drives) after the
    /// common arguments, its socket and log in `dir`, and connects to QMP.
    fn start(dir: &Path, machine: &[String]) -> Result<Self> {
        let socket = dir.join("qmp.sock");
        let log = dir.join("qemu.log");
        fs::remove_file(&socket).ok();
        let out = File::create(&log)?;
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-accel", "tcg", "-display", "none", "-nodefaults"])
            .args(["-no-user-config", "-S", "-smp", "1", "-m", "64M"])
            .args(machine)
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let line = process::describe(&cmd);
        let mut child = cmd.spawn().with_context(|| format!("starting `{line}`"))?;
        let deadline = Instant::now() + QEMU_TIMEOUT;
        let stream = loop {
            if let Ok(s) = UnixStream::connect(&socket) {
                break s;
            }
            let exited = child.try_wait()?;
            if exited.is_some() || Instant::now() >= deadline {
                if exited.is_none() {
                    child.kill().ok();
                }
                child.wait().ok();
                bail!(
                    "`{line}` {}: {}",
                    match exited {
                        Some(status) => format!("exited ({status})"),
                        None => format!("opened no QMP socket within {QEMU_TIMEOUT:?}"),
                    },
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let qmp = match Qmp::handshake(stream) {
            Ok(q) => q,
            Err(e) => {
                child.kill().ok();
                child.wait().ok();
                return Err(e.context(format!("QMP handshake with `{line}`")));
            }
        };
        Ok(Self { child, qmp, log })
    }

    fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        self.qmp
            .execute(command, arguments)
            .with_context(|| format!("QEMU log: {}", self.log_text()))
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The run state (`query-status`: "prelaunch", "running", "paused"...).
    fn status(&mut self) -> Result<String> {
        let s = self.execute("query-status", None)?;
        Ok(s["status"].as_str().unwrap_or_default().to_owned())
    }

    /// `n` bytes of guest physical memory at `addr`, as the HMP command
    /// `xp /Nxb ADDR` shows them.
    fn xp(&mut self, addr: u64, n: usize) -> Result<Vec<u8>> {
        let cmd = format!("xp /{n}xb {addr:#x}");
        let out = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": cmd })),
        )?;
        let text = out
            .as_str()
            .context("human-monitor-command returned no text")?;
        let bytes = parse_xp(text).with_context(|| format!("`{cmd}` said {text:?}"))?;
        ensure!(
            bytes.len() == n,
            "`{cmd}` showed {} bytes: {text:?}",
            bytes.len()
        );
        Ok(bytes)
    }

    /// Saves guest physical memory `[0, size)` to the local file `to`
    /// (QMP `pmemsave`) and reads it back.
    fn pmemsave(&mut self, size: u64, to: &Path) -> Result<Vec<u8>> {
        self.execute(
            "pmemsave",
            Some(json!({ "val": 0, "size": size, "filename": to.display().to_string() })),
        )?;
        let bytes = fs::read(to).with_context(|| format!("reading {}", to.display()))?;
        ensure!(
            bytes.len() as u64 == size,
            "pmemsave wrote {} bytes, not {size}",
            bytes.len()
        );
        Ok(bytes)
    }

    /// Reads of the disk `device` so far (`query-blockstats`).
    fn disk_reads(&mut self) -> Result<u64> {
        let stats = self.execute("query-blockstats", None)?;
        stats
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["device"].as_str() == Some("virtio0"))
            .and_then(|s| s["stats"]["rd_operations"].as_u64())
            .with_context(|| format!("no virtio0 disk in query-blockstats: {stats}"))
    }

    /// `cont`, then waits until `started` says the guest has visibly run
    /// (for at most [`QEMU_TIMEOUT`]), lets it run [`RUN_ON`] more, and
    /// `stop`s it.
    fn run_firmware(&mut self, mut started: impl FnMut(&mut Self) -> Result<bool>) -> Result<()> {
        self.execute("cont", None)?;
        let deadline = Instant::now() + QEMU_TIMEOUT;
        while !started(self)? {
            if let Some(status) = self.child.try_wait()? {
                bail!("QEMU exited ({status}): {}", self.log_text());
            }
            ensure!(
                Instant::now() < deadline,
                "the guest showed no sign of running within {QEMU_TIMEOUT:?} (state {}); \
                 QEMU log: {}",
                self.status()?,
                self.log_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(RUN_ON);
        self.execute("stop", None)?;
        let status = self.status()?;
        ensure!(
            status == "paused",
            "after `stop` QEMU is {status:?}, not paused"
        );
        Ok(())
    }

    /// `quit`, and waits for QEMU to exit (killed after [`QEMU_TIMEOUT`],
    /// which is an error).
    fn quit(mut self) -> Result<()> {
        // QEMU may close the socket before it answers.
        let _ = self.qmp.execute("quit", None);
        match process::wait_timeout(&mut self.child, QEMU_TIMEOUT)? {
            Some(status) => {
                ensure!(
                    status.success(),
                    "QEMU exited with {status} after quit: {}",
                    self.log_text()
                );
                Ok(())
            }
            None => bail!("QEMU did not exit within {QEMU_TIMEOUT:?} of quit"),
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// The bytes in HMP `xp /Nxb` output: lines `ADDR: 0x12 0x34 ...`.
fn parse_xp(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (_, bytes) = line.split_once(':').context("no `ADDR:` in a line")?;
        for b in bytes.split_whitespace() {
            let hex = b.strip_prefix("0x").context("a byte without 0x")?;
            out.push(u8::from_str_radix(hex, 16).with_context(|| format!("byte {b:?}"))?);
        }
    }
    Ok(out)
}

/// Checks with `xp` that guest memory at [`PROBES`] is `pattern` there.
fn check_probes(vm: &mut Vm, pattern: &[u8]) -> Result<()> {
    for addr in PROBES {
        let seen = vm.xp(addr, 8)?;
        let want = &pattern[addr as usize..addr as usize + 8];
        ensure!(
            seen == want,
            "guest physical memory at {addr:#x} is {seen:02x?}, the memory file there holds \
             {want:02x?}: QEMU did not map the file on the mount"
        );
    }
    Ok(())
}

/// Whether guest memory below [`LOW`] differs from `pattern` (the firmware
/// has run and written there), by a `pmemsave` into `scratch`.
fn low_memory_changed(vm: &mut Vm, pattern: &[u8], scratch: &Path) -> Result<bool> {
    let low = vm.pmemsave(LOW, scratch)?;
    Ok(low != pattern[..LOW as usize])
}

/// Writes `pattern` to `path` (on the mount) and closes it.
fn write_pattern(path: &Path, pattern: &[u8]) -> Result<()> {
    fs::write(path, pattern).with_context(|| format!("writing {}", path.display()))
}

/// The first offset below `end` where `a` and `b` differ.
fn first_difference_below(a: &[u8], b: &[u8], end: u64) -> Option<usize> {
    a[..end as usize]
        .iter()
        .zip(&b[..end as usize])
        .position(|(x, y)| x != y)
}

#[test]
fn shared_ram_and_a_qcow2_disk_on_the_mount() -> Result<()> {
    require_fuse_and_qemu!();
    let s = Setup::new()?;
    s.run(|s| {
        let pattern = random_bytes(0x5eed_0001, RAM as usize);
        let mem = s.on_mount("vm.mem");
        let disk = s.on_mount("disk.qcow2");
        let disk_s = disk.display().to_string();
        write_pattern(&mem, &pattern)?;
        qemu_img(&["create", "-q", "-f", "qcow2", &disk_s, "64M"])?;

        let mut vm = Vm::start(
            s.local.path(),
            &[
                "-object".into(),
                format!(
                    "memory-backend-file,id=mem,size=64M,mem-path={},share=on",
                    mem.display()
                ),
                "-machine".into(),
                "pc,memory-backend=mem".into(),
                "-drive".into(),
                format!("file={disk_s},if=virtio,format=qcow2"),
            ],
        )?;
        ensure!(vm.status()? == "prelaunch", "QEMU did not start paused");
        check_probes(&mut vm, &pattern).context("the paused guest's RAM (share=on)")?;

        // The firmware runs until it has written low memory and read the
        // disk (looking for a boot sector), then a little more.
        let scratch = s.local("low.bin");
        vm.run_firmware(|vm| {
            Ok(vm.disk_reads()? > 0 && low_memory_changed(vm, &pattern, &scratch)?)
        })?;
        let dump_path = s.local("pmemsave.bin");
        let dump = vm.pmemsave(RAM, &dump_path)?;
        vm.quit()?;

        let at = first_difference_below(&dump, &pattern, LOW).context(
            "the guest's memory below 1 MiB is still the pattern after the firmware ran",
        )?;
        eprintln!("the firmware's first store in RAM is at {at:#x}");

        s.proxy.write_back()?;
        let origin_mem = s.at_origin("vm.mem");
        compare_files(&dump_path, &origin_mem).context(
            "the guest's memory (pmemsave) against the memory file at the origin: the guest's \
             stores through the MAP_SHARED mapping did not all reach it",
        )?;
        let origin_bytes = fs::read(&origin_mem)?;
        ensure!(
            first_difference_below(&origin_bytes, &pattern, LOW).is_some(),
            "the memory file at the origin is still the pattern below 1 MiB"
        );
        drop_caches();
        compare_file_with(&dump, &mem).context("the memory file through the mount")?;

        qemu_img(&["check", &disk_s]).context("the disk through the mount")?;
        let origin_disk = s.at_origin("disk.qcow2").display().to_string();
        qemu_img(&["check", &origin_disk]).context("the disk at the origin")?;
        Ok(())
    })
}

#[test]
fn lazy_clone_maps_a_golden_file_privately() -> Result<()> {
    require_fuse_and_qemu!();
    let s = Setup::new()?;
    s.run(|s| {
        let pattern = random_bytes(0x5eed_0002, RAM as usize);
        let golden = s.on_mount("golden.mem");
        write_pattern(&golden, &pattern)?;
        s.proxy.write_back()?;
        let origin_golden = s.at_origin("golden.mem");
        compare_file_with(&pattern, &origin_golden).context("the golden file at the origin")?;
        let mtime = fs::metadata(&origin_golden)?.modified()?;

        let mut vm = Vm::start(
            s.local.path(),
            &[
                "-object".into(),
                format!(
                    "memory-backend-file,id=mem,size=64M,mem-path={},share=off,readonly=on,rom=off",
                    golden.display()
                ),
                "-machine".into(),
                "pc,memory-backend=mem".into(),
            ],
        )?;
        ensure!(vm.status()? == "prelaunch", "QEMU did not start paused");
        check_probes(&mut vm, &pattern).context("the paused guest's RAM (share=off)")?;

        // The firmware writes its private copy of low memory.
        let scratch = s.local("low.bin");
        vm.run_firmware(|vm| low_memory_changed(vm, &pattern, &scratch))?;
        // The guest's RAM is its own copy: written below 1 MiB, the
        // golden pattern where the firmware did not write.
        let dump = vm.pmemsave(RAM, &s.local("pmemsave.bin"))?;
        ensure!(
            first_difference_below(&dump, &pattern, LOW).is_some(),
            "the guest's memory below 1 MiB is still the pattern after the firmware ran"
        );
        for addr in UNTOUCHED {
            let (a, b) = (addr as usize, addr as usize + 8);
            compare_bytes(&pattern[a..b], &dump[a..b])
                .with_context(|| format!("the running guest's memory at {addr:#x}"))?;
        }
        vm.quit()?;

        s.proxy.write_back()?;
        compare_file_with(&pattern, &origin_golden)
            .context("the golden file at the origin after the clone ran")?;
        ensure!(
            fs::metadata(&origin_golden)?.modified()? == mtime,
            "the golden file's mtime at the origin changed while the clone ran"
        );
        drop_caches();
        compare_file_with(&pattern, &golden)
            .context("the golden file through the mount after the clone ran")?;
        Ok(())
    })
}

#[test]
fn xp_output_is_parsed() {
    let text = "0000000001000000: 0x22 0x91 0xd8 0xcd 0xc3 0x10 0x41 0x1e\r\n";
    assert_eq!(
        parse_xp(text).expect("parses"),
        [0x22, 0x91, 0xd8, 0xcd, 0xc3, 0x10, 0x41, 0x1e]
    );
    assert!(parse_xp("0000000001000000: 0xzz\r\n").is_err());
    assert!(parse_xp("no colon").is_err());
}
