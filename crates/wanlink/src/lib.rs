//! A WAN link emulator for machines without `tc netem`: a TCP relay that
//! gives the connections through it a one-way delay and a bandwidth limit
//! per direction, and can cut the link (reset or blackhole) and restore it.
//! All connections through one link share its bandwidth, as flows across one
//! WAN link do: eight clients at once each get an eighth of it.
//!
//! Each chunk read from one side is delivered to the other no earlier than
//! its arrival plus the one-way delay, after queueing behind earlier chunks
//! (of any connection) for its serialisation time at the configured rate:
//! `delivery = max(arrival, link_free) + bytes * 8 / rate + delay`.
//! Bytes read but not yet delivered are capped per direction (about twice
//! the bandwidth-delay product), so a fast sender is back-pressured through
//! TCP and memory stays bounded. Delivery times are kept by a dedicated
//! timer thread, because tokio's millisecond timer would add about 1 ms to
//! every one-way delay.
//!
//! ```no_run
//! # async fn demo() -> gvfs_wanlink::Result<()> {
//! use std::time::Duration;
//! use gvfs_wanlink::{LinkConfig, WanLink};
//!
//! let config = LinkConfig::from_rtt(Duration::from_millis(40), Some(50_000_000));
//! let link = WanLink::start(
//!     "127.0.0.1:0".parse().expect("address"),
//!     "127.0.0.1:2049".parse().expect("address"),
//!     config,
//! )
//! .await?;
//! // Point the client at link.local_addr(); later:
//! link.cut();
//! link.restore();
//! link.shutdown().await;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod clock;
mod config;
pub mod control;
mod error;
mod link;
mod pipe;
mod state;
mod timer;

pub use config::{CutMode, DirectionConfig, LinkConfig};
pub use error::{Error, Result};
pub use link::{LinkStats, WanLink};
