//! The program's numbers and limits (the XDR of each procedure is in the
//! crate's doc and the module that codes it).

use std::time::Duration;

use gvfs_nfs::rpc::ReplyStatus;

/// The program number.
pub const PROGRAM: u32 = 0x2047_5646;
/// The version this build speaks first: version 1's procedures and HELLO.
pub const VERSION: u32 = 2;
/// The oldest version still served and spoken: no HELLO, so what a peer
/// of it knows is learned one refused procedure at a time.
pub const VERSION_1: u32 = 1;
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
/// HELLO (version 2 only): the capabilities a caller speaks in, those
/// both speak out; sent once on each connection before any other call.
pub const PROC_HELLO: u32 = 9;
/// FETCH_CLASS (version 2 only): FETCH_REPEATS (or FETCH_HAVE) with the
/// caller's priority class.
pub const PROC_FETCH_CLASS: u32 = 10;
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
/// Longest wait for the upstream's answer to HELLO (or NULL); with
/// none by then, the next whole-file fetch asks again.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a chunk is fetched, which decides what goes first.
pub use gvfs_nfs::Class;
/// Whom a fetch is billed to at a shared proxy.
pub use gvfs_nfs::Tenant;

/// What a peer speaks beyond NULL, FETCH and STORE: one bit per
/// procedure (or pair) that came after them. Agreed once per connection
/// with HELLO in version 2; a version-1 peer is taken to speak them all
/// until it refuses one (PROC_UNAVAIL), as the proxies before version 2
/// did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps(pub u32);

impl Caps {
    /// FETCH_REPEATS.
    pub const REPEATS: Caps = Caps(1 << 0);
    /// STORE_GUARDED.
    pub const GUARDED: Caps = Caps(1 << 1);
    /// FETCH_DEMAND.
    pub const DEMAND: Caps = Caps(1 << 2);
    /// PROFILE_PUT and PROFILE_GET.
    pub const PROFILES: Caps = Caps(1 << 3);
    /// FETCH_HAVE.
    pub const HAVE: Caps = Caps(1 << 4);
    /// FETCH_CLASS (version 2 only: a version-1 peer never has it).
    pub const CLASS: Caps = Caps(1 << 5);
    /// Everything this build speaks.
    pub const ALL: Caps = Caps(0b11_1111);
    /// What a peer is taken to speak without HELLO's answer: every
    /// procedure of version 1 (FETCH_CLASS came after HELLO).
    pub const VERSION_1: Caps = Caps::ALL.without(Caps::CLASS);

    /// Whether every capability of `other` is here.
    pub fn has(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }

    /// Those of both.
    pub fn and(self, other: Caps) -> Caps {
        Caps(self.0 & other.0)
    }

    /// These without `other`'s.
    pub const fn without(self, other: Caps) -> Caps {
        Caps(self.0 & !other.0)
    }
}

/// The answer to HELLO's `caps` from a server that speaks [`Caps::ALL`]:
/// those the caller named that it speaks too (bits it does not know are
/// dropped).
pub fn hello_answer(asked: u32) -> u32 {
    Caps(asked).and(Caps::ALL).0
}

/// The RPC-level answer to an extension call that did not run: a version
/// other than 1 and 2 (RFC 5531, PROG_MISMATCH with the range served), a
/// procedure past the last, or HELLO or FETCH_CLASS in version 1.
pub fn rpc_refusal(vers: u32, proc_: u32) -> Option<ReplyStatus> {
    if !(VERSION_1..=VERSION).contains(&vers) {
        return Some(ReplyStatus::ProgMismatch {
            low: VERSION_1,
            high: VERSION,
        });
    }
    let last = if vers == VERSION_1 {
        PROC_FETCH_HAVE
    } else {
        PROC_FETCH_CLASS
    };
    (proc_ > last).then_some(ReplyStatus::ProcUnavail)
}
