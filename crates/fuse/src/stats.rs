//! What the FUSE front end counts, and what `gvfsctl status` shows of a
//! mount.

use serde::{Deserialize, Serialize};

gvfs_nfs::counters! {
    /// What the FUSE front end counts.
    pub struct Counters => FuseCounts {
        /// NFS calls made down the stack.
        calls,
        /// Calls the stack could not answer (upstream gone past its
        /// timeout, a layer's own failure): an I/O error to the caller.
        failed,
        /// Bytes read by processes (from the stack; the kernel's page
        /// cache answers the rest).
        read_bytes,
        /// Bytes written by processes.
        write_bytes,
        /// COMMITs (fsync, close, budget, exit).
        commits,
        /// Writes sent again because the write verifier changed before
        /// their COMMIT.
        writes_resent,
        /// Reads left out of the read trace (`--mount-trace`) once it was
        /// full.
        trace_dropped,
    }
}

/// What `gvfsctl status` shows of a mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FuseStats {
    /// The directory mounted on.
    pub path: String,
    /// Counters.
    #[serde(flatten)]
    pub counts: FuseCounts,
    /// Files and directories the kernel holds (node table entries).
    pub inodes: u64,
    /// Open files and directories.
    pub open: u64,
    /// Bytes written and not yet committed (kept to be sent again).
    pub uncommitted_bytes: u64,
    /// Requests running now.
    pub in_flight: u64,
}
