//! [`Lifecycle`]: what a stack asks of its layers besides calls. A
//! write-back job, the write-back on exit and the close at exit walk the
//! stack's layers through this trait, so they name no layer type:
//!
//! - [`Lifecycle::write_back`]: send what the layer holds for the layers
//!   below (dirty blocks, files held whole with local writes) down, or
//!   `None` when it never holds writes;
//! - [`Lifecycle::invalidate`]: forget answers kept from earlier replies,
//!   after a write-back changed files below without a call through it;
//! - [`Lifecycle::close`]: make what it keeps durable at exit;
//! - [`Lifecycle::backlog`]: the numbers write-back and exit go by (what is
//!   left to write back, what has been).
//!
//! Each layer keeps its own typed counters for `gvfsctl stats` besides.

use crate::service::{BoxFuture, ServiceError};

/// What a write-back job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBackKind {
    /// Write dirty data below, keep it cached.
    WriteBack,
    /// Write back, then drop cached data.
    Flush,
}

/// Called with `(bytes_done, bytes_total)` as a write-back goes.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// What a write-back sent below as blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteBackReport {
    /// Dirty blocks written and marked clean.
    pub blocks: u64,
    /// Bytes written upstream (including rewrites).
    pub bytes: u64,
    /// Files written.
    pub files: u64,
    /// Times a file's data was resent because upstream's write verifier
    /// changed between its WRITEs and COMMIT.
    pub rewrites: u64,
}

impl std::ops::AddAssign for WriteBackReport {
    fn add_assign(&mut self, other: Self) {
        self.blocks += other.blocks;
        self.bytes += other.bytes;
        self.files += other.files;
        self.rewrites += other.rewrites;
    }
}

/// What a layer holds for the layers below, and what it has sent them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Bytes of dirty blocks held.
    pub dirty_bytes: u64,
    /// Files held whole with writes not yet sent below.
    pub dirty_files: u64,
    /// Bytes of files held whole written back since start.
    pub file_bytes_written_back: u64,
}

impl Backlog {
    /// Whether anything waits to be written back.
    pub fn is_dirty(&self) -> bool {
        self.dirty_bytes > 0 || self.dirty_files > 0
    }
}

impl std::ops::AddAssign for Backlog {
    fn add_assign(&mut self, other: Self) {
        self.dirty_bytes += other.dirty_bytes;
        self.dirty_files += other.dirty_files;
        self.file_bytes_written_back += other.file_bytes_written_back;
    }
}

/// A layer's part in write-back and exit. Every method has a default that
/// does nothing, so a layer implements only what it has.
pub trait Lifecycle: Send + Sync {
    /// The layer in a few words, for logs ("block cache").
    fn name(&self) -> &'static str;

    /// Sends what the layer holds for the layers below down: `None` when
    /// it never holds writes (the default).
    fn write_back<'a>(
        &'a self,
        _kind: WriteBackKind,
        _progress: Progress<'a>,
    ) -> Option<BoxFuture<'a, Result<WriteBackReport, ServiceError>>> {
        None
    }

    /// Forgets answers kept from earlier replies.
    fn invalidate(&self) {}

    /// Makes what the layer keeps durable; afterwards it may refuse calls.
    fn close(&self) -> Result<(), ServiceError> {
        Ok(())
    }

    /// What is left to write back and what has been.
    fn backlog(&self) -> Backlog {
        Backlog::default()
    }
}
