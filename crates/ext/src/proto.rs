//! The program's numbers and limits (the XDR of each procedure is in the
//! crate's doc and the module that codes it).

use std::time::Duration;

use gvfs_nfs::rpc::ReplyStatus;

/// The program number.
pub const PROGRAM: u32 = 0x2047_5646;
/// The one version.
pub const VERSION: u32 = 1;
/// NULL: the probe a proxy sends to learn whether its upstream speaks this.
pub const PROC_NULL: u32 = 0;
/// FETCH: one chunk of a file, compressed.
pub const PROC_FETCH: u32 = 1;
/// STORE: one compressed chunk written back, durably.
pub const PROC_STORE: u32 = 2;
/// FETCH_REPEATS: FETCH with repeated bytes sent as zeros and listed.
pub const PROC_FETCH_REPEATS: u32 = 3;
/// STORE_GUARDED: STORE only if the file still has the guard's attributes.
pub const PROC_STORE_GUARDED: u32 = 4;
/// FETCH_REPEATS for a chunk a reader waits for.
pub const PROC_FETCH_DEMAND: u32 = 5;
/// Keep a working-set profile.
pub const PROC_PROFILE_PUT: u32 = 6;
/// Ask for a working-set profile.
pub const PROC_PROFILE_GET: u32 = 7;
/// FETCH_HAVE: FETCH_REPEATS with the blocks the caller holds sent as
/// zeros (`have.rs`).
pub const PROC_FETCH_HAVE: u32 = 8;
/// Most repeats one FETCH_REPEATS answer lists (one per 4 KiB block).
pub const MAX_REPEATS: usize = (CHUNK / 4096) as usize;
/// Bytes of file data per chunk (and the most one FETCH may ask for).
pub const CHUNK: u32 = 1 << 20;
/// What a zstd frame may add to its input before it is sent stored instead.
pub const MAX_FRAME_SLACK: u32 = 4096;
/// Bytes of a STORE_GUARDED guard (a `wcc_attr`: size and two `nfstime3`).
pub(crate) const GUARD_LEN: usize = 24;
/// Largest NFSv3 file handle (RFC 1813, NFS3_FHSIZE).
pub(crate) const FHSIZE: usize = 64;
/// Longest wait for the upstream's answer to the extension's NULL; with
/// none by then, the next whole-file fetch asks again.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a chunk is fetched, which decides what goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// Ahead of any reader, in file order.
    Background,
    /// Named by the file's working-set profile: fetched first, ahead of
    /// the readers that will want it.
    Profile,
    /// A reader waits for it now.
    Demand,
}

/// The RPC-level answer to an extension call that did not run.
pub fn rpc_refusal(vers: u32, proc_: u32) -> Option<ReplyStatus> {
    if vers != VERSION {
        return Some(ReplyStatus::ProgMismatch {
            low: VERSION,
            high: VERSION,
        });
    }
    (proc_ > PROC_FETCH_HAVE).then_some(ReplyStatus::ProcUnavail)
}
