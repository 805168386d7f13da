//! The protocol core of gvfs.
//!
//! - [`class`]: a request's priority class and the tenant it is billed to.
//! - [`record`]: RPC record marking with caps enforced before allocation.
//! - [`rpc`]: ONC RPC call and reply headers, AUTH_UNIX credentials.
//! - [`proc`]: the 22 NFSv3 procedures as typed requests and replies.
//! - [`service`]: [`NfsService`], the interface every proxy layer implements.
//! - [`layer`]: the kit layers are built with ([`layer::Layer`], typed calls
//!   below, the write check, counters).
//! - [`portmap`]: the PORTMAP v2 messages gvfs speaks and asks.
//! - [`net`] (feature `net`, on by default): the tokio side, records on
//!   sockets and an async RPC client that keeps many calls in flight on one
//!   connection and survives reconnects.
//!
//! Everything but [`net`] is sans-IO: plain functions and types over bytes
//! (`cargo check -p gvfs-nfs --no-default-features` builds it without
//! tokio).

#![warn(missing_docs)]

pub mod class;
pub mod layer;
#[cfg(feature = "net")]
pub mod net;
pub mod portmap;
pub mod proc;
pub mod record;
pub mod rpc;
pub mod service;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod version;
pub mod xdr;

pub use class::{Class, Tenant};
pub use nfs3_types;
pub use proc::{NfsProc, NfsReply, NfsRequest};
pub use rpc::Credentials;
pub use service::{BoxFuture, CallContext, LayerFailure, NfsService, ServiceError};
pub use version::{FileVersion, same_version};
