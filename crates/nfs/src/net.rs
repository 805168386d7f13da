//! The tokio side of the protocol core: RPC records read and written on
//! sockets ([`stream`]) and the RPC client that keeps many calls in flight
//! on one connection ([`client`]), measuring the link as it goes
//! ([`estimate`]). Everything else in this crate is
//! sans-IO (plain functions and types over bytes), and builds without this
//! module (`--no-default-features`), as quinn-proto does without quinn.

pub mod client;
pub mod estimate;
pub mod stream;
