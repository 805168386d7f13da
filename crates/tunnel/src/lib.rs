//! Mutually authenticated TLS 1.3 between gvfs proxies (docs/ARCHITECTURE.md, "Between
//! proxies").
//!
//! A site runs its own small certificate authority ([`pki`]): every proxy
//! holds a node certificate signed by it, usable both to serve and to connect,
//! because a middle proxy is both. [`tls`] turns the PEM files into rustls
//! configurations (TLS 1.3 only, the ring provider, client certificates
//! required between proxies), runs the server handshake with a timeout and
//! implements `gvfs_nfs::net::client::Connector` for `gvfs://` upstreams, telling
//! a refusal (a certificate rejected on either side: [`refusal`]) from a
//! fault worth retrying.
//! [`identity`] maps the name in a verified peer certificate to the
//! credentials the upstream sees, like GVFS's logical user accounts.

#![warn(missing_docs)]

pub mod error;
pub mod identity;
pub mod pki;
mod read;
pub mod refusal;
pub mod tls;

pub use error::{MappingError, TunnelError};
pub use identity::{IdentityMap, Mapping};
pub use tls::{AcceptError, TlsConnector, TlsFiles, TlsIdentity, accept, peer_name};
