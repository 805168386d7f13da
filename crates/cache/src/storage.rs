//! Where bank bytes live: a small positional-I/O trait with a file backend,
//! an in-memory backend and a fault-injecting wrapper for tests.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Positional byte storage of one bank. Implementations must be safe to
/// share between threads; each call is independent (no cursor).
pub trait Storage: Send + Sync + fmt::Debug {
    /// Fills `buf` from `offset`; reading past the end is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// [`read_at`](Self::read_at), but only if the bytes can be had without
    /// waiting for a disk (they are in memory), so that it may run on an
    /// async thread: true if `buf` was filled; false if the caller must use
    /// `read_at` instead, leaving `buf` in an unspecified state. The default
    /// never tries.
    fn read_at_nowait(&self, _buf: &mut [u8], _offset: u64) -> bool {
        false
    }
    /// Writes all of `data` at `offset`, growing the storage if needed.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (fsync).
    fn sync(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the storage is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Grows (with zeros) or shrinks the storage.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves room for the first `len` bytes, so that writing them never
    /// fails for want of space. `ErrorKind::Unsupported` if the backend
    /// cannot; the default has nothing to reserve.
    fn allocate(&self, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// A bank in a local file, using `pread`/`pwrite` and `fdatasync`.
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    /// Set once the kernel refused `RWF_NOWAIT` for this file.
    nowait_unsupported: AtomicBool,
}

impl FileStorage {
    /// Opens or creates the file at `path`.
    pub fn open(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(FileStorage {
            file,
            nowait_unsupported: AtomicBool::new(false),
        })
    }
}

impl Storage for FileStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
    /// `preadv2(RWF_NOWAIT)`: the kernel copies what is in the page cache
    /// and answers `EAGAIN` (or a short read) where it would have to wait for
    /// the disk.
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> bool {
        use rustix::io::{Errno, ReadWriteFlags, preadv2};
        if self.nowait_unsupported.load(Ordering::Relaxed) {
            return false;
        }
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let mut iov = [io::IoSliceMut::new(&mut buf[done..])];
            match preadv2(&self.file, &mut iov, at, ReadWriteFlags::NOWAIT) {
                Ok(0) => return false, // past the end: read_at reports it
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                    self.nowait_unsupported.store(true, Ordering::Relaxed);
                    return false;
                }
                // EAGAIN (not in memory) or a real error, which read_at
                // will meet and report.
                Err(_) => return false,
            }
        }
        true
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    /// `fallocate(2)`: the blocks are allocated now (a sparse file would
    /// take them at each first write, and fail there on a full disk).
    fn allocate(&self, len: u64) -> io::Result<()> {
        use rustix::fs::{FallocateFlags, fallocate};
        match fallocate(&self.file, FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => Err(io::ErrorKind::Unsupported.into()),
            Err(e) => Err(e.into()),
        }
    }
}

// `lock` ignores poisoning: a panic while holding the lock cannot leave the
// bytes half-updated in a way later calls could misread.
use gvfs_nfs::layer::lock;

/// A bank in memory; `sync` does nothing. Clones share the same bytes.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl MemStorage {
    /// An empty storage.
    pub fn new() -> MemStorage {
        MemStorage::default()
    }
}

fn range_of(offset: u64, len: usize) -> io::Result<(usize, usize)> {
    let start = usize::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
    let end = start
        .checked_add(len)
        .ok_or_else(|| io::Error::other("offset too large"))?;
    Ok((start, end))
}

impl Storage for MemStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = lock(&self.bytes);
        let (start, end) = range_of(offset, buf.len())?;
        let src = bytes
            .get(start..end)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    /// Memory never waits for a disk.
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> bool {
        self.read_at(buf, offset).is_ok()
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = lock(&self.bytes);
        let (start, end) = range_of(offset, data.len())?;
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.bytes).len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        lock(&self.bytes).resize(len, 0);
        Ok(())
    }
}

/// What a simulated crash does to one write issued since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFate {
    /// The write never reached the disk.
    Lost,
    /// The write reached the disk whole.
    Kept,
    /// Only the first `n` bytes reached the disk.
    Torn(usize),
}

#[derive(Debug)]
enum Unsynced {
    Write {
        offset: u64,
        data: Vec<u8>,
        old: Vec<u8>,
        old_len: u64,
    },
    SetLen {
        old_len: u64,
        new_len: u64,
        old_tail: Vec<u8>,
    },
}

#[derive(Debug, Default)]
struct FaultState {
    ops: u64,
    fail_at: Option<u64>,
    log: Vec<Unsynced>,
}

/// Wraps another storage and injects faults: fail the N-th operation, or
/// simulate a crash that forgets (or keeps, or tears) each write issued since
/// the last `sync`. Clones share the same state, so a test keeps a handle
/// after giving one to the store.
#[derive(Debug, Clone)]
pub struct FaultyStorage<S> {
    inner: Arc<S>,
    state: Arc<Mutex<FaultState>>,
}

impl<S: Storage> FaultyStorage<S> {
    /// Wraps `inner`; what `inner` holds now counts as durable.
    pub fn new(inner: S) -> FaultyStorage<S> {
        FaultyStorage {
            inner: Arc::new(inner),
            state: Arc::default(),
        }
    }

    /// Makes the `n`-th operation from now (0 = the next one) fail with an
    /// I/O error, once.
    pub fn fail_nth_op(&self, n: u64) {
        let mut st = lock(&self.state);
        st.fail_at = Some(st.ops + n);
    }

    /// Writes issued since the last sync.
    pub fn unsynced_writes(&self) -> usize {
        lock(&self.state).log.len()
    }

    /// Simulates a crash and restart: every write since the last sync is
    /// lost.
    pub fn crash(&self) -> io::Result<()> {
        self.crash_with(|_, _| WriteFate::Lost)
    }

    /// Simulates a crash where everything since the last sync is lost except
    /// the first `prefix` bytes of the last write.
    pub fn crash_tearing_last(&self, prefix: usize) -> io::Result<()> {
        let last = lock(&self.state).log.len().saturating_sub(1);
        self.crash_with(|i, _| {
            if i == last {
                WriteFate::Torn(prefix)
            } else {
                WriteFate::Lost
            }
        })
    }

    /// Simulates a crash deciding each unsynced write's fate with
    /// `fate(index, len)`; writes may survive out of order, as on a real
    /// disk without a barrier. Length changes always survive.
    pub fn crash_with(&self, mut fate: impl FnMut(usize, usize) -> WriteFate) -> io::Result<()> {
        let mut st = lock(&self.state);
        let log = std::mem::take(&mut st.log);
        // Undo everything, newest first ...
        for u in log.iter().rev() {
            match u {
                Unsynced::Write {
                    offset,
                    old,
                    old_len,
                    ..
                } => {
                    self.inner.write_at(old, *offset)?;
                    self.inner.set_len(*old_len)?;
                }
                Unsynced::SetLen {
                    old_len, old_tail, ..
                } => {
                    self.inner.set_len(*old_len)?;
                    self.inner
                        .write_at(old_tail, old_len - old_tail.len() as u64)?;
                }
            }
        }
        // ... then redo what the crash let through, oldest first.
        let mut i = 0;
        for u in &log {
            match u {
                Unsynced::Write { offset, data, .. } => {
                    match fate(i, data.len()) {
                        WriteFate::Lost => {}
                        WriteFate::Kept => self.inner.write_at(data, *offset)?,
                        WriteFate::Torn(n) => {
                            self.inner.write_at(&data[..n.min(data.len())], *offset)?
                        }
                    }
                    i += 1;
                }
                Unsynced::SetLen { new_len, .. } => self.inner.set_len(*new_len)?,
            }
        }
        self.inner.sync()
    }

    fn tick(&self) -> io::Result<MutexGuard<'_, FaultState>> {
        let mut st = lock(&self.state);
        let n = st.ops;
        st.ops += 1;
        if st.fail_at == Some(n) {
            st.fail_at = None;
            return Err(io::Error::other("injected fault"));
        }
        Ok(st)
    }
}

impl<S: Storage> Storage for FaultyStorage<S> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _st = self.tick()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.tick()?;
        let old_len = self.inner.len()?;
        let end = offset.saturating_add(data.len() as u64);
        let mut old = vec![0u8; data.len()];
        let have = end.min(old_len).saturating_sub(offset) as usize;
        if have > 0 {
            self.inner.read_at(&mut old[..have], offset)?;
        }
        self.inner.write_at(data, offset)?;
        st.log.push(Unsynced::Write {
            offset,
            data: data.to_vec(),
            old,
            old_len,
        });
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut st = self.tick()?;
        self.inner.sync()?;
        st.log.clear();
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        let _st = self.tick()?;
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.tick()?;
        let old_len = self.inner.len()?;
        let mut old_tail = Vec::new();
        if len < old_len {
            old_tail = vec![0u8; (old_len - len) as usize];
            self.inner.read_at(&mut old_tail, len)?;
        }
        self.inner.set_len(len)?;
        st.log.push(Unsynced::SetLen {
            old_len,
            new_len: len,
            old_tail,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &dyn Storage, off: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        s.read_at(&mut b, off).expect("read");
        b
    }

    #[test]
    fn mem_storage_reads_back() {
        let s = MemStorage::new();
        s.write_at(b"hello", 3).expect("write");
        assert_eq!(s.len().expect("len"), 8);
        assert_eq!(read(&s, 0, 8), b"\0\0\0hello");
        let mut b = [0u8; 4];
        assert!(s.read_at(&mut b, 6).is_err());
    }

    #[test]
    fn file_storage_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = FileStorage::open(&dir.path().join("b")).expect("open");
        s.set_len(16).expect("set_len");
        s.write_at(b"abc", 4).expect("write");
        s.sync().expect("sync");
        assert_eq!(read(&s, 3, 5), b"\0abc\0");
    }

    #[test]
    fn nowait_reads_what_is_in_memory_and_nothing_past_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = FileStorage::open(&dir.path().join("b")).expect("open");
        let m = MemStorage::new();
        for s in [&f as &dyn Storage, &m] {
            s.write_at(&[7u8; 8192], 0).expect("write");
            let mut b = [0u8; 100];
            // Just written, so in the page cache; a kernel or file system
            // without RWF_NOWAIT may still decline, never return bad bytes.
            if s.read_at_nowait(&mut b, 4000) {
                assert_eq!(b, [7u8; 100]);
            }
            assert!(!s.read_at_nowait(&mut b, 8150));
        }
        assert!(m.read_at_nowait(&mut [0u8; 4], 0));
        let faulty = FaultyStorage::new(MemStorage::new());
        assert!(!faulty.read_at_nowait(&mut [], 0));
    }

    #[test]
    fn crash_forgets_unsynced_writes() {
        let s = FaultyStorage::new(MemStorage::new());
        s.set_len(8).expect("set_len");
        s.write_at(b"AAAA", 0).expect("write");
        s.sync().expect("sync");
        s.write_at(b"BBBB", 0).expect("write");
        s.write_at(b"CCCC", 2).expect("write");
        assert_eq!(s.unsynced_writes(), 2);
        s.crash().expect("crash");
        assert_eq!(read(&s, 0, 8), b"AAAA\0\0\0\0");
    }

    #[test]
    fn crash_can_tear_the_last_write() {
        let s = FaultyStorage::new(MemStorage::new());
        s.write_at(b"AAAAAAAA", 0).expect("write");
        s.sync().expect("sync");
        s.write_at(b"BB", 0).expect("write");
        s.write_at(b"CCCC", 4).expect("write");
        s.crash_tearing_last(2).expect("crash");
        assert_eq!(read(&s, 0, 8), b"AAAACCAA");
    }

    #[test]
    fn crash_can_reorder() {
        let s = FaultyStorage::new(MemStorage::new());
        s.set_len(4).expect("set_len");
        s.sync().expect("sync");
        s.write_at(b"X", 0).expect("write");
        s.write_at(b"Y", 1).expect("write");
        s.crash_with(|i, _| {
            if i == 1 {
                WriteFate::Kept
            } else {
                WriteFate::Lost
            }
        })
        .expect("crash");
        assert_eq!(read(&s, 0, 4), b"\0Y\0\0");
    }

    #[test]
    fn fails_the_nth_op_once() {
        let s = FaultyStorage::new(MemStorage::new());
        s.fail_nth_op(1);
        s.write_at(b"a", 0).expect("first op succeeds");
        assert!(s.write_at(b"b", 0).is_err());
        s.write_at(b"c", 0).expect("third op succeeds");
    }
}
