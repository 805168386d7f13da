//! Fixtures for the tests of crates built on this one (feature
//! `test-util`): file attributes, and [`MemNfs`], an in-memory NFSv3
//! server to stack a layer on.

mod attrs;
mod mem;

pub use attrs::file_attrs;
pub use mem::{MemNfs, ROOT};
