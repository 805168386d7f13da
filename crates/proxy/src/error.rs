//! [`ProxyError`]: why a proxy could not start, and the exit code each
//! cause maps to.

use std::net::SocketAddr;
use std::path::PathBuf;

use gvfs_nfs::ServiceError;

use crate::{control, exit};

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {cause}{hint}", hint = bind_hint(.cause))]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The `dir:` upstream could not be opened.
    #[error(transparent)]
    Dir(#[from] gvfs_upstream::dir::DirError),
    /// The sample directory could not be created.
    #[error("cannot create the sample directory {path}: {cause}")]
    Sample {
        /// The directory.
        path: PathBuf,
        /// The cause (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The upstream did not answer or refused the export at start-up.
    #[error("upstream check failed: {0}")]
    Upstream(ServiceError),
    /// The control socket could not be set up.
    #[error(transparent)]
    Control(#[from] control::ControlError),
    /// The block cache, or its file cache, could not be opened.
    #[error("cannot open the {what} in {dir}: {cause}")]
    Cache {
        /// "block cache" or "file cache".
        what: &'static str,
        /// Its directory.
        dir: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The TLS certificate, key or CA could not be used.
    #[error(transparent)]
    Tls(#[from] gvfs_tunnel::TunnelError),
    /// The FUSE mount could not be made (`--mount`).
    #[error(transparent)]
    Mount(#[from] gvfs_fuse::FuseError),
    /// A gvfs:// upstream was configured without the TLS files it needs.
    #[error("a gvfs:// upstream needs --cert, --key and --ca")]
    GvfsWithoutTls,
    /// `--take-over` could not replace the running proxy.
    #[error("--take-over: the proxy at {}: {reason}", control.display())]
    TakeOver {
        /// Its control socket.
        control: PathBuf,
        /// Why.
        reason: String,
    },
}

impl ProxyError {
    /// The code `gvfs-proxy` exits with for this error.
    pub fn exit_code(&self) -> exit::ExitCode {
        use exit::ExitCode;
        match self {
            Self::GvfsWithoutTls => ExitCode::Config,
            Self::Dir(_) => ExitCode::Upstream,
            Self::Upstream(ServiceError::UpstreamRefused { .. }) | Self::Tls(_) => ExitCode::Tls,
            Self::Upstream(ServiceError::Layer(_)) => ExitCode::LocalResource,
            Self::Upstream(_) => ExitCode::Upstream,
            Self::Bind { .. }
            | Self::Sample { .. }
            | Self::Control(_)
            | Self::Cache { .. }
            | Self::Mount(_)
            | Self::TakeOver { .. } => ExitCode::LocalResource,
            Self::Signals(_) => ExitCode::Failure,
        }
    }
}

fn bind_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => " (the port is in use; pick another with --listen)",
        std::io::ErrorKind::PermissionDenied => {
            " (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
        }
        std::io::ErrorKind::AddrNotAvailable => " (no such local address)",
        _ => "",
    }
}
