//! The FUSE front end (`gvfs-proxy --mount DIR`) in tests: mount points
//! that clean up after themselves, mount-table checks, and child processes
//! that call the file system as another user.
//!
//! A proxy started with `--mount DIR` mounts its export at DIR (through
//! `/dev/fuse`, as root directly or through `fusermount3`) before it prints
//! `listening on ADDR`, so [`Proxy::spawn`](crate::Proxy::spawn) returning
//! means the mount is live; SIGTERM unmounts it. A proxy killed with
//! SIGKILL leaves a dead mount behind (every call on it fails with
//! `ENOTCONN`) until `fusermount3 -u DIR` clears it: [`MountPoint`]'s
//! `Drop` does that, so a failed test leaves no mount behind.
//!
//! [`mounted`] starts a proxy with its mount and checks it is a live FUSE
//! mount; [`require_fuse!`](crate::require_fuse) skips a test on a machine
//! without FUSE. [`Mapping`] maps a file on the mount as a VM maps its
//! memory; [`errno_of`] and [`errno_name`] compare and word failed calls.
//!
//! For the mount's upstream going away, [`WanLinkProcess`] runs the
//! `gvfs-wanlink` binary and cuts and restores it through its stdin;
//! [`listening_tcp_ports`] tells which TCP ports a process listens on.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::process;
use crate::proxy::{Proxy, ProxyArgs, proxy_binary};

pub mod wan;

/// `f_type` of a FUSE file system in `statfs(2)` (`FUSE_SUPER_MAGIC`).
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// How long `fusermount3` or `umount` may take when a [`MountPoint`]
/// unmounts.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one program run on a mount (`dd`, `qemu-img`, `qemu-io`,
/// `setpriv`, `fusermount3 -u`) may take in a test.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Returns from the test (passing) with a message when FUSE is missing
/// (see [`unavailable`]); for `#[test]` functions returning
/// `anyhow::Result<()>`.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = $crate::fuse::unavailable() {
            eprintln!("skipping: {why}");
            return Ok(());
        }
    };
}

/// Starts a proxy with `args` and `--mount` on `mnt`; fails unless the
/// mount is a live FUSE mount by the time the proxy says it listens.
pub fn mounted(args: ProxyArgs, mnt: &MountPoint) -> Result<Proxy> {
    let p = Proxy::spawn(args.mount(mnt.path()))?;
    ensure!(
        mnt.is_mounted()?,
        "{} is not a mount point after the proxy printed `listening on`; output:\n{}",
        mnt.path().display(),
        p.output()
    );
    let ty = fs_type(mnt.path())?;
    ensure!(
        ty == FUSE_SUPER_MAGIC,
        "{} is mounted with f_type {ty:#x}, not FUSE's",
        mnt.path().display()
    );
    Ok(p)
}

/// The errno of an I/O result, or `None` when it succeeded.
pub fn errno_of<T>(r: &std::io::Result<T>) -> Option<i32> {
    r.as_ref().err().map(|e| e.raw_os_error().unwrap_or(-1))
}

/// An errno as the C library words it (`None`: "success"), for messages.
pub fn errno_name(e: Option<i32>) -> String {
    match e {
        None => "success".into(),
        Some(e) => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

/// Why FUSE cannot be used on this machine (`/dev/fuse` or `fusermount3`
/// missing), or `None` when it can. Tests skip only for these reasons.
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
    }
    if which("fusermount3").is_none() {
        return Some("fusermount3 is not installed (apt-get install fuse3)".into());
    }
    None
}

/// The first `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// An empty directory to mount on, inside a temporary directory of its
/// own. Dropping it unmounts whatever is still mounted there (lazily,
/// `fusermount3 -u -z`, then `umount -l`), then removes the directories.
#[derive(Debug)]
pub struct MountPoint {
    path: PathBuf,
    // Removed after the unmount in `Drop::drop`.
    _parent: tempfile::TempDir,
}

impl MountPoint {
    /// A new empty directory `mnt` in a new temporary directory.
    pub fn new() -> Result<Self> {
        let parent = tempfile::Builder::new()
            .prefix("gvfs-fuse-")
            .tempdir()
            .context("creating a temporary directory for a mount point")?;
        // The path as the kernel will write it in the mount table.
        let base = parent
            .path()
            .canonicalize()
            .context("resolving the temporary directory")?;
        // Other users (the credential tests' children) must reach it.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755))
            .context("opening the temporary directory to other users")?;
        let path = base.join("mnt");
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            _parent: parent,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether something is mounted on it now.
    pub fn is_mounted(&self) -> Result<bool> {
        is_mounted(&self.path)
    }

    /// Unmounts it with `fusermount3 -u` (not lazily); fails if that fails.
    pub fn unmount(&self) -> Result<()> {
        process::run_ok(
            Command::new("fusermount3").arg("-u").arg(&self.path),
            UNMOUNT_TIMEOUT,
        )?;
        Ok(())
    }
}

impl Drop for MountPoint {
    fn drop(&mut self) {
        if !is_mounted(&self.path).unwrap_or(true) {
            return;
        }
        // A mount a test left behind may be one whose keeper holds its
        // connection with nobody serving it (the test failed between a
        // proxy's end and the next start): its requests would wait for
        // ever, and so would this process's exit. Ended first.
        abort_connection(&self.path);
        let _ = process::run(
            Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.path),
            UNMOUNT_TIMEOUT,
        );
        if is_mounted(&self.path).unwrap_or(true) {
            let _ = process::run(
                Command::new("umount").arg("-l").arg(&self.path),
                UNMOUNT_TIMEOUT,
            );
        }
    }
}

/// Ends the FUSE connection of the mount at `path` (`abort` in the
/// kernel's fusectl file system, mounted at `/sys/fs/fuse/connections`
/// if it is not): every request waiting on it fails, and whatever holds
/// its connection sees it end. Root only; a no-op elsewhere.
pub fn abort_connection(path: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let want = path.as_os_str().as_bytes();
    let minor = table.lines().rev().find_map(|line| {
        let mut f = line.split(' ');
        let dev = f.nth(2)?;
        let at = f.nth(1)?;
        (unescape_mount_path(at) == want)
            .then(|| dev.split_once(':').map(|(_, m)| m.to_string()))?
    });
    let Some(minor) = minor else {
        return;
    };
    let conn = Path::new("/sys/fs/fuse/connections");
    if !conn.join(&minor).exists() {
        let _ = process::run(
            Command::new("mount")
                .args(["-t", "fusectl", "fusectl"])
                .arg(conn),
            UNMOUNT_TIMEOUT,
        );
    }
    let _ = std::fs::write(conn.join(&minor).join("abort"), b"1");
}

/// Whether `path` (absolute, symbolic links resolved) is a mount point in
/// this process's mount table (`/proc/self/mountinfo`).
pub fn is_mounted(path: &Path) -> Result<bool> {
    let table =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let want = path.as_os_str().as_bytes();
    Ok(table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape_mount_path(point) == want))
}

/// A mount table path with its octal escapes (`\040` for a space, `\011`,
/// `\012`, `\134`) decoded.
fn unescape_mount_path(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// A memory mapping of a file, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    /// `mmap(NULL, len, prot, flags, f, 0)`.
    pub fn new(f: &File, len: usize, prot: i32, flags: i32) -> Result<Self> {
        // SAFETY: a new mapping of an open descriptor; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, f.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        Ok(Self { ptr, len })
    }

    /// Copies `bytes` to the start of the mapping (as many as fit); the
    /// mapping must be writable (`PROT_WRITE`).
    pub fn write(&self, bytes: &[u8]) {
        let n = bytes.len().min(self.len);
        // SAFETY: the mapping is writable and at least `n` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.cast::<u8>(), n) };
    }

    /// A copy of the whole mapping.
    pub fn read(&self) -> Vec<u8> {
        // SAFETY: the mapping is readable and `len` bytes long.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }.to_vec()
    }

    /// `msync(MS_SYNC)` of the whole mapping.
    pub fn msync(&self) -> Result<()> {
        // SAFETY: the whole mapping.
        let rc = unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("msync");
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// `statfs(2)` of `path`: its `f_type`.
pub fn fs_type(path: &Path) -> Result<i64> {
    let c = cstring(path)?;
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable
    // statfs the call fills.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// `statvfs(3)` of `path`.
pub fn statvfs(path: &Path) -> Result<libc::statvfs> {
    let c = cstring(path)?;
    // SAFETY: a zeroed statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable
    // statvfs the call fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    Ok(st)
}

/// `path` as a C string.
pub fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{} has a NUL byte", path.display()))
}

/// `sync`, then `echo 3 > /proc/sys/vm/drop_caches` (page cache, dentries
/// and inodes), so the next reads go to the file system. Failures (not
/// permitted in a container) are ignored.
pub fn drop_caches() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns the thread's errno slot, always
    // valid; reading it is async-signal-safe.
    unsafe { *libc::__errno_location() }
}

/// This process's umask (the `Umask:` line of `/proc/self/status`).
pub fn umask() -> Result<u32> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .context("no Umask: line in /proc/self/status")?;
    u32::from_str_radix(line.trim(), 8).context("parsing the umask")
}

/// Runs `child` in a forked copy of this process and returns the code it
/// returned (its exit status); the child is killed after `timeout`.
///
/// The test process has many threads: between `fork` and `_exit` the
/// child may only make raw system calls (through `libc`): no allocation,
/// no locks, no panics, no printing. Prepare paths and buffers before.
pub fn in_child(timeout: Duration, child: impl FnOnce() -> i32) -> Result<i32> {
    // SAFETY: fork(2); the child runs only `child`, which by this
    // function's contract makes only async-signal-safe calls, then _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        let code = child();
        // SAFETY: leaves the child at once, without running destructors
        // or atexit handlers of the parent's copy.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child, without blocking.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            if libc::WIFEXITED(status) {
                return Ok(libc::WEXITSTATUS(status));
            }
            bail!("the child process ended by signal (status {status:#x})");
        }
        if rc < 0 && errno() != libc::EINTR {
            return Err(std::io::Error::last_os_error()).context("waitpid");
        }
        if Instant::now() >= deadline {
            // SAFETY: our own child, not reaped yet.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            bail!("the child process did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// In a child of [`in_child`]: drops every supplementary group and makes
/// `uid`/`gid` the real, effective and saved ids. Returns 0, or the errno.
pub fn become_user(uid: u32, gid: u32) -> i32 {
    become_user_in(uid, gid, &[])
}

/// [`become_user`] with `groups` as the supplementary groups.
pub fn become_user_in(uid: u32, gid: u32, groups: &[u32]) -> i32 {
    // SAFETY: plain system calls; the group list is `groups`, valid for
    // its length.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return errno();
        }
    }
    0
}

/// In a child of [`in_child`] running as root: drops every supplementary
/// group and makes `uid`/`gid` the ids used for file system access only
/// (`setfsgid`, `setfsuid`), so that it can switch to another user later.
pub fn access_as(uid: u32, gid: u32) -> i32 {
    // SAFETY: plain system calls with no pointers but a null group list
    // of length 0.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return errno();
        }
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        // Both return the previous id: ask again to see the change took.
        if libc::setfsuid(uid) != uid as i32 || libc::setfsgid(gid) != gid as i32 {
            return libc::EPERM;
        }
    }
    0
}

/// Waits until `done` holds, polling, for at most `timeout`; returns
/// whether it did.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// TCP ports `pid` listens on: its sockets (`/proc/PID/fd`) that
/// `/proc/net/tcp` or `/proc/net/tcp6` list in state LISTEN.
pub fn listening_tcp_ports(pid: u32) -> Result<BTreeSet<u16>> {
    let mut inodes = BTreeSet::new();
    let fds = format!("/proc/{pid}/fd");
    for e in std::fs::read_dir(&fds).with_context(|| format!("listing {fds}"))? {
        // A descriptor closed while we list is no socket of interest.
        let Ok(target) = std::fs::read_link(e?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_owned());
        }
    }
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).with_context(|| format!("reading {table}"))?;
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&"0A"), Some(inode)) = (cols.get(1), cols.get(3), cols.get(9))
            else {
                continue;
            };
            if !inodes.contains(*inode) {
                continue;
            }
            let port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                .with_context(|| format!("a local address {local:?} in {table}"))?;
            ports.insert(port);
        }
    }
    Ok(ports)
}

/// How long `gvfs-wanlink` may take to start or to answer a command.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);

/// A `gvfs-wanlink` process (the binary beside `gvfs-proxy`) relaying a
/// free port of 127.0.0.1 to `target` with no delay, cut and restored
/// through its stdin as a script would (`cut reset`, `cut blackhole`,
/// `restore`, `stats`). Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct WanLinkProcess {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
    addr: SocketAddr,
}

impl WanLinkProcess {
    /// Starts it and waits for its `listening on ADDR` line.
    pub fn start(target: SocketAddr) -> Result<Self> {
        let bin = proxy_binary()?.with_file_name("gvfs-wanlink");
        ensure!(
            bin.is_file(),
            "{} does not exist: run `cargo build --workspace --bins` first",
            bin.display()
        );
        let mut child = Command::new(&bin)
            .args(["--listen", "127.0.0.1:0", "--target"])
            .arg(target.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("gvfs-wanlink has no stdin or stdout pipe");
        };
        let (tx, replies) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut link = Self {
            child,
            stdin,
            replies,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let first = link.reply()?;
        link.addr = first
            .strip_prefix("listening on ")
            .and_then(|a| a.trim().parse().ok())
            .with_context(|| format!("gvfs-wanlink's first line is {first:?}"))?;
        Ok(link)
    }

    /// Where clients connect to go through the link.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Pid of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command line and returns the line it answered.
    pub fn command(&mut self, line: &str) -> Result<String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .with_context(|| format!("sending `{line}` to gvfs-wanlink"))?;
        self.reply()
            .with_context(|| format!("the answer to `{line}`"))
    }

    /// `cut MODE` (`reset` or `blackhole`).
    pub fn cut(&mut self, mode: &str) -> Result<()> {
        let said = self.command(&format!("cut {mode}"))?;
        ensure!(
            said == "cut",
            "gvfs-wanlink answered `cut {mode}` with {said:?}"
        );
        Ok(())
    }

    /// `restore`.
    pub fn restore(&mut self) -> Result<()> {
        let said = self.command("restore")?;
        ensure!(
            said == "restored",
            "gvfs-wanlink answered `restore` with {said:?}"
        );
        Ok(())
    }

    /// `stats`: `stats up=N down=N accepted=N active=N reset=N` as a map.
    pub fn stats(&mut self) -> Result<std::collections::BTreeMap<String, u64>> {
        let said = self.command("stats")?;
        let rest = said
            .strip_prefix("stats ")
            .with_context(|| format!("gvfs-wanlink answered `stats` with {said:?}"))?;
        rest.split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').context("no = in a stats field")?;
                Ok((k.to_owned(), v.parse().context("a stats value")?))
            })
            .collect::<Result<_>>()
            .with_context(|| format!("parsing {said:?}"))
    }

    fn reply(&mut self) -> Result<String> {
        match self.replies.recv_timeout(LINK_TIMEOUT) {
            Ok(line) => Ok(line),
            Err(_) => {
                let status = self.child.try_wait().ok().flatten();
                bail!("gvfs-wanlink said nothing within {LINK_TIMEOUT:?} (exit status {status:?})")
            }
        }
    }
}

impl Drop for WanLinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/tmp/a\\040b"), b"/tmp/a b");
        assert_eq!(unescape_mount_path("/x\\134y\\011"), b"/x\\y\t");
        assert_eq!(unescape_mount_path("/plain\\"), b"/plain\\");
        assert!(is_mounted(Path::new("/")).expect("a mount table"));
        assert!(!is_mounted(Path::new("/proc/self")).expect("a mount table"));
    }

    #[test]
    fn a_child_reports_its_code() {
        assert_eq!(in_child(Duration::from_secs(10), || 7).expect("fork"), 7);
    }
}
