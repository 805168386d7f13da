//! The node table on disk: `nodes.log`, so that a later process can take
//! a live FUSE connection over with the ids and handles the kernel holds.
//!
//! An append-only log, one `write(2)` per record on an `O_APPEND` fd,
//! never fsynced: it has to survive a process death (kill -9 included),
//! not a reboot, which ends the mount anyway. A record is written before
//! the reply that makes its fact known to the kernel (a node id, a file
//! handle), so the kernel never holds one the log lacks. Replay stops at
//! the first short or bad record: only a tail torn by the kill is lost,
//! and its reply never left.
//!
//! ```text
//! record:  u16 len | u8 kind | payload | u32 CRC32(kind..payload)   (LE; len counts kind+payload)
//! 1 Node      ino u64, delta u64, fh_len u8, fh          (fh only when new; else delta more lookups)
//! 2 Forget    ino u64, n u64
//! 3 Open      h u64, ino u64, cred
//! 4 Release   h u64
//! 5 Hidden    ino u64, dir_len u8, dir fh, name_len u16, name, cred
//! 6 Unhidden  ino u64
//! 7 Snapshot  generation u64                             (first record of every log)
//! cred:       uid u32, gid u32, ngroups u16, gids u32 * ngroups  (ngroups 0xffff: AUTH_NONE)
//! ```
//!
//! Bounded: once the log exceeds `max(4 MiB, 4 × its last snapshot)`,
//! [`Journal::compact`] writes `nodes.new` (a `Snapshot`, then each live
//! node with its absolute count, each open, each hidden file) and renames
//! it over `nodes.log`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;
use gvfs_nfs::rpc::{AuthUnix, MAX_GIDS};

pub(crate) use crate::limits::MAX_FH;
use crate::limits::{MAX_NODES, MAX_OPEN, NAME_MAX, ROOT};

/// The log's file name in the state directory.
pub(crate) const LOG: &str = "nodes.log";
/// A compaction's file, renamed over [`LOG`] once whole.
pub(crate) const NEW: &str = "nodes.new";

const NODE: u8 = 1;
const FORGET: u8 = 2;
const OPEN: u8 = 3;
const RELEASE: u8 = 4;
const HIDDEN: u8 = 5;
const UNHIDDEN: u8 = 6;
const SNAPSHOT: u8 = 7;

/// `ngroups` of a caller without AUTH_UNIX credentials.
const NO_CRED: u16 = u16::MAX;
/// Longest credentials: uid, gid, ngroups and every group.
const MAX_CRED: usize = 4 + 4 + 2 + 4 * MAX_GIDS;
/// Longest kind + payload (a `Hidden` record).
const MAX_BODY: usize = 1 + 8 + 1 + MAX_FH + 2 + NAME_MAX + MAX_CRED;
/// Longest record on disk.
const MAX_RECORD: usize = 2 + MAX_BODY + 4;
/// The log is compacted past this size at the least.
pub(crate) const MIN_COMPACT: u64 = 4 << 20;
/// The machine name of restored credentials (as [`crate::creds`] sends).
pub(crate) const MACHINE: &[u8] = b"gvfs-fuse";

/// One record being encoded, on the stack.
struct Record {
    buf: [u8; MAX_RECORD],
    len: usize,
}

impl Record {
    fn new(kind: u8) -> Self {
        let mut r = Self {
            buf: [0; MAX_RECORD],
            len: 2,
        };
        r.u8(kind);
        r
    }

    fn put(&mut self, b: &[u8]) {
        // Every caller bounds what it puts (fh, name, groups), so the sum
        // stays within MAX_RECORD.
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }

    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// A handle, after its length (cut at [`MAX_FH`]: callers refuse
    /// longer ones first).
    fn short_bytes(&mut self, b: &[u8]) {
        let b = &b[..b.len().min(MAX_FH)];
        self.u8(b.len() as u8);
        self.put(b);
    }

    fn cred(&mut self, c: &Credentials) {
        match c {
            Credentials::Unix(u) => {
                let gids = &u.gids[..u.gids.len().min(MAX_GIDS)];
                self.u32(u.uid);
                self.u32(u.gid);
                self.u16(gids.len() as u16);
                for g in gids {
                    self.u32(*g);
                }
            }
            _ => {
                self.u32(0);
                self.u32(0);
                self.u16(NO_CRED);
            }
        }
    }

    /// The finished record: its length in front, its CRC behind.
    fn finish(&mut self) -> &[u8] {
        let body = (self.len - 2) as u16;
        self.buf[..2].copy_from_slice(&body.to_le_bytes());
        let crc = crc32fast::hash(&self.buf[2..self.len]);
        self.u32(crc);
        &self.buf[..self.len]
    }

    fn node(ino: u64, delta: u64, fh: &[u8]) -> Self {
        let mut r = Self::new(NODE);
        r.u64(ino);
        r.u64(delta);
        r.short_bytes(fh);
        r
    }

    fn open(h: u64, ino: u64, cred: &Credentials) -> Self {
        let mut r = Self::new(OPEN);
        r.u64(h);
        r.u64(ino);
        r.cred(cred);
        r
    }

    fn hidden(ino: u64, dir: &[u8], name: &[u8], cred: &Credentials) -> Self {
        let mut r = Self::new(HIDDEN);
        r.u64(ino);
        r.short_bytes(dir);
        let name = &name[..name.len().min(NAME_MAX)];
        r.u16(name.len() as u16);
        r.put(name);
        r.cred(cred);
        r
    }

    fn two(kind: u8, a: u64, b: Option<u64>) -> Self {
        let mut r = Self::new(kind);
        r.u64(a);
        if let Some(b) = b {
            r.u64(b);
        }
        r
    }
}

/// A live node, as replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeEntry {
    /// Its NFS handle.
    pub(crate) fh: Vec<u8>,
    /// Entries the kernel holds.
    pub(crate) lookups: u64,
}

/// An open file or directory, as replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenEntry {
    pub(crate) ino: u64,
    /// The opener's credentials.
    pub(crate) cred: Credentials,
}

/// A file hidden while open, as replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HiddenEntry {
    /// The directory's handle.
    pub(crate) dir: Vec<u8>,
    /// Its hidden name there.
    pub(crate) name: Vec<u8>,
    /// Whom it is removed as.
    pub(crate) cred: Credentials,
}

/// What a log says the kernel holds (the root, node 1, aside: it comes
/// from the session file).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    /// The last snapshot's generation.
    pub(crate) generation: u64,
    /// Live nodes by id.
    pub(crate) nodes: HashMap<u64, NodeEntry>,
    /// Open files and directories by the kernel's file handle.
    pub(crate) opens: HashMap<u64, OpenEntry>,
    /// Hidden files by node id.
    pub(crate) hidden: HashMap<u64, HiddenEntry>,
    /// Bytes of whole records read.
    pub(crate) len: u64,
    /// Whether something followed them (a torn or bad tail, left out).
    pub(crate) torn: bool,
}

/// Reads the log at `path` into a [`Table`], up to its first short, bad
/// or unknown record.
#[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
pub(crate) fn replay(path: &Path) -> io::Result<Table> {
    let mut r = BufReader::new(File::open(path)?);
    let mut t = Table::default();
    let mut buf = [0_u8; MAX_RECORD];
    loop {
        let mut len = [0_u8; 2];
        match read_full(&mut r, &mut len)? {
            0 => return Ok(t),
            2 => {}
            _ => break,
        }
        let body = usize::from(u16::from_le_bytes(len));
        if body == 0 || body > MAX_BODY {
            break;
        }
        let frame = &mut buf[..body + 4];
        if read_full(&mut r, frame)? < frame.len() {
            break;
        }
        let (data, crc) = frame.split_at(body);
        if crc32fast::hash(data).to_le_bytes() != crc {
            break;
        }
        if t.apply(data).is_none() {
            break;
        }
        t.len += 2 + body as u64 + 4;
    }
    t.torn = true;
    Ok(t)
}

/// Reads until `buf` is full or the file ends: how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A record's fields, in order; `None` past its end.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn fh(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?);
        if n > MAX_FH {
            return None;
        }
        self.take(n)
    }

    fn cred(&mut self) -> Option<Credentials> {
        let (uid, gid, n) = (self.u32()?, self.u32()?, self.u16()?);
        if n == NO_CRED {
            return Some(Credentials::None);
        }
        let n = usize::from(n);
        if n > MAX_GIDS {
            return None;
        }
        let gids = (0..n).map(|_| self.u32()).collect::<Option<Vec<_>>>()?;
        Some(Credentials::Unix(AuthUnix {
            stamp: 0,
            machine: MACHINE.to_vec(),
            uid,
            gid,
            gids,
        }))
    }

    /// Whether every byte was read.
    fn done(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

impl Table {
    /// Applies one record (`kind | payload`); `None` if it is not one this
    /// code writes, or would take the table past what a mount holds.
    fn apply(&mut self, data: &[u8]) -> Option<()> {
        let mut f = Fields(data);
        match f.u8()? {
            NODE => {
                let (ino, delta, fh) = (f.u64()?, f.u64()?, f.fh()?);
                f.done()?;
                if ino <= ROOT {
                    return Some(());
                }
                if !fh.is_empty() {
                    if !self.nodes.contains_key(&ino) && self.nodes.len() >= MAX_NODES {
                        return None;
                    }
                    if delta > 0 {
                        let fh = fh.to_vec();
                        self.nodes.insert(ino, NodeEntry { fh, lookups: delta });
                    }
                } else if let Some(n) = self.nodes.get_mut(&ino) {
                    n.lookups = n.lookups.saturating_add(delta);
                }
            }
            FORGET => {
                let (ino, n) = (f.u64()?, f.u64()?);
                f.done()?;
                if let Some(node) = self.nodes.get_mut(&ino) {
                    node.lookups = node.lookups.saturating_sub(n);
                    if node.lookups == 0 {
                        self.nodes.remove(&ino);
                    }
                }
            }
            OPEN => {
                let (h, ino, cred) = (f.u64()?, f.u64()?, f.cred()?);
                f.done()?;
                if !self.opens.contains_key(&h) && self.opens.len() >= MAX_OPEN {
                    return None;
                }
                self.opens.insert(h, OpenEntry { ino, cred });
            }
            RELEASE => {
                let h = f.u64()?;
                f.done()?;
                self.opens.remove(&h);
            }
            HIDDEN => {
                let (ino, dir) = (f.u64()?, f.fh()?.to_vec());
                let n = usize::from(f.u16()?);
                if n > NAME_MAX {
                    return None;
                }
                let (name, cred) = (f.take(n)?.to_vec(), f.cred()?);
                f.done()?;
                if !self.hidden.contains_key(&ino) && self.hidden.len() >= MAX_OPEN {
                    return None;
                }
                self.hidden.insert(ino, HiddenEntry { dir, name, cred });
            }
            UNHIDDEN => {
                let ino = f.u64()?;
                f.done()?;
                self.hidden.remove(&ino);
            }
            SNAPSHOT => {
                let generation = f.u64()?;
                f.done()?;
                *self = Self {
                    generation,
                    len: self.len,
                    ..Self::default()
                };
            }
            _ => return None,
        }
        Some(())
    }
}

/// The log, open for appending.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// Set once the log has grown past its bound: [`compact`](Self::compact)
    /// is due.
    due: AtomicBool,
    /// Whether a failed write was logged at warning level already.
    warned: AtomicBool,
    min_compact: u64,
}

#[derive(Debug)]
struct Inner {
    file: File,
    /// Bytes of whole records in the file.
    len: u64,
    /// Bytes of the last snapshot.
    base: u64,
    generation: u64,
    /// A record went in torn and could not be cut off: anything written
    /// after it would be lost to a replay, so nothing more is.
    broken: bool,
}

/// Why a record was not written.
#[derive(Debug)]
pub(crate) struct Unrecorded;

impl Journal {
    /// A new, empty log in `dir` (a `Snapshot` record alone), in place of
    /// any there.
    pub(crate) fn create(dir: &Path) -> io::Result<Self> {
        Self::rewrite(dir, &Table::default(), MIN_COMPACT)
    }

    /// A log in `dir` holding `table` alone (as a snapshot of the next
    /// generation), written beside and renamed over the one there, so a
    /// torn tail goes: what a process taking the session over appends to.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn resume(dir: &Path, table: &Table) -> io::Result<Self> {
        Self::rewrite(dir, table, MIN_COMPACT)
    }

    fn rewrite(dir: &Path, table: &Table, min_compact: u64) -> io::Result<Self> {
        let generation = table.generation + 1;
        let (file, len) = write_new(dir, generation, |s| {
            for (ino, n) in &table.nodes {
                s.node(*ino, n.lookups, &n.fh)?;
            }
            for (h, o) in &table.opens {
                s.open(*h, o.ino, &o.cred)?;
            }
            for (ino, h) in &table.hidden {
                s.hidden(*ino, &h.dir, &h.name, &h.cred)?;
            }
            Ok(())
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                file,
                len,
                base: len,
                generation,
                broken: false,
            }),
            due: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            min_compact,
        })
    }

    /// The log's path.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    /// `delta` more entries of node `ino` handed to the kernel; `fh` is
    /// its handle when the node is new, else empty.
    pub(crate) fn node(&self, ino: u64, delta: u64, fh: &[u8]) -> Result<(), Unrecorded> {
        if fh.len() > MAX_FH {
            return Err(Unrecorded);
        }
        self.append(Record::node(ino, delta, fh))
    }

    /// The kernel forgot `n` entries of `ino`.
    pub(crate) fn forget(&self, ino: u64, n: u64) -> Result<(), Unrecorded> {
        self.append(Record::two(FORGET, ino, Some(n)))
    }

    /// File handle `h` opened on `ino` by `cred`.
    pub(crate) fn open(&self, h: u64, ino: u64, cred: &Credentials) -> Result<(), Unrecorded> {
        self.append(Record::open(h, ino, cred))
    }

    /// File handle `h` closed.
    pub(crate) fn release(&self, h: u64) -> Result<(), Unrecorded> {
        self.append(Record::two(RELEASE, h, None))
    }

    /// Open file `ino` renamed to `name` in `dir`, to be removed as `cred`.
    pub(crate) fn hidden(
        &self,
        ino: u64,
        dir: &[u8],
        name: &[u8],
        cred: &Credentials,
    ) -> Result<(), Unrecorded> {
        if dir.len() > MAX_FH || name.len() > NAME_MAX {
            return Err(Unrecorded);
        }
        self.append(Record::hidden(ino, dir, name, cred))
    }

    /// Hidden file `ino` is being removed.
    pub(crate) fn unhidden(&self, ino: u64) -> Result<(), Unrecorded> {
        self.append(Record::two(UNHIDDEN, ino, None))
    }

    /// Whether the log has grown past its bound.
    pub(crate) fn due(&self) -> bool {
        self.due.load(Ordering::Relaxed)
    }

    /// Bytes in the log now.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn len(&self) -> u64 {
        lock(&self.inner).len
    }

    /// One record, in one `write(2)`.
    fn append(&self, mut r: Record) -> Result<(), Unrecorded> {
        let bytes = r.finish();
        let mut inner = lock(&self.inner);
        if inner.broken {
            return Err(Unrecorded);
        }
        let error = match (&inner.file).write(bytes) {
            Ok(n) if n == bytes.len() => None,
            Ok(n) => Some(io::Error::other(format!(
                "{n} of {} bytes written",
                bytes.len()
            ))),
            Err(e) => Some(e),
        };
        if let Some(e) = error {
            // A short write leaves part of a record: cut it off, or stop.
            let at = inner.len;
            if inner.file.set_len(at).is_err() {
                inner.broken = true;
            }
            drop(inner);
            self.failed(&e);
            return Err(Unrecorded);
        }
        inner.len += bytes.len() as u64;
        if inner.len > self.min_compact.max(inner.base.saturating_mul(4)) {
            self.due.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn failed(&self, e: &io::Error) {
        let path = self.path();
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(path = %path.display(), error = %e, "cannot write the FUSE node log");
        } else {
            tracing::error!(path = %path.display(), error = %e,
                "cannot write the FUSE node log: new nodes and opens fail (EIO) until it can");
        }
    }

    /// Writes the live state, given by `live`, as a new log and renames it
    /// over this one. The caller holds the locks of everything `live`
    /// reads (inodes, opens, hidden: in that order), so no record of them
    /// can come in between.
    pub(crate) fn compact(
        &self,
        live: impl FnOnce(&mut Snapshot) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut inner = lock(&self.inner);
        let generation = inner.generation + 1;
        match write_new(&self.dir, generation, live) {
            Ok((file, len)) => {
                *inner = Inner {
                    file,
                    len,
                    base: len,
                    generation,
                    broken: false,
                };
                self.due.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Not again before the log has grown four times over.
                inner.base = inner.len;
                self.due.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// A log being written whole: a snapshot of the live state.
pub(crate) struct Snapshot {
    out: BufWriter<File>,
    len: u64,
}

impl Snapshot {
    fn put(&mut self, mut r: Record) -> io::Result<()> {
        let bytes = r.finish();
        self.out.write_all(bytes)?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// A live node with `lookups` entries in the kernel.
    pub(crate) fn node(&mut self, ino: u64, lookups: u64, fh: &[u8]) -> io::Result<()> {
        if ino <= ROOT || lookups == 0 || fh.is_empty() || fh.len() > MAX_FH {
            return Ok(());
        }
        self.put(Record::node(ino, lookups, fh))
    }

    /// An open file handle.
    pub(crate) fn open(&mut self, h: u64, ino: u64, cred: &Credentials) -> io::Result<()> {
        self.put(Record::open(h, ino, cred))
    }

    /// A hidden file.
    pub(crate) fn hidden(
        &mut self,
        ino: u64,
        dir: &[u8],
        name: &[u8],
        cred: &Credentials,
    ) -> io::Result<()> {
        if dir.len() > MAX_FH || name.len() > NAME_MAX {
            return Ok(());
        }
        self.put(Record::hidden(ino, dir, name, cred))
    }
}

/// Writes `NEW` in `dir` (a `Snapshot` of `generation`, then what `live`
/// adds) and renames it over `LOG`: the open file, for appending, and its
/// length.
fn write_new(
    dir: &Path,
    generation: u64,
    live: impl FnOnce(&mut Snapshot) -> io::Result<()>,
) -> io::Result<(File, u64)> {
    let new = dir.join(NEW);
    // One left by a process that died compacting.
    match std::fs::remove_file(&new) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(&new)?;
    let written = (|| {
        let mut s = Snapshot {
            out: BufWriter::new(file.try_clone()?),
            len: 0,
        };
        s.put(Record::two(SNAPSHOT, generation, None))?;
        live(&mut s)?;
        s.out.flush()?;
        std::fs::rename(&new, dir.join(LOG))?;
        Ok(s.len)
    })();
    match written {
        Ok(len) => Ok((file, len)),
        Err(e) => {
            let _ = std::fs::remove_file(&new);
            Err(e)
        }
    }
}

#[cfg(test)]
impl Journal {
    /// A journal compacted past `min_compact` bytes rather than 4 MiB.
    pub(crate) fn with_min_compact(dir: &Path, min_compact: u64) -> io::Result<Self> {
        Self::rewrite(dir, &Table::default(), min_compact)
    }

    /// Makes every later write fail, as a full or broken disk would: the
    /// log's fd is swapped for a read-only one.
    pub(crate) fn sabotage(&self) {
        let ro = File::open(self.path()).expect("the log is there");
        lock(&self.inner).file = ro;
    }
}

#[cfg(test)]
mod tests;
