//! [`Ready`]: what a started proxy tells its caller (and `gvfsctl status`
//! repeats).

use std::net::SocketAddr;
use std::path::PathBuf;

/// What a started proxy tells its caller.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The NFS listener's address, unless `--listen none`.
    pub addr: Option<SocketAddr>,
    /// The export clients mount.
    pub export: String,
    /// The control socket.
    pub control: PathBuf,
    /// What is served, for humans.
    pub upstream: String,
    /// The block cache's directory, when there is one.
    pub cache: Option<String>,
    /// The TLS listener for gvfs:// peers, when there is one.
    pub tls_addr: Option<SocketAddr>,
    /// This node's certificate name, when TLS is configured.
    pub tls_name: Option<String>,
    /// The FUSE mount, when there is one.
    pub mount: Option<PathBuf>,
}
