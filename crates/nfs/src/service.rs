//! The one procedure-level interface every gvfs layer implements.
//!
//! A proxy is a stack: front end -> metadata actions -> block cache ->
//! upstream. Each layer is an [`NfsService`] that holds the layer below it,
//! handles the procedures it cares about and forwards the rest, so a stack
//! is assembled in one place and any layer can be tested against a fake
//! below it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use nfs3_types::mount::mountstat3;
use nfs3_types::nfs3::{nfs_fh3, nfsstat3};

use crate::class::Tenant;
use crate::proc::{NfsProc, NfsReply, NfsRequest};
use crate::rpc::{Credentials, Reply, ReplyStatus};

/// A boxed, sendable future: what [`NfsService`] methods return, so a stack
/// can be built from `Arc<dyn NfsService>` at run time.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a layer knows about the call it is running.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The caller's credentials, as sent (or as mapped by a tunnel).
    pub cred: Credentials,
    /// Where the call came from, when it came over a socket.
    pub peer: Option<SocketAddr>,
    /// The caller's transaction id.
    pub xid: u32,
    /// Whom the call is billed to at a shared proxy (its peer's certificate
    /// name, else its connection); [`Tenant::LOCAL`] for the proxy's own
    /// calls.
    pub tenant: Tenant,
}

impl CallContext {
    /// A context with `cred` and nothing else, for internal calls and tests.
    pub fn with_cred(cred: Credentials) -> Self {
        Self {
            cred,
            ..Self::default()
        }
    }
}

/// Why a layer produced no NFS reply at all. Errors that NFS can express
/// travel inside [`NfsReply`] as an `nfsstat3`; these are the rest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The upstream could not be reached within the configured time.
    #[error("upstream {upstream} unavailable: {reason}")]
    UpstreamUnavailable {
        /// Which upstream.
        upstream: String,
        /// What went wrong last.
        reason: String,
    },
    /// The upstream refused us for good, or we refused it: a TLS handshake
    /// that failed on a certificate (either side's) or on a TLS alert.
    /// Retrying cannot help (see `net::client::ClientError::Refused`).
    #[error("TLS with upstream {upstream} failed for good: {reason}")]
    UpstreamRefused {
        /// Which upstream.
        upstream: String,
        /// Why, as the connector said.
        reason: String,
    },
    /// The upstream answered, but not with a usable reply.
    #[error("upstream {upstream} broke protocol: {reason}")]
    UpstreamProtocol {
        /// Which upstream.
        upstream: String,
        /// What was wrong with the reply.
        reason: String,
    },
    /// The upstream did not run the call: it answered with an RPC-level
    /// error (PROC_UNAVAIL, GARBAGE_ARGS, an auth error...), which the front
    /// end passes on to its own client unchanged.
    #[error("upstream {upstream} did not run the call: {status:?}")]
    UpstreamRejected {
        /// Which upstream.
        upstream: String,
        /// The RPC status it answered with.
        status: ReplyStatus,
    },
    /// The upstream's MOUNT service refused the export.
    #[error("upstream refused the mount: {0}")]
    MountRefused(MountStatus),
    /// A layer's own failure (its block store, its file cache, I/O on the
    /// proxy's own files), with that layer's typed error as the cause:
    /// made with [`ServiceError::layer`].
    #[error("local failure: {0}")]
    Layer(#[source] LayerFailure),
}

impl ServiceError {
    /// A layer's own failure, caused by `cause` (its own error type).
    pub fn layer(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Layer(LayerFailure::new(cause))
    }

    /// The cause of a [`Layer`](Self::Layer) failure, when it is an `E`.
    pub fn layer_cause<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Layer(e) => e.downcast_ref(),
            _ => None,
        }
    }
}

/// The typed cause of a [`ServiceError::Layer`]: whatever error type the
/// failing layer has (the block cache's, the file cache's, ...), shared, so
/// that one failure can be handed to every caller waiting on it.
///
/// It adds no words of its own: it displays as its cause, and its
/// `source` is its cause's `source`.
#[derive(Debug, Clone)]
pub struct LayerFailure(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl LayerFailure {
    /// Wraps `cause`.
    pub fn new(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(cause))
    }

    /// The cause, when it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Display for LayerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LayerFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Two layer failures are equal when they are the same failure (one shared
/// cause), as a failure handed to several waiters is.
impl PartialEq for LayerFailure {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LayerFailure {}

/// A `mountstat3` that is `Clone + Eq` and prints its RFC name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountStatus(pub u32);

impl std::fmt::Display for MountStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match mount_status_from_u32(self.0) {
            Some(s) => write!(f, "{s}"),
            None => write!(f, "mount status {}", self.0),
        }
    }
}

impl ServiceError {
    /// The NFS status a client sees for this error. This is the only place
    /// the front end turns a layer's failure into an `nfsstat3`.
    pub fn nfsstat(&self) -> nfsstat3 {
        match self {
            Self::UpstreamUnavailable { .. } | Self::UpstreamRefused { .. } | Self::Layer(_) => {
                nfsstat3::NFS3ERR_IO
            }
            Self::UpstreamProtocol { .. } | Self::UpstreamRejected { .. } => {
                nfsstat3::NFS3ERR_SERVERFAULT
            }
            Self::MountRefused(_) => nfsstat3::NFS3ERR_STALE,
        }
    }

    /// The MOUNT status a client sees for this error.
    pub fn mountstat(&self) -> mountstat3 {
        match self {
            Self::MountRefused(s) => {
                mount_status_from_u32(s.0).unwrap_or(mountstat3::MNT3ERR_SERVERFAULT)
            }
            Self::UpstreamUnavailable { .. } | Self::UpstreamRefused { .. } | Self::Layer(_) => {
                mountstat3::MNT3ERR_IO
            }
            Self::UpstreamProtocol { .. } | Self::UpstreamRejected { .. } => {
                mountstat3::MNT3ERR_SERVERFAULT
            }
        }
    }

    /// The RPC-level status to answer with instead of an NFS reply, when
    /// the upstream refused the call at the RPC level.
    pub fn rpc_status(&self) -> Option<ReplyStatus> {
        match self {
            Self::UpstreamRejected { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The reply a client sees for `p` when a layer failed with this error.
    pub fn to_reply(&self, p: NfsProc) -> NfsReply {
        NfsReply::error(p, self.nfsstat())
    }
}

fn mount_status_from_u32(v: u32) -> Option<mountstat3> {
    use mountstat3::*;
    Some(match v {
        0 => MNT3_OK,
        1 => MNT3ERR_PERM,
        2 => MNT3ERR_NOENT,
        5 => MNT3ERR_IO,
        13 => MNT3ERR_ACCES,
        20 => MNT3ERR_NOTDIR,
        22 => MNT3ERR_INVAL,
        63 => MNT3ERR_NAMETOOLONG,
        10004 => MNT3ERR_NOTSUPP,
        10006 => MNT3ERR_SERVERFAULT,
        _ => return None,
    })
}

/// One layer of a proxy: runs NFSv3 calls and hands out the root handle.
pub trait NfsService: Send + Sync + 'static {
    /// Runs one NFSv3 call on behalf of `cx`.
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>>;

    /// The file handle of the root of what this layer serves (what MOUNT's
    /// MNT hands the client).
    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>>;

    /// A one-line description for logs and `gvfsctl status`.
    fn describe(&self) -> String;

    /// Forwards a READ or WRITE in its XDR form and returns the XDR results
    /// untouched, sparing a pure forwarder two copies of the payload per hop.
    /// `None` (the default) means this layer must see the typed call: any
    /// layer that reads, caches or changes data keeps the default. The front
    /// end calls it only for READ and WRITE whose arguments passed
    /// [`proc::raw`](crate::proc::raw) checks, and the results returned must
    /// pass them too.
    fn forward_raw<'a>(
        &'a self,
        _cx: &'a CallContext,
        _proc: NfsProc,
        _args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        None
    }
}

impl<T: NfsService + ?Sized> NfsService for Arc<T> {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        (**self).call(cx, req)
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        (**self).root(cx)
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn forward_raw<'a>(
        &'a self,
        cx: &'a CallContext,
        proc_: NfsProc,
        args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        (**self).forward_raw(cx, proc_, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer's error type, as the block cache or the file cache has one.
    #[derive(Debug, thiserror::Error)]
    #[error("disk on fire")]
    struct Fire;

    #[test]
    fn a_layer_failure_names_its_typed_cause_and_is_an_io_error() {
        let e = ServiceError::layer(Fire);
        assert_eq!(e.to_string(), "local failure: disk on fire");
        assert!(e.layer_cause::<Fire>().is_some());
        assert!(e.layer_cause::<std::io::Error>().is_none());
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("disk on fire"));
        assert_eq!(e.nfsstat(), nfsstat3::NFS3ERR_IO);
        assert!(matches!(e.mountstat(), mountstat3::MNT3ERR_IO));
        assert_eq!(e.clone(), e, "a shared failure is equal to itself");
        assert_ne!(ServiceError::layer(Fire), e, "another failure is not");
    }
}
