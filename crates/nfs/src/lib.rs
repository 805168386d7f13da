//! The protocol core of gvfs.
//!
//! - [`record`]: RPC record marking with caps enforced before allocation.
//! - [`rpc`]: ONC RPC call and reply headers, AUTH_UNIX credentials.
//! - [`proc`]: the 22 NFSv3 procedures as typed requests and replies.
//! - [`service`]: [`NfsService`], the interface every proxy layer implements.
//! - [`layer`]: the kit layers are built with ([`layer::Layer`], typed calls
//!   below, the write check, counters).
//! - [`client`]: an async RPC client that keeps many calls in flight on one
//!   connection and survives reconnects.
//! - [`portmap`]: the PORTMAP v2 messages gvfs speaks and asks.
//!
//! Everything but [`client`] is sans-IO: plain functions over bytes.

#![warn(missing_docs)]

pub mod client;
pub mod layer;
pub mod portmap;
pub mod proc;
pub mod record;
pub mod rpc;
pub mod service;
pub mod stream;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod xdr;

pub use nfs3_types;
pub use proc::{NfsProc, NfsReply, NfsRequest};
pub use rpc::Credentials;
pub use service::{BoxFuture, CallContext, LayerFailure, NfsService, ServiceError};
