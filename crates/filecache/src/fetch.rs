//! Fetching a whole file into the cache: started on first use (making room
//! first), chunk by chunk through the extension program (FETCH: compressed
//! chunks and repeat runs), with readers waiting for the chunks they need.
//!
//! Where each part is:
//! - `state.rs`: the state of one file's fetch ([`FetchState`]): which
//!   chunks and pieces are here or claimed, what the atomics that steer
//!   the background stream mean, and who signals its watch channel. Read
//!   it first: the rest follows its rules.
//! - `stream.rs`: the entry made (`FileCache::start`) and the background
//!   stream (`fetch_all`): a profile's pieces first ([`PROFILE_WINDOW`]),
//!   then every chunk in file order ([`WINDOW`], [`UNDER_DEMAND`] while
//!   readers fetch their own), going on from a reader's latest fault.
//! - `wait.rs`: a reader waiting for its bytes (`ensure`), fetching the
//!   pieces it needs itself, and a range's repeats waiting for their
//!   sources (`wait_for`).
//! - `rest.rs`: the rest of a chunk that pieces of were fetched.
//! - `range.rs`: one range fetched, checked and written (every fetch above
//!   comes down to it), with held blocks copied instead (`dedup/`), and
//!   recorded in the file's progress log.
//! - `kept.rs`: a partly fetched file kept across a restart: kept dormant
//!   at open, resumed by the next fetch, its kept pieces checked before
//!   they are served.
//!
//! [`FetchState`]: state::FetchState

pub(crate) mod kept;
mod range;
pub(crate) mod rest;
pub(crate) mod state;
mod stream;
mod wait;

pub use stream::{PROFILE_BYTES, PROFILE_WINDOW, UNDER_DEMAND, WINDOW};
