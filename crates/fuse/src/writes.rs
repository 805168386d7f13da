//! UNSTABLE writes not yet covered by a COMMIT, kept to be sent again.
//!
//! FUSE hands each write over once, and the stack below answers it
//! UNSTABLE: the bytes are safe only once a COMMIT returns the same write
//! verifier as the WRITE did (RFC 1813, section 3.3.7). If the verifier
//! changed (a server restarted, a cache lost unsynced data), the kernel
//! NFS client writes its dirty pages again; this front end keeps the
//! bytes of every uncommitted write for the same purpose and sends them
//! again, FILE_SYNC, in the order they were first written.
//!
//! A file's writes are committed at `fsync`, at `close` (close-to-open,
//! as an NFS mount does), before a truncation or a time set, and when the
//! bytes kept for all files pass the budget (the writer that passes it
//! commits, so memory stays bounded and a fast writer is slowed to the
//! speed of COMMIT).
//!
//! The buffers of committed writes are used again for the next writes
//! (up to the budget): a megabyte buffer new from the allocator costs its
//! page faults and zeroing, several times the copy into it.

use std::collections::HashMap;
use std::sync::Mutex;

use gvfs_nfs::CallContext;
use gvfs_nfs::layer::lock;

use crate::inodes::Handle;

/// One write: its order, offset and bytes.
#[derive(Debug)]
pub(crate) struct Write {
    pub(crate) seq: u64,
    pub(crate) offset: u64,
    pub(crate) data: Vec<u8>,
    pub(crate) verf: [u8; 8],
}

/// A file's uncommitted writes.
#[derive(Debug)]
pub(crate) struct FileWrites {
    /// The file's handle.
    pub(crate) fh: Handle,
    /// The last writer, whose credentials a COMMIT is sent with.
    pub(crate) cx: CallContext,
    pub(crate) writes: Vec<Write>,
    bytes: u64,
}

impl FileWrites {
    /// Whether a COMMIT that answered `verf` covers every write.
    pub(crate) fn covered_by(&self, verf: [u8; 8]) -> bool {
        self.writes.iter().all(|w| w.verf == verf)
    }
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<u64, FileWrites>,
    bytes: u64,
    seq: u64,
    /// Buffers of committed writes, to copy the next writes into.
    spare: Vec<Vec<u8>>,
    spare_bytes: u64,
}

/// Uncommitted writes of every file of a mount.
#[derive(Debug)]
pub(crate) struct Uncommitted {
    state: Mutex<State>,
    budget: u64,
}

impl Uncommitted {
    /// Most bytes kept for all files together by default.
    pub(crate) const BUDGET: u64 = 128 << 20;

    /// An empty set that keeps at most about `budget` bytes.
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            state: Mutex::new(State::default()),
            budget,
        }
    }

    /// The order number of a write about to be sent.
    pub(crate) fn next_seq(&self) -> u64 {
        let mut s = lock(&self.state);
        s.seq += 1;
        s.seq
    }

    /// Keeps a write the layer below answered UNSTABLE with `verf`.
    /// Whether the kept bytes are now over the budget.
    pub(crate) fn keep(&self, ino: u64, fh: &Handle, cx: &CallContext, w: Write) -> bool {
        let mut s = lock(&self.state);
        let len = w.data.len() as u64;
        let f = s.files.entry(ino).or_insert_with(|| FileWrites {
            fh: fh.clone(),
            cx: cx.clone(),
            writes: Vec::new(),
            bytes: 0,
        });
        f.cx = cx.clone();
        f.bytes += len;
        f.writes.push(w);
        s.bytes += len;
        s.bytes > self.budget
    }

    /// A copy of `data` to write, in a buffer used before if there is one.
    pub(crate) fn buffer(&self, data: &[u8]) -> Vec<u8> {
        let spare = {
            let mut s = lock(&self.state);
            let found = s.spare.iter().rposition(|b| b.capacity() >= data.len());
            found.map(|i| {
                let b = s.spare.swap_remove(i);
                s.spare_bytes -= b.capacity() as u64;
                b
            })
        };
        match spare {
            Some(mut b) => {
                b.clear();
                b.extend_from_slice(data);
                b
            }
            None => data.to_vec(),
        }
    }

    /// Keeps the buffers of committed writes for [`buffer`](Self::buffer),
    /// as many as the budget holds.
    pub(crate) fn recycle(&self, writes: Vec<Write>) {
        let mut s = lock(&self.state);
        for w in writes {
            let cap = w.data.capacity() as u64;
            if s.spare_bytes + cap > self.budget {
                break;
            }
            s.spare_bytes += cap;
            s.spare.push(w.data);
        }
    }

    /// Takes `ino`'s writes, to commit them.
    pub(crate) fn take(&self, ino: u64) -> Option<FileWrites> {
        let mut s = lock(&self.state);
        let f = s.files.remove(&ino)?;
        s.bytes -= f.bytes;
        Some(f)
    }

    /// Puts back writes a COMMIT failed to cover, before any kept since.
    pub(crate) fn put_back(&self, ino: u64, mut f: FileWrites) {
        let mut s = lock(&self.state);
        s.bytes += f.bytes;
        if let Some(newer) = s.files.remove(&ino) {
            f.bytes += newer.bytes;
            f.cx = newer.cx;
            f.writes.extend(newer.writes);
        }
        s.files.insert(ino, f);
    }

    /// Files with writes kept.
    pub(crate) fn files(&self) -> Vec<u64> {
        lock(&self.state).files.keys().copied().collect()
    }

    /// Whether `ino` has writes kept.
    pub(crate) fn has(&self, ino: u64) -> bool {
        lock(&self.state).files.contains_key(&ino)
    }

    /// Bytes kept now.
    pub(crate) fn bytes(&self) -> u64 {
        lock(&self.state).bytes
    }

    /// Whether the kept bytes are over the budget.
    pub(crate) fn over_budget(&self) -> bool {
        self.bytes() > self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(seq: u64, verf: u8) -> Write {
        Write {
            seq,
            offset: seq * 10,
            data: vec![verf; 10],
            verf: [verf; 8],
        }
    }

    #[test]
    fn writes_are_kept_per_file_within_a_budget() {
        let u = Uncommitted::new(25);
        let fh: Handle = (&b"f"[..]).into();
        let cx = CallContext::default();
        assert!(!u.keep(7, &fh, &cx, w(1, 1)));
        assert!(!u.keep(7, &fh, &cx, w(2, 1)));
        assert!(u.keep(8, &fh, &cx, w(3, 2)), "30 bytes > 25");
        let f = u.take(7).unwrap();
        assert!(f.covered_by([1; 8]));
        assert!(!f.covered_by([2; 8]));
        assert_eq!(u.bytes(), 10);
        assert!(!u.over_budget());
        u.keep(7, &fh, &cx, w(4, 1));
        u.put_back(7, f);
        let again = u.take(7).unwrap();
        let order: Vec<u64> = again.writes.iter().map(|w| w.seq).collect();
        assert_eq!(order, vec![1, 2, 4], "older writes first");
        assert_eq!(u.files(), vec![8]);
    }

    #[test]
    fn buffers_of_committed_writes_are_used_again_within_the_budget() {
        let u = Uncommitted::new(25);
        let first = u.buffer(b"0123456789");
        let at = first.as_ptr();
        u.recycle(vec![Write {
            seq: 1,
            offset: 0,
            data: first,
            verf: [0; 8],
        }]);
        let again = u.buffer(b"abc");
        assert_eq!(again, b"abc");
        assert_eq!(again.as_ptr(), at, "the same buffer");
        let big = vec![0_u8; 100];
        u.recycle(vec![Write {
            seq: 2,
            offset: 0,
            data: big,
            verf: [0; 8],
        }]);
        assert_eq!(lock(&u.state).spare_bytes, 0, "over the budget: let go");
    }
}
