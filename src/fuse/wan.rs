//! nfs-ganesha behind a WAN link that tests cut and restore, for reads
//! through a FUSE mount that must wait out an outage (or a proxy's
//! restart), and reads on threads of their own.

use std::fs::{self, File};
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::WanLinkProcess;
use crate::Ganesha;
use crate::data::random_bytes;

/// The size of the files read through an outage (small: one or two READs).
pub const SMALL: usize = 100_003;

/// nfs-ganesha behind two `gvfs-wanlink` processes, one relaying its NFS
/// port and one its MOUNT port, cut and restored together as one WAN link.
pub struct Wan {
    nfs: WanLinkProcess,
    mount: WanLinkProcess,
    /// The server.
    pub g: Ganesha,
}

impl Wan {
    /// nfs-ganesha and its two links.
    pub fn start() -> Result<Self> {
        let g = Ganesha::start()?;
        let nfs = WanLinkProcess::start(g.nfs_addr())?;
        let mount = WanLinkProcess::start(SocketAddr::new(g.ip(), g.mount_port()))?;
        Ok(Self { nfs, mount, g })
    }

    /// The `--upstream` URL that reaches ganesha through the links.
    pub fn upstream_url(&self) -> String {
        format!(
            "nfs://127.0.0.1:{}{}?mountport={}",
            self.nfs.addr().port(),
            crate::ganesha::EXPORT,
            self.mount.addr().port()
        )
    }

    /// Places `name` with `SMALL` bytes of seed `seed` at the origin.
    pub fn place(&self, name: &str, seed: u64) -> Result<Vec<u8>> {
        let bytes = random_bytes(seed, SMALL);
        fs::write(self.g.export_dir().join(name), &bytes)?;
        Ok(bytes)
    }

    /// Cuts both links (`reset` or `blackhole`).
    pub fn cut(&mut self, mode: &str) -> Result<()> {
        self.nfs.cut(mode)?;
        self.mount.cut(mode)
    }

    /// Restores both links.
    pub fn restore(&mut self) -> Result<()> {
        self.nfs.restore()?;
        self.mount.restore()
    }

    /// Bytes ganesha has sent back through the NFS link so far.
    pub fn down_bytes(&mut self) -> Result<u64> {
        Ok(self.nfs.stats()?.get("down").copied().unwrap_or(0))
    }
}

/// What a read on a thread came to.
pub type ReadResult = std::io::Result<Vec<u8>>;

/// Reads the open file `f` to its end on a thread of its own, with plain
/// read(2) calls only (no stat, no open: every call the kernel makes is a
/// READ); the bytes or the error arrive on the receiver.
pub fn read_on_a_thread(mut f: File, len: usize) -> mpsc::Receiver<ReadResult> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = vec![0u8; len + 1];
        let mut n = 0;
        let r = loop {
            match f.read(&mut buf[n..]) {
                Ok(0) => break Ok(()),
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        buf.truncate(n);
        let _ = tx.send(r.map(|()| buf));
    });
    rx
}

/// `path` read whole (open and read) on a thread, within `within`.
pub fn read_within(path: &Path, within: Duration) -> Result<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    thread::spawn(move || {
        let _ = tx.send(fs::read(p));
    });
    match rx.recv_timeout(within) {
        Ok(r) => r.with_context(|| format!("reading {}", path.display())),
        Err(_) => bail!("reading {} took more than {within:?}", path.display()),
    }
}

/// What a read came to, for messages.
pub fn outcome(r: &ReadResult) -> String {
    match r {
        Ok(b) => format!("{} bytes", b.len()),
        Err(e) => format!("{e} (errno {:?})", e.raw_os_error()),
    }
}
