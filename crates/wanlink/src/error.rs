//! The crate's one error type.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// What can go wrong starting or running a [`WanLink`](crate::WanLink).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// The bound listener could not report its address.
    #[error("cannot read the listener's local address")]
    LocalAddr(#[source] io::Error),
    /// The target refused or failed a relayed connection.
    #[error("cannot connect to target {target}")]
    ConnectTarget {
        /// The link's target.
        target: SocketAddr,
        /// Why connecting failed.
        #[source]
        source: io::Error,
    },
    /// The target did not accept a relayed connection in time.
    #[error("target {target} did not accept a connection within {timeout:?}")]
    ConnectTimeout {
        /// The link's target.
        target: SocketAddr,
        /// The configured connect timeout.
        timeout: Duration,
    },
    /// A control line named no known command.
    #[error("unknown control command {0:?} (expected cut [reset|blackhole], restore, stats, quit)")]
    UnknownCommand(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
