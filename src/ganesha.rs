//! nfs-ganesha as a real NFSv3 server for tests.
//!
//! [`Ganesha::start`] runs `ganesha.nfsd` in the foreground on loopback with
//! the configuration from PEERS.md (NFSv3 only, TCP only, one VFS export at
//! `/export` with root squashing off and attribute caching off), on two free
//! ports of its own, in a private temporary directory. Several instances can
//! run at once. The process is stopped when the handle is dropped.
//!
//! What this machine needs for that (all handled here):
//! - a portmapper, or ganesha exits with "Cannot register NFS V3 on TCP":
//!   [`Portmapper::ensure`] provides one (ganesha registers over the unix
//!   socket `/var/run/rpcbind.sock`, see [`crate::portmap`]); being on port
//!   111 it needs root, which the tests run as;
//! - `-p PIDFILE`, since the default pid directory does not exist;
//! - nothing else: no `/var/run/ganesha`, no dbus (its CRIT lines about
//!   dbus are noise; kerberos is switched off in the config).
//!
//! Readiness is both ports accepting connections *and* the log saying
//! `NFS SERVER INITIALIZED`: ganesha listens before it registers with the
//! portmapper, and a client that asks the portmapper (QEMU) must not come
//! too early.
//!
//! Observed with ganesha 5.9 on this machine:
//! - start to ready takes 20-70 ms; SIGTERM to exit 10-50 ms, also with a
//!   client connected (PEERS.md measured ~1.6 s elsewhere; [`Ganesha::stop`]
//!   allows 3 s before SIGKILL);
//! - NFSv3 READDIR returns `.` and `..` along with the files (libnfs'
//!   `nfs-ls` hides them);
//! - a file below a subdirectory of the export is reachable by URL
//!   (`nfs://127.0.0.1/export/sub/f`);
//! - QEMU reaches it with a port-less `nfs://127.0.0.1/export/disk.qcow2`
//!   (`qemu-img create`, `info`, `convert` work), because QEMU asks the
//!   portmapper on 127.0.0.1:111 and ours answers with the most recently
//!   started live instance. With several instances running, QEMU gets the
//!   newest one: tests that rely on this must not start other instances
//!   meanwhile.
//! - Several instances at once work (own ports, own directories; they all
//!   register with the one portmapper).

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::libnfs::nfs_url;
use crate::portmap::Portmapper;
use crate::process;

/// The pseudo path of the export every instance serves.
pub const EXPORT: &str = "/export";
/// How long to wait for a started server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Attempts with fresh ports when a start fails (another process may take a
/// port between our probe and ganesha's bind).
const START_ATTEMPTS: usize = 3;
/// Lines of the ganesha log quoted in errors.
const LOG_TAIL_LINES: usize = 30;
/// The log line ganesha writes once it serves.
const READY_LINE: &str = "NFS SERVER INITIALIZED";

/// Whose calls the export squashes to the anonymous user (65534).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Squash {
    /// Nobody's (`No_Root_Squash`): the tests' usual export.
    #[default]
    Nobody,
    /// Root's (`Root_Squash`), as most servers do by default.
    Root,
}

/// A running nfs-ganesha serving one temporary directory over NFSv3.
#[derive(Debug)]
pub struct Ganesha {
    dir: tempfile::TempDir,
    export: PathBuf,
    nfs_port: u16,
    mount_port: u16,
    squash: Squash,
    child: Option<Child>,
}

impl Ganesha {
    /// Starts an instance on fresh loopback ports with an empty export.
    pub fn start() -> Result<Self> {
        Self::start_with(Squash::Nobody)
    }

    /// [`start`](Self::start), squashing as `squash` says.
    pub fn start_with(squash: Squash) -> Result<Self> {
        Portmapper::ensure().context("starting the portmapper ganesha registers with")?;
        let dir = tempfile::Builder::new()
            .prefix("gvfs-ganesha-")
            .tempdir()
            .context("creating ganesha's temporary directory")?;
        for sub in ["export", "recov"] {
            fs::create_dir(dir.path().join(sub)).with_context(|| format!("creating {sub}/"))?;
        }
        let export = dir.path().join("export");
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let (nfs_port, mount_port) = free_port_pair()?;
            match launch(dir.path(), nfs_port, mount_port, squash) {
                Ok(child) => {
                    return Ok(Self {
                        dir,
                        export,
                        nfs_port,
                        mount_port,
                        squash,
                        child: Some(child),
                    });
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("ganesha did not start")))
    }

    /// The local directory behind the export.
    pub fn export_dir(&self) -> &Path {
        &self.export
    }

    /// The instance's private directory (config, log, pid file, export/).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The address it serves on (always 127.0.0.1).
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    /// NFS program port (TCP).
    pub fn nfs_port(&self) -> u16 {
        self.nfs_port
    }

    /// MOUNT program port (TCP).
    pub fn mount_port(&self) -> u16 {
        self.mount_port
    }

    /// The NFS address as a socket address.
    pub fn nfs_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip(), self.nfs_port)
    }

    /// A libnfs URL for `path` (relative to the export; `""` for its root),
    /// with both ports explicit so no portmapper is asked:
    /// `nfs://127.0.0.1/export/PATH?version=3&nfsport=N&mountport=M`.
    pub fn url(&self, path: &str) -> String {
        nfs_url(self.ip(), self.nfs_port, self.mount_port, EXPORT, path)
    }

    /// The `--upstream` argument that points gvfs-proxy at this server:
    /// `nfs://127.0.0.1:NFSPORT/export?mountport=M`.
    pub fn upstream_url(&self) -> String {
        format!(
            "nfs://{}:{}{EXPORT}?mountport={}",
            self.ip(),
            self.nfs_port,
            self.mount_port
        )
    }

    /// Pid of the running server, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The whole ganesha log so far.
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }

    /// Stops the server (SIGTERM, then SIGKILL after 3 s). Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            process::terminate(&mut child, STOP_GRACE).context("stopping ganesha")?;
        }
        Ok(())
    }

    /// Stops the server and starts it again on the same ports, serving the
    /// same directory (for restart tests).
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.child = Some(launch(
            self.dir.path(),
            self.nfs_port,
            self.mount_port,
            self.squash,
        )?);
        Ok(())
    }
}

fn read_log(root: &Path) -> String {
    fs::read_to_string(root.join("ganesha.log")).unwrap_or_default()
}

/// The last lines of the log, for error messages.
fn log_tail(root: &Path) -> String {
    let log = read_log(root);
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

fn write_config(root: &Path, nfs_port: u16, mount_port: u16, squash: Squash) -> Result<PathBuf> {
    let conf = root.join("ganesha.conf");
    let squash = match squash {
        Squash::Nobody => "No_Root_Squash",
        Squash::Root => "Root_Squash",
    };
    let text = format!(
        r#"# Written by gvfs_testbed::ganesha for a test.
NFS_CORE_PARAM {{
  Protocols = 3;
  NFS_Port = {nfs_port};
  MNT_Port = {mount_port};
  Bind_addr = 127.0.0.1;
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  mount_path_pseudo = true;
}}
NFS_KRB5 {{ Active_krb5 = false; }}
NFSV4 {{ Graceless = true; Grace_Period = 0; RecoveryRoot = {recov}; }}
EXPORT {{
  Export_Id = 1;
  Path = {export};
  Pseudo = {EXPORT};
  Protocols = 3;
  Transports = TCP;
  Access_Type = RW;
  Squash = {squash};
  SecType = sys;
  Attr_Expiration_Time = 0;
  FSAL {{ Name = VFS; }}
}}
"#,
        recov = root.join("recov").display(),
        export = root.join("export").display(),
    );
    let mut f = fs::File::create(&conf).context("writing ganesha.conf")?;
    f.write_all(text.as_bytes())
        .context("writing ganesha.conf")?;
    Ok(conf)
}

/// Runs ganesha.nfsd for the instance in `root` and waits until it serves.
fn launch(root: &Path, nfs_port: u16, mount_port: u16, squash: Squash) -> Result<Child> {
    let conf = write_config(root, nfs_port, mount_port, squash)?;
    // A fresh log per launch, so readiness is judged on this run's lines.
    let log = root.join("ganesha.log");
    if log.exists() {
        let old = root.join("ganesha.log.old");
        fs::rename(&log, &old).context("rotating ganesha.log")?;
    }
    let mut child = Command::new("ganesha.nfsd")
        .arg("-F")
        .arg("-f")
        .arg(&conf)
        .arg("-L")
        .arg(&log)
        .arg("-p")
        .arg(root.join("ganesha.pid"))
        .args(["-N", "NIV_EVENT"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning ganesha.nfsd (apt-get install nfs-ganesha nfs-ganesha-vfs)")?;
    match wait_ready(&mut child, root, [nfs_port, mount_port]) {
        Ok(()) => Ok(child),
        Err(e) => {
            let _ = process::terminate(&mut child, STOP_GRACE);
            Err(e.context(format!(
                "ganesha (nfs port {nfs_port}, mount port {mount_port}) did not start; log tail:\n{}",
                log_tail(root)
            )))
        }
    }
}

fn wait_ready(child: &mut Child, root: &Path, ports: [u16; 2]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().context("polling ganesha")? {
            bail!("ganesha.nfsd exited early ({status})");
        }
        let listening = ports.iter().all(|&p| {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, p));
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
        // Ganesha listens before it registers with the portmapper; this
        // line comes once registration is done.
        if listening && read_log(root).contains(READY_LINE) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {START_TIMEOUT:?}");
        }
        thread::sleep(process::POLL);
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Two distinct free TCP ports on 127.0.0.1 (free when probed; ganesha binds
/// them a moment later, and a start that loses the race is retried).
fn free_port_pair() -> Result<(u16, u16)> {
    let a = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("probing a free port")?;
    let b = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("probing a free port")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}
