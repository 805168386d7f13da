//! What the clients do: the kinds of client, the mix of operations, the
//! random source, the shared plan and the tally of what happened.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::libnfs::nfs_url;

/// Error messages kept per client.
const KEPT_MESSAGES: usize = 8;

/// What kind of client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// The project's async NFS client, call by call.
    Fixture,
    /// libnfs' `nfs-cat` and `nfs-cp` processes, and the fixture for the
    /// calls they cannot make.
    Libnfs,
}

/// One operation of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// READ of a range of an own file.
    Read,
    /// READ of a range of a shared file.
    ReadShared,
    /// WRITE of a range (UNSTABLE or FILE_SYNC) of an own file.
    Write,
    /// COMMIT of an own file.
    Commit,
    /// CREATE of a new file and WRITEs of its first contents.
    Create,
    /// REMOVE of an own file.
    Remove,
    /// SETATTR of an own file's size.
    Truncate,
    /// GETATTR of an own file, its size checked.
    Getattr,
    /// `nfs-cat` of a whole own file.
    NfsCat,
    /// `nfs-cat` of a whole shared file.
    NfsCatShared,
    /// `nfs-cp` of a local file to a new name.
    NfsCp,
    /// READDIRPLUS of the client's directory, page by page: exactly its
    /// files listed.
    Readdirplus,
    /// `nfs-ls` of the client's directory, checked the same way.
    NfsLs,
}

impl Op {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "READ",
            Op::ReadShared => "READ shared",
            Op::Write => "WRITE",
            Op::Commit => "COMMIT",
            Op::Create => "CREATE + WRITE",
            Op::Remove => "REMOVE",
            Op::Truncate => "SETATTR size",
            Op::Getattr => "GETATTR",
            Op::NfsCat => "nfs-cat",
            Op::NfsCatShared => "nfs-cat shared",
            Op::NfsCp => "nfs-cp",
            Op::Readdirplus => "READDIRPLUS",
            Op::NfsLs => "nfs-ls",
        }
    }

    pub(super) fn needs_file(self) -> bool {
        matches!(
            self,
            Op::Read
                | Op::Write
                | Op::Commit
                | Op::Remove
                | Op::Truncate
                | Op::Getattr
                | Op::NfsCat
        )
    }
}

/// The mix of each kind of client, as weights.
pub(super) fn mix(kind: ClientKind) -> &'static [(Op, u32)] {
    match kind {
        ClientKind::Fixture => &[
            (Op::Read, 30),
            (Op::ReadShared, 15),
            (Op::Write, 25),
            (Op::Commit, 8),
            (Op::Create, 6),
            (Op::Remove, 5),
            (Op::Truncate, 3),
            (Op::Getattr, 8),
            (Op::Readdirplus, 2),
        ],
        ClientKind::Libnfs => &[
            (Op::NfsCat, 30),
            (Op::NfsCatShared, 10),
            (Op::NfsCp, 15),
            (Op::Write, 20),
            (Op::Commit, 5),
            (Op::Remove, 10),
            (Op::Read, 5),
            (Op::Getattr, 5),
            (Op::NfsLs, 3),
        ],
    }
}

/// A deterministic generator (SplitMix64): the same seed gives the same
/// run of operations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A file every client reads and none writes.
#[derive(Debug, Clone)]
pub struct SharedFile {
    /// Its name in the export's root.
    pub name: String,
    /// Its contents' seed ([`crate::data::fill_at`]).
    pub seed: u64,
    /// Its size.
    pub size: u64,
}

/// What every client shares: where to connect, the file budget, the shared
/// files.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The proxy the clients use (NFS and MOUNT on one port).
    pub ip: IpAddr,
    /// Its port.
    pub port: u16,
    /// Its export.
    pub export: String,
    /// Files a client keeps (it creates when it has fewer than half, and
    /// removes instead of creating when it has this many).
    pub files_per_client: usize,
    /// Largest size of a client's file.
    pub max_file: usize,
    /// The read-only files.
    pub shared: Vec<SharedFile>,
    /// Local directory for `nfs-cp` sources.
    pub scratch: PathBuf,
    /// Seed of the whole run.
    pub seed: u64,
}

impl Plan {
    pub(super) fn url(&self, name: &str) -> String {
        nfs_url(self.ip, self.port, self.port, &self.export, name)
    }
}

/// Counts of one client (or, merged, of all).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Operations done, by [`Op::name`].
    pub ops: BTreeMap<&'static str, u64>,
    /// Operations that failed, by [`Op::name`].
    pub errors: BTreeMap<&'static str, u64>,
    /// Bytes served that differ from the model (or lie past its end).
    pub wrong_bytes: u64,
    /// Bytes read and checked.
    pub bytes_read: u64,
    /// Bytes written (acknowledged).
    pub bytes_written: u64,
    /// COMMITs or UNSTABLE replies whose verifier had changed (each made the
    /// client write its file again).
    pub verifier_changes: u64,
    /// Files left unchecked after a failed call.
    pub tainted_files: u64,
    /// The first error messages.
    pub messages: Vec<String>,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Tally) {
        for (k, v) in &other.ops {
            *self.ops.entry(k).or_default() += v;
        }
        for (k, v) in &other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.wrong_bytes += other.wrong_bytes;
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.verifier_changes += other.verifier_changes;
        self.tainted_files += other.tainted_files;
        for m in &other.messages {
            if self.messages.len() < 4 * KEPT_MESSAGES {
                self.messages.push(m.clone());
            }
        }
    }

    /// All operations.
    pub fn total_ops(&self) -> u64 {
        self.ops.values().sum()
    }

    /// All failed operations.
    pub fn total_errors(&self) -> u64 {
        self.errors.values().sum()
    }

    pub(super) fn note(&mut self, msg: String) {
        if self.messages.len() < KEPT_MESSAGES {
            self.messages.push(msg);
        }
    }
}
