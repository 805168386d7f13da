//! Running the `gvfs-proxy` binary in tests.
//!
//! The binary belongs to another package of the workspace (crates/proxy),
//! so Cargo does not build it for this package's tests on its own: run
//! `cargo build --bins` first (the CI script does). It is looked up next to
//! the test executable's directory: `target/<profile>/gvfs-proxy` for a test
//! in `target/<profile>/deps/`.
//!
//! CLI driven here: `gvfs-proxy --listen ADDR --upstream URL [--export /NAME]
//! [--control PATH] [--allow-remote]`, where URL is `dir:PATH` or
//! `nfs://HOST[:PORT]/EXPORT[?mountport=N]`. Once it serves, the proxy prints
//! `listening on ADDR` (the bound socket address) on stdout; its output is
//! kept in a buffer ([`Proxy::output`]) for diagnostics.

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gvfs_proxy::status::Status;

use crate::libnfs::nfs_url;
use crate::process;
use crate::stats::Stats;

/// How long the proxy may take to print its `listening on` line.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SIGTERM gets before SIGKILL in [`Proxy::terminate`].
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The line prefix announcing the bound address.
const READY_PREFIX: &str = "listening on ";
/// The export name the proxy serves unless told otherwise.
pub const DEFAULT_EXPORT: &str = "/export";
/// Most bytes of proxy output kept for diagnostics (older output is cut).
const MAX_OUTPUT: usize = 1 << 20;

/// Arguments for [`Proxy::spawn`].
#[derive(Debug, Clone)]
pub struct ProxyArgs {
    /// `--listen`; default `127.0.0.1:0` (a free port).
    pub listen: SocketAddr,
    /// `--upstream`: `dir:PATH` or `nfs://HOST[:PORT]/EXPORT[?mountport=N]`.
    pub upstream: String,
    /// `--export`; `None` leaves the proxy's default (`/export`).
    pub export: Option<String>,
    /// `--control`: path of the control socket; `None` puts it in a
    /// temporary directory owned by the [`Proxy`].
    pub control: Option<PathBuf>,
    /// `--allow-remote`.
    pub allow_remote: bool,
    /// Further arguments, appended as given.
    pub extra: Vec<String>,
    /// Environment variables set for the proxy (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Another `gvfs-proxy` binary to run instead of the one built beside
    /// the tests (a benchmark comparing two builds).
    pub binary: Option<PathBuf>,
    /// Descriptors passed as systemd passes its file descriptor store
    /// back (fds 3 on, `LISTEN_FDS`, `LISTEN_FDNAMES`, `LISTEN_PID`),
    /// with their names.
    pub passed_fds: Vec<(String, Arc<OwnedFd>)>,
}

impl ProxyArgs {
    /// Arguments for a proxy in front of `upstream`, listening on a free
    /// port of 127.0.0.1.
    pub fn new(upstream: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            upstream: upstream.into(),
            export: None,
            control: None,
            allow_remote: false,
            extra: Vec::new(),
            env: Vec::new(),
            binary: None,
            passed_fds: Vec::new(),
        }
    }

    /// A proxy serving the local directory `dir` (`--upstream dir:PATH`).
    pub fn dir(dir: &Path) -> Self {
        Self::new(format!("dir:{}", dir.display()))
    }

    /// Listens on `addr` instead (e.g. `127.0.0.2:111` for QEMU).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serves the export under `name` (starting with `/`).
    pub fn export(mut self, name: impl Into<String>) -> Self {
        self.export = Some(name.into());
        self
    }

    /// Opens the control socket at `path`.
    pub fn control(mut self, path: impl Into<PathBuf>) -> Self {
        self.control = Some(path.into());
        self
    }

    /// Passes `--allow-remote`.
    pub fn allow_remote(mut self) -> Self {
        self.allow_remote = true;
        self
    }

    /// Runs the `gvfs-proxy` binary at `path` instead of the built one.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Appends a raw argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra.push(arg.into());
        self
    }

    /// `--cert --key --ca`: certificate `name` of the site CA in `ca`
    /// (made by [`Pki`](crate::site::Pki)).
    pub fn tls(self, ca: &Path, name: &str) -> Self {
        self.tls_files(
            &ca.join(format!("{name}.pem")),
            &ca.join(format!("{name}-key.pem")),
            &ca.join("ca.pem"),
        )
    }

    /// `--cert CERT --key KEY --ca CA`: this node's certificate and key
    /// (PEM), and the CA certificate peers' must chain to.
    pub fn tls_files(self, cert: &Path, key: &Path, ca: &Path) -> Self {
        self.flag("--cert", cert.display().to_string())
            .flag("--key", key.display().to_string())
            .flag("--ca", ca.display().to_string())
    }

    /// Appends `flag` and its `value`.
    fn flag(self, flag: &str, value: impl Into<String>) -> Self {
        self.arg(flag).arg(value)
    }

    /// `flag VALUE`, in place of the value an earlier `flag` was given
    /// (or added, if none was).
    pub fn set_flag(mut self, flag: &str, value: impl Into<String>) -> Self {
        match self.extra.iter().position(|a| a == flag) {
            Some(i) if i + 1 < self.extra.len() => {
                self.extra[i + 1] = value.into();
                self
            }
            _ => self.flag(flag, value),
        }
    }

    /// `--config PATH`: a TOML file of options.
    pub fn config(self, path: &Path) -> Self {
        self.flag("--config", path.display().to_string())
    }

    /// `--cache-dir DIR --cache-size SIZE`: a block cache of `size` (`64M`)
    /// in `dir`, and so a file cache in `DIR/files`; what most tests of a
    /// caching proxy start.
    pub fn cache(self, dir: &Path, size: &str) -> Self {
        self.cache_dir(dir).cache_size(size)
    }

    /// `--cache-dir DIR`: keep a block cache (and a file cache in
    /// `DIR/files`).
    pub fn cache_dir(self, dir: &Path) -> Self {
        self.flag("--cache-dir", dir.display().to_string())
    }

    /// `--cache-size SIZE`: the block cache's capacity (`64M`, `1G`).
    pub fn cache_size(self, size: &str) -> Self {
        self.flag("--cache-size", size)
    }

    /// `--cache-banks N`: bank files of the block cache.
    pub fn cache_banks(self, n: u32) -> Self {
        self.flag("--cache-banks", n.to_string())
    }

    /// `--cache-ways N`: the block cache's frames per set.
    pub fn cache_ways(self, n: u32) -> Self {
        self.flag("--cache-ways", n.to_string())
    }

    /// `--block-size SIZE`: the block cache's block (`4K` to `1M`).
    pub fn block_size(self, size: &str) -> Self {
        self.flag("--block-size", size)
    }

    /// `--write-policy POLICY`.
    pub fn write_policy(self, policy: WritePolicy) -> Self {
        self.flag("--write-policy", policy.as_str())
    }

    /// `--readahead N`: most blocks the block cache reads ahead (0: none).
    pub fn readahead(self, blocks: u32) -> Self {
        self.flag("--readahead", blocks.to_string())
    }

    /// `--no-writeback-on-exit`: SIGTERM leaves dirty data in the cache.
    pub fn no_writeback_on_exit(self) -> Self {
        self.arg("--no-writeback-on-exit")
    }

    /// `--meta`: use metadata files found upstream (without a cache dir or
    /// a TLS port, where it is not on by default).
    pub fn meta(self) -> Self {
        self.arg("--meta")
    }

    /// `--no-meta`: ignore metadata files.
    pub fn no_meta(self) -> Self {
        self.arg("--no-meta")
    }

    /// `--file-cache-size SIZE`: most bytes of whole files kept by
    /// compress-and-copy.
    pub fn file_cache_size(self, size: &str) -> Self {
        self.flag("--file-cache-size", size)
    }

    /// `--no-dedup`: fetch blocks that held images share instead of
    /// copying them.
    pub fn no_dedup(self) -> Self {
        self.arg("--no-dedup")
    }

    /// `--mount DIR`: mount the export at `dir` through FUSE too.
    pub fn mount(self, dir: &Path) -> Self {
        self.flag("--mount", dir.display().to_string())
    }

    /// `--mount-readahead SIZE`: the FUSE mount's read-ahead (`0`, `1M`).
    pub fn mount_readahead(self, size: &str) -> Self {
        self.flag("--mount-readahead", size)
    }

    /// `--upstream-timeout SECS`: give up on an upstream call after
    /// `secs` (0 waits forever).
    pub fn upstream_timeout(self, secs: u64) -> Self {
        self.flag("--upstream-timeout", secs.to_string())
    }

    /// `--connect-timeout SECS`: one upstream connection attempt.
    pub fn connect_timeout(self, secs: u64) -> Self {
        self.flag("--connect-timeout", secs.to_string())
    }

    /// `--attr-timeout SECS`: answer attribute calls from replies at most
    /// `secs` old.
    pub fn attr_timeout(self, secs: u64) -> Self {
        self.flag("--attr-timeout", secs.to_string())
    }

    /// `--listen-tls ADDR`: accept gvfs:// peers over TLS there.
    pub fn listen_tls(self, addr: SocketAddr) -> Self {
        self.flag("--listen-tls", addr.to_string())
    }

    /// `--map-peer NAME=MAPPING`: how calls from the peer whose
    /// certificate is `name` are mapped (`pass`, `squash`, ...).
    pub fn map_peer(self, name: &str, mapping: &str) -> Self {
        self.flag("--map-peer", format!("{name}={mapping}"))
    }

    /// `--max-connections N`: client connections served at once.
    pub fn max_connections(self, n: usize) -> Self {
        self.flag("--max-connections", n.to_string())
    }

    /// `--max-pending-connections N`: connections not yet through their
    /// first call at once.
    pub fn max_pending_connections(self, n: usize) -> Self {
        self.flag("--max-pending-connections", n.to_string())
    }

    /// `--buffer-memory SIZE`: most memory for call records and replies.
    pub fn buffer_memory(self, size: &str) -> Self {
        self.flag("--buffer-memory", size)
    }

    /// `--metrics ADDR`: serve Prometheus metrics there.
    pub fn metrics(self, addr: SocketAddr) -> Self {
        self.flag("--metrics", addr.to_string())
    }

    /// Sets an environment variable for the proxy.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Passes `fd` named `name` as systemd passes a descriptor from its
    /// store: fd 3 (then 4, ...) of the proxy, `LISTEN_FDS`,
    /// `LISTEN_FDNAMES`, and `LISTEN_PID` the proxy's own pid (set by a
    /// `sh` that then `exec`s it).
    pub fn pass_fd(mut self, name: impl Into<String>, fd: Arc<OwnedFd>) -> Self {
        self.passed_fds.push((name.into(), fd));
        self
    }

    /// The command line arguments (without the program).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--listen".to_owned(),
            self.listen.to_string(),
            "--upstream".to_owned(),
            self.upstream.clone(),
        ];
        if let Some(export) = &self.export {
            args.extend(["--export".to_owned(), export.clone()]);
        }
        if let Some(control) = &self.control {
            args.extend(["--control".to_owned(), control.display().to_string()]);
        }
        if self.allow_remote {
            args.push("--allow-remote".to_owned());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// The block cache's `--write-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePolicy {
    /// `write-back`: writes stay in the cache until written back.
    WriteBack,
    /// `write-through`: every write goes upstream before it is answered.
    WriteThrough,
}

impl WritePolicy {
    /// The option's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WriteBack => "write-back",
            Self::WriteThrough => "write-through",
        }
    }
}

/// A running `gvfs-proxy`; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proxy {
    child: Option<Child>,
    control: PathBuf,
    /// Holds the default control socket's directory until the proxy is gone
    /// (declared after `child`, but `Drop` kills the child first anyway).
    _control_dir: Option<tempfile::TempDir>,
    addr: SocketAddr,
    export: String,
    output: Arc<Mutex<String>>,
}

/// Path of the `gvfs-proxy` binary built by `cargo build --bins` for the
/// profile the current test runs in.
pub fn proxy_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test executable")?;
    // target/<profile>/deps/<test> -> target/<profile>/gvfs-proxy
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("test executable has no grandparent directory")?;
    let bin = dir.join("gvfs-proxy");
    if !bin.is_file() {
        bail!(
            "{} does not exist: run `cargo build --workspace --bins` (same profile and target dir) before the tests",
            bin.display()
        );
    }
    Ok(bin)
}

/// Path of the `gvfsctl` binary, next to `gvfs-proxy`.
pub fn gvfsctl_binary() -> Result<PathBuf> {
    let bin = proxy_binary()?.with_file_name("gvfsctl");
    if !bin.is_file() {
        bail!(
            "{} does not exist: run `cargo build --workspace --bins` first",
            bin.display()
        );
    }
    Ok(bin)
}

/// Arguments that start a proxy (on a port of its own) in front of an
/// nfs:// upstream nobody answers: a 127.0.0.1 port just closed, with a
/// 1 s connect timeout, so that the start-up check fails fast.
pub fn unreachable_upstream_args() -> Result<Vec<String>> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("nfs://127.0.0.1:{closed}/export?mountport={closed}");
    Ok([
        "--listen",
        "127.0.0.1:0",
        "--connect-timeout",
        "1",
        "--upstream",
        &url,
    ]
    .map(String::from)
    .to_vec())
}

/// Runs `gvfsctl --control SOCKET ARGS...` and returns its output.
pub fn gvfsctl(control: &Path, args: &[&str]) -> Result<process::Output> {
    let mut cmd = Command::new(gvfsctl_binary()?);
    cmd.arg("--control").arg(control).args(args);
    process::run(&mut cmd, Duration::from_secs(20))
}

/// Runs `gvfsctl ARGS...` for a command that needs no proxy (`ca`,
/// `meta`); fails unless it succeeds, and returns its standard output.
pub fn gvfsctl_local(args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(gvfsctl_binary()?);
    cmd.args(args);
    let out = process::run(&mut cmd, Duration::from_secs(120))?;
    if !out.status.success() {
        bail!("gvfsctl {args:?} failed: {}", out.stderr_text());
    }
    Ok(out.stdout_text())
}

/// Spawns `n` proxies in a chain in front of `upstream`, the arguments of
/// each made by `configure` (`|a| a` for none); the last one returned is
/// the one clients talk to.
pub fn chain(
    upstream: &str,
    n: usize,
    configure: impl Fn(ProxyArgs) -> ProxyArgs,
) -> Result<Vec<Proxy>> {
    let mut proxies: Vec<Proxy> = Vec::new();
    let mut up = upstream.to_string();
    for _ in 0..n {
        let p = Proxy::spawn(configure(ProxyArgs::new(up)))?;
        up = p.upstream_url();
        proxies.push(p);
    }
    Ok(proxies)
}

impl Proxy {
    /// The `--upstream` URL that points another proxy at this one.
    pub fn upstream_url(&self) -> String {
        self.upstream_url_at(self.addr())
    }

    /// The `--upstream` URL that reaches this proxy's export at `a` (a
    /// relay in front of it, such as a `gvfs_wanlink::WanLink`).
    pub fn upstream_url_at(&self, a: SocketAddr) -> String {
        format!(
            "nfs://{}:{}{}?mountport={}",
            a.ip(),
            a.port(),
            self.export(),
            a.port()
        )
    }

    /// Sends `sig` (e.g. `libc::SIGUSR1`) to the running proxy.
    pub fn signal(&self, sig: libc::c_int) -> Result<()> {
        let child = self.child.as_ref().context("the proxy is not running")?;
        process::signal(child, sig).context("signalling gvfs-proxy")
    }

    /// Everything `gvfsctl stats --json` reports, untyped: for a test
    /// that checks the JSON itself (tests/compat.rs); others read
    /// [`Proxy::stats`].
    pub fn stats_json(&self) -> Result<serde_json::Value> {
        let out = gvfsctl(self.control_path(), &["stats", "--json"])?;
        if !out.status.success() {
            bail!("gvfsctl stats failed: {}", out.stderr_text());
        }
        serde_json::from_str(&out.stdout_text()).context("parsing gvfsctl stats --json")
    }

    /// Everything `gvfsctl stats --json` reports, typed: every counter a
    /// field (see [`Stats`]).
    pub fn stats(&self) -> Result<Stats> {
        Stats::from_json(self.stats_json()?)
    }

    /// Waits until `done` holds of the proxy's [`Stats`], and returns the
    /// stats it saw then; fails after `timeout` with them, the proxy's
    /// output and `what` (the condition, in words).
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Stats) -> bool,
    ) -> Result<Stats> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let s = self.stats()?;
            if done(&s) {
                return Ok(s);
            }
            if std::time::Instant::now() >= deadline {
                bail!(
                    "{what}: not within {timeout:?}: {s}\noutput:\n{}",
                    self.output()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the file cache has completed `files` whole files
    /// (`file_cache.files_complete`), and returns the stats it saw then.
    pub fn wait_files_complete(&self, files: u64, timeout: Duration) -> Result<Stats> {
        self.wait_for(
            &format!("{files} files complete in the file cache"),
            timeout,
            |s| s.file_cache.counts.files_complete >= files,
        )
    }

    /// Runs `gvfsctl writeback --wait` and fails unless it succeeded.
    pub fn write_back(&self) -> Result<String> {
        let out = gvfsctl(self.control_path(), &["writeback", "--wait"])?;
        if !out.status.success() {
            bail!("gvfsctl writeback failed: {}", out.stderr_text());
        }
        Ok(out.stdout_text())
    }

    /// The proxy's status as `gvfsctl status --json` reports it, typed
    /// (the proxy's own [`Status`]).
    pub fn status(&self) -> Result<Status> {
        let out = gvfsctl(self.control_path(), &["status", "--json"])?;
        if !out.status.success() {
            bail!("gvfsctl status failed: {}", out.stderr_text());
        }
        serde_json::from_str(&out.stdout_text()).context("parsing gvfsctl status --json")
    }

    /// How many times the proxy ran NFS procedure `name` (e.g. "COMMIT").
    pub fn calls(&self, name: &str) -> Result<u64> {
        Ok(self.status()?.nfs_calls.get(name).copied().unwrap_or(0))
    }

    /// Starts the proxy and waits (10 s at most) for its `listening on` line.
    pub fn spawn(mut args: ProxyArgs) -> Result<Self> {
        let bin = match &args.binary {
            Some(b) => b.clone(),
            None => proxy_binary()?,
        };
        let control_dir = match args.control {
            Some(_) => None,
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("gvfs-proxy-")
                    .tempdir()
                    .context("creating the control socket's directory")?;
                args.control = Some(dir.path().join("control.sock"));
                Some(dir)
            }
        };
        let control = args.control.clone().unwrap_or_default();
        let mut cmd = if args.passed_fds.is_empty() {
            Command::new(&bin)
        } else {
            process::passing_fds(&bin, &args.passed_fds)
        };
        cmd.args(args.to_args())
            .envs(args.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let line = process::describe(&cmd);
        let mut child = cmd.spawn().with_context(|| format!("spawning `{line}`"))?;
        let output = Arc::new(Mutex::new(String::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            collect_lines(stdout, "", Arc::clone(&output), Some(ready_tx));
        }
        if let Some(stderr) = child.stderr.take() {
            collect_lines(stderr, "[stderr] ", Arc::clone(&output), None);
        }
        let mut proxy = Self {
            child: Some(child),
            control,
            _control_dir: control_dir,
            addr: args.listen,
            export: args.export.unwrap_or_else(|| DEFAULT_EXPORT.to_owned()),
            output,
        };
        match ready_rx.recv_timeout(READY_TIMEOUT) {
            Ok(Ok(addr)) => {
                proxy.addr = addr;
                Ok(proxy)
            }
            Ok(Err(bad)) => {
                proxy.kill();
                bail!(
                    "`{line}` printed an unparsable address in {bad:?}; output:\n{}",
                    proxy.output()
                )
            }
            Err(_) => {
                let status = proxy
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                proxy.kill();
                // Give the reader threads a moment to collect the last words.
                thread::sleep(Duration::from_millis(50));
                let why = match status {
                    Some(status) => format!("exited ({status})"),
                    None => format!("did not print `{READY_PREFIX}ADDR` within {READY_TIMEOUT:?}"),
                };
                bail!("`{line}` {why}; output:\n{}", proxy.output())
            }
        }
    }

    /// Waits at most `within` for it to exit by itself (`gvfsctl
    /// unmount`); its exit status.
    pub fn wait_exit(&mut self, within: Duration) -> Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            bail!("the proxy is not running");
        };
        match process::wait_timeout(child, within)? {
            Some(status) => {
                self.child = None;
                Ok(status)
            }
            None => bail!(
                "gvfs-proxy did not exit within {within:?}; output:\n{}",
                self.output()
            ),
        }
    }

    /// The address it listens on (as it reported it).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its IP address.
    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    /// Its port (NFS and MOUNT share it).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The export name it serves.
    pub fn export(&self) -> &str {
        &self.export
    }

    /// A libnfs URL for `path` in the export, with nfsport and mountport
    /// both set to the proxy's port.
    pub fn url(&self, path: &str) -> String {
        nfs_url(self.ip(), self.port(), self.port(), &self.export, path)
    }

    /// Path of its control socket (for `gvfsctl --control`).
    pub fn control_path(&self) -> &Path {
        &self.control
    }

    /// Pid of the running proxy, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the proxy printed so far (stderr lines prefixed
    /// `[stderr] `).
    pub fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Kills it with SIGKILL (a crash, as far as the proxy can tell) and
    /// reaps it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks it to shut down (SIGTERM) and waits for it to exit; SIGKILL
    /// after 10 s, reported as an error along with its output.
    pub fn terminate(&mut self) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("the proxy is not running");
        };
        let (status, killed) =
            process::terminate(&mut child, STOP_GRACE).context("stopping gvfs-proxy")?;
        if killed {
            bail!(
                "gvfs-proxy ignored SIGTERM for {STOP_GRACE:?} and was killed; output:\n{}",
                self.output()
            );
        }
        Ok(status)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Copies lines from `pipe` into `output` (capped at [`MAX_OUTPUT`]); the
/// first `listening on ADDR` line is sent to `ready` as soon as it is read.
fn collect_lines(
    pipe: impl Read + Send + 'static,
    prefix: &'static str,
    output: Arc<Mutex<String>>,
    mut ready: Option<mpsc::Sender<Result<SocketAddr, String>>>,
) {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if let Some(tx) = ready.take_if(|_| text.starts_with(READY_PREFIX)) {
                let _ = tx.send(parse_ready_line(text).ok_or_else(|| text.to_owned()));
            }
            if let Ok(mut out) = output.lock() {
                if out.len() > MAX_OUTPUT {
                    let cut = out.len() - MAX_OUTPUT / 2;
                    let cut = (cut..out.len())
                        .find(|&i| out.is_char_boundary(i))
                        .unwrap_or(out.len());
                    out.replace_range(..cut, "[...]\n");
                }
                out.push_str(prefix);
                out.push_str(text);
                out.push('\n');
            }
        }
    });
}

/// The address in a `listening on ADDR` line (trailing words ignored).
fn parse_ready_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix(READY_PREFIX)?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line() {
        assert_eq!(
            parse_ready_line("listening on 127.0.0.1:40213"),
            Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 40213)))
        );
        assert_eq!(
            parse_ready_line("listening on 127.0.0.2:111 (nfs, mount, portmap)"),
            Some(SocketAddr::from(([127, 0, 0, 2], 111)))
        );
        assert_eq!(parse_ready_line("listening on somewhere"), None);
    }

    #[test]
    fn args() {
        let a = ProxyArgs::dir(Path::new("/tmp/x"))
            .export("/vm")
            .control("/tmp/c.sock")
            .allow_remote()
            .to_args();
        assert_eq!(
            a,
            [
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "dir:/tmp/x",
                "--export",
                "/vm",
                "--control",
                "/tmp/c.sock",
                "--allow-remote"
            ]
        );
    }

    #[test]
    fn typed_options_spell_their_flags() {
        let a = ProxyArgs::dir(Path::new("/o"))
            .cache(Path::new("/c"), "64M")
            .cache_banks(2)
            .write_policy(WritePolicy::WriteThrough)
            .no_writeback_on_exit()
            .map_peer("node1", "pass")
            .upstream_timeout(3)
            .to_args();
        assert_eq!(
            a[4..],
            [
                "--cache-dir",
                "/c",
                "--cache-size",
                "64M",
                "--cache-banks",
                "2",
                "--write-policy",
                "write-through",
                "--no-writeback-on-exit",
                "--map-peer",
                "node1=pass",
                "--upstream-timeout",
                "3"
            ]
        );
    }
}
