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
        /// Requests the kernel sent again after a takeover: read by the
        /// process before, never answered by it.
        resent_requests,
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
    /// The session: since when, and how often it was taken over.
    pub session: SessionInfo,
}

/// A mount's session: a mount outlives the process serving it, and the
/// next process takes it over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionInfo {
    /// Its id (32 hex digits); empty when nothing keeps it
    /// (`--mount-keep none`).
    pub id: String,
    /// When the mount was made (Unix µs).
    pub mounted_at_us: u64,
    /// When this process took it over (Unix µs); 0 when it made it.
    pub taken_over_at_us: u64,
    /// How many times a process took it over since it was made.
    pub takeovers: u64,
    /// What holds the connection while no proxy does: `keeper`, `fdstore`
    /// (systemd's file descriptor store) or `none`.
    pub kept_by: String,
    /// Whether the kernel sent again what the process before had read and
    /// not answered: `yes`, `unsupported` (Linux before 6.9: those
    /// requests wait for ever), or empty for a mount this process made.
    pub resend: String,
}
