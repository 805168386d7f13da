//! The record of a file-cache entry: what the index keeps (under `f` and
//! the file handle) for a finished file, so that a restart keeps the file
//! and knows which of its chunks hold writes not yet written back.
//!
//! Record version 1. All integers are little-endian.
//!
//! ```text
//!  off   len field
//!    0     4 magic "GVFC"
//!    4     4 record version (RECORD_VERSION, 1)
//!    8     4 flags: bit 0 DIRTY, the file holds writes not yet written
//!            back; other bits must be 0
//!   12    84 upstream's attributes (below): the version fetched, or the
//!            one the last write-back left
//! with DIRTY only:
//!   96    84 the attributes clients see; their size covers the writes
//!            under way (a record lists chunks before their bytes land)
//!  180     4 N, the number of dirty chunks
//!  184   4*N the dirty chunks' indexes (written in ascending order), each
//!            below ceil(size / CHUNK) of the attributes clients see
//! end-4    4 CRC32 (IEEE, crc32fast) of every byte before it
//! ```
//! A record is exactly 100 bytes, or 188 + 4N with DIRTY.
//!
//! Attributes: an NFSv3 `fattr3` (RFC 1813 section 2.6), field by field:
//! ```text
//!  off len field
//!    0   4 type (ftype3: 1 regular file .. 7 FIFO)
//!    4   4 mode
//!    8   4 nlink
//!   12   4 uid
//!   16   4 gid
//!   20   8 size
//!   28   8 used
//!   36   8 rdev: major, minor (u32 each)
//!   44   8 fsid
//!   52   8 fileid
//!   60   8 atime: seconds, nanoseconds (u32 each)
//!   68   8 mtime: seconds, nanoseconds
//!   76   8 ctime: seconds, nanoseconds
//! ```
//!
//! Before the format had a number, builds wrote what is read here as
//! version 0: no magic, flags or CRC; upstream's attributes as XDR (the
//! fields above, big-endian) and, when the file held writes, the local
//! attributes, N and the N chunk indexes, XDR too. Such a record still
//! loads (it starts with the big-endian file type, three zero bytes, never
//! the magic) and is written as version 1 the next time the entry is
//! recorded.
//!
//! A record that does not load ([`RecordError`]) is as if there were none:
//! the file it describes is deleted when the cache is opened.

use crate::chunks::chunk_count;
use crate::error::RecordError;
use crate::versions::Versions;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, ftype3, nfstime3, specdata3};

/// Record magic.
const RECORD_MAGIC: [u8; 4] = *b"GVFC";
/// The record version written.
const RECORD_VERSION: u32 = 1;
/// Flag: the file holds writes not yet written back.
const DIRTY: u32 = 1 << 0;
/// Bytes of one set of attributes.
pub(crate) const ATTRS_LEN: usize = 84;
/// Bytes before the upstream attributes: magic, version, flags.
const HEADER_LEN: usize = 12;

/// The record of `v`: upstream's attributes, and when it holds writes,
/// the attributes clients see (their size covering the writes under way)
/// and the dirty chunks.
pub(crate) fn encode_record(v: &Versions) -> Vec<u8> {
    let dirty = !v.dirty.is_empty();
    let mut out = Vec::with_capacity(HEADER_LEN + 2 * ATTRS_LEN + 12 + 4 * v.dirty.len());
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&RECORD_VERSION.to_le_bytes());
    out.extend_from_slice(&(if dirty { DIRTY } else { 0 }).to_le_bytes());
    put_attrs(&mut out, &v.upstream);
    if dirty {
        let mut local = v.local.clone();
        local.size = local.size.max(v.reserved);
        put_attrs(&mut out, &local);
        out.extend_from_slice(&(v.dirty.len() as u32).to_le_bytes());
        for c in v.dirty.keys() {
            out.extend_from_slice(&(*c as u32).to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The entry's versions from a record of version 1, or of version 0 (no
/// magic), with its dirty chunks counted as durable (the record was).
pub(crate) fn decode_record(bytes: &[u8]) -> Result<Versions, RecordError> {
    let (body, order) = if bytes.starts_with(&RECORD_MAGIC) {
        (checked_body(bytes)?, Order::Little)
    } else if bytes.starts_with(&[0, 0, 0]) {
        (bytes, Order::Big)
    } else {
        return Err(RecordError::BadMagic);
    };
    let mut r = Reader { bytes: body, order };
    let dirty = match order {
        Order::Little => match r.u32()? {
            0 => false,
            DIRTY => true,
            other => return Err(RecordError::UnknownFlags(other)),
        },
        // Version 0 says it by what follows upstream's attributes.
        Order::Big => body.len() > ATTRS_LEN,
    };
    let mut v = Versions::new(r.attrs()?);
    if dirty {
        let local = r.attrs()?;
        let most = chunk_count(local.size);
        let count = r.u32()?;
        if count as usize > most {
            return Err(RecordError::TooManyChunks {
                count,
                chunks: most,
            });
        }
        for _ in 0..count {
            let chunk = r.u32()?;
            if chunk as usize >= most {
                return Err(RecordError::ChunkPastEnd {
                    chunk,
                    chunks: most,
                });
            }
            v.dirty.insert(chunk as usize, 0);
        }
        v.durable = v.dirty.keys().copied().collect();
        v.local = local;
    }
    match r.bytes.len() {
        0 => Ok(v),
        n => Err(RecordError::Trailing(n)),
    }
}

/// A version 1 record's bytes after the magic and version, before the
/// CRC, once the version is one this build reads and the CRC matches.
fn checked_body(bytes: &[u8]) -> Result<&[u8], RecordError> {
    let version = bytes
        .get(4..8)
        .ok_or(RecordError::Truncated)?
        .try_into()
        .map(u32::from_le_bytes)
        .map_err(|_| RecordError::Truncated)?;
    if version != RECORD_VERSION {
        return Err(RecordError::Version(version));
    }
    let split = bytes
        .len()
        .checked_sub(4)
        .filter(|&s| s >= HEADER_LEN + ATTRS_LEN)
        .ok_or(RecordError::Truncated)?;
    let (covered, crc) = bytes.split_at(split);
    if crc32fast::hash(covered).to_le_bytes() != crc {
        return Err(RecordError::Checksum);
    }
    Ok(&covered[8..])
}

/// Appends `a`'s bytes (the layout above, little-endian).
pub(crate) fn put_attrs(out: &mut Vec<u8>, a: &fattr3) {
    for w in [a.type_ as u32, a.mode, a.nlink, a.uid, a.gid] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&a.size.to_le_bytes());
    out.extend_from_slice(&a.used.to_le_bytes());
    for w in [a.rdev.specdata1, a.rdev.specdata2] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&a.fsid.to_le_bytes());
    out.extend_from_slice(&a.fileid.to_le_bytes());
    for t in [a.atime, a.mtime, a.ctime] {
        out.extend_from_slice(&t.seconds.to_le_bytes());
        out.extend_from_slice(&t.nseconds.to_le_bytes());
    }
}

/// Attributes from the first [`ATTRS_LEN`] bytes of `bytes` (the layout
/// above, little-endian).
pub(crate) fn get_attrs(bytes: &[u8]) -> Result<fattr3, RecordError> {
    Reader {
        bytes,
        order: Order::Little,
    }
    .attrs()
}

/// The byte order of a record: version 1's, or version 0's XDR.
#[derive(Debug, Clone, Copy)]
enum Order {
    Little,
    Big,
}

/// Reads a record's fields front to back.
struct Reader<'a> {
    bytes: &'a [u8],
    order: Order,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(RecordError::Truncated)?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take()?;
        Ok(match self.order {
            Order::Little => u32::from_le_bytes(b),
            Order::Big => u32::from_be_bytes(b),
        })
    }

    fn u64(&mut self) -> Result<u64, RecordError> {
        let b = self.take()?;
        Ok(match self.order {
            Order::Little => u64::from_le_bytes(b),
            Order::Big => u64::from_be_bytes(b),
        })
    }

    fn time(&mut self) -> Result<nfstime3, RecordError> {
        Ok(nfstime3 {
            seconds: self.u32()?,
            nseconds: self.u32()?,
        })
    }

    fn attrs(&mut self) -> Result<fattr3, RecordError> {
        let type_ = match self.u32()? {
            1 => ftype3::NF3REG,
            2 => ftype3::NF3DIR,
            3 => ftype3::NF3BLK,
            4 => ftype3::NF3CHR,
            5 => ftype3::NF3LNK,
            6 => ftype3::NF3SOCK,
            7 => ftype3::NF3FIFO,
            other => return Err(RecordError::FileType(other)),
        };
        Ok(fattr3 {
            type_,
            mode: self.u32()?,
            nlink: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            size: self.u64()?,
            used: self.u64()?,
            rdev: specdata3 {
                specdata1: self.u32()?,
                specdata2: self.u32()?,
            },
            fsid: self.u64()?,
            fileid: self.u64()?,
            atime: self.time()?,
            mtime: self.time()?,
            ctime: self.time()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileCache;
    use crate::index::{MemIndex, MetaIndex};
    use crate::names::{file_name, index_key};
    use crate::tests::attrs;
    use gvfs_ext::CHUNK;
    use gvfs_nfs::xdr::{encode_into, put_u32};
    use std::sync::Arc;

    /// Upstream's attributes, with every field told apart.
    fn upstream() -> fattr3 {
        let mut a = attrs(5 * u64::from(CHUNK) + 17, 1_700_000_000);
        a.mode = 0o640;
        a.uid = 1000;
        a.gid = 100;
        a.used = 4 << 20;
        a.rdev = specdata3 {
            specdata1: 3,
            specdata2: 4,
        };
        a.fsid = 0x0102_0304_0506_0708;
        a.fileid = 0x1122_3344_5566_7788;
        a.atime.nseconds = 1;
        a.mtime.nseconds = 2;
        a.ctime = nfstime3 {
            seconds: 1_700_000_009,
            nseconds: 3,
        };
        a
    }

    /// Versions holding writes in chunks 0 and 6, the file grown to 7
    /// chunks by the writes, and a write under way reaching further.
    fn dirty() -> Versions {
        let mut v = Versions::new(upstream());
        v.local.size = 6 * u64::from(CHUNK) + 5;
        v.local.mtime.seconds += 60;
        v.dirty.insert(0, 3);
        v.dirty.insert(6, 4);
        v.reserved = 6 * u64::from(CHUNK) + 9;
        v
    }

    /// A record as builds before version 1 wrote it (version 0): XDR,
    /// nothing around it.
    fn version_0(v: &Versions) -> Vec<u8> {
        let mut out = Vec::new();
        encode_into(&mut out, &v.upstream);
        if !v.dirty.is_empty() {
            let mut local = v.local.clone();
            local.size = local.size.max(v.reserved);
            encode_into(&mut out, &local);
            put_u32(&mut out, v.dirty.len() as u32);
            for c in v.dirty.keys() {
                put_u32(&mut out, *c as u32);
            }
        }
        out
    }

    /// What a record must give back of `v`: a loaded record's dirty
    /// chunks are durable, and the size it gives covers the writes under
    /// way.
    fn assert_loaded(got: &Versions, v: &Versions) {
        // fattr3 has no PartialEq: its XDR says every field.
        let xdr = |a: &fattr3| {
            let mut out = Vec::new();
            encode_into(&mut out, a);
            out
        };
        assert_eq!(xdr(&got.upstream), xdr(&v.upstream));
        let mut local = v.local.clone();
        if !v.dirty.is_empty() {
            local.size = local.size.max(v.reserved);
        }
        assert_eq!(xdr(&got.local), xdr(&local));
        let chunks: Vec<usize> = v.dirty.keys().copied().collect();
        assert_eq!(got.dirty.keys().copied().collect::<Vec<_>>(), chunks);
        assert_eq!(got.durable.iter().copied().collect::<Vec<_>>(), chunks);
    }

    #[test]
    fn a_version_0_record_loads() {
        let clean = Versions::new(upstream());
        let bytes = version_0(&clean);
        assert_eq!(bytes.len(), ATTRS_LEN);
        assert_loaded(&decode_record(&bytes).expect("clean record"), &clean);
        let v = dirty();
        let bytes = version_0(&v);
        assert_eq!(bytes.len(), 2 * ATTRS_LEN + 4 + 4 * 2);
        assert_loaded(&decode_record(&bytes).expect("dirty record"), &v);
    }

    #[test]
    fn a_version_1_record_round_trips() {
        let clean = Versions::new(upstream());
        let bytes = encode_record(&clean);
        assert_eq!(bytes.len(), 100);
        assert_eq!(&bytes[..8], b"GVFC\x01\x00\x00\x00");
        assert_loaded(&decode_record(&bytes).expect("clean record"), &clean);
        let v = dirty();
        let bytes = encode_record(&v);
        assert_eq!(bytes.len(), 188 + 4 * 2);
        assert_loaded(&decode_record(&bytes).expect("dirty record"), &v);
        // A version 0 record is written back as version 1.
        let old = decode_record(&version_0(&v)).expect("version 0");
        assert_eq!(encode_record(&old), bytes);
    }

    #[test]
    fn a_bad_magic_or_a_newer_version_is_refused_by_name() {
        let good = encode_record(&dirty());
        let mut bad = good.clone();
        bad[..4].copy_from_slice(b"GVFX");
        assert_eq!(decode_record(&bad).err(), Some(RecordError::BadMagic));
        let mut newer = good.clone();
        newer[4..8].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode_record(&newer).err(), Some(RecordError::Version(2)));
        let text = RecordError::Version(2).to_string();
        assert!(text.contains("version 2"), "{text}");
        assert_eq!(decode_record(b"").err(), Some(RecordError::BadMagic));
    }

    #[test]
    fn a_damaged_record_is_refused() {
        let good = encode_record(&dirty());
        for at in [8, 12, 100, good.len() - 5] {
            let mut flipped = good.clone();
            flipped[at] ^= 0x40;
            assert_eq!(
                decode_record(&flipped).err(),
                Some(RecordError::Checksum),
                "byte {at}"
            );
        }
        for len in [5, 8, 99] {
            assert_eq!(
                decode_record(&good[..len]).err(),
                Some(RecordError::Truncated),
                "{len} bytes"
            );
        }
        // Version 0 has no checksum: what it says is checked.
        let mut v = dirty();
        v.dirty.insert(7, 5);
        assert_eq!(
            decode_record(&version_0(&v)).err(),
            Some(RecordError::ChunkPastEnd {
                chunk: 7,
                chunks: 7
            })
        );
        let mut long = version_0(&dirty());
        long.extend_from_slice(&[0; 4]);
        assert_eq!(decode_record(&long).err(), Some(RecordError::Trailing(4)));
        let clean = version_0(&Versions::new(upstream()));
        assert_eq!(
            decode_record(&clean[..ATTRS_LEN - 1]).err(),
            Some(RecordError::Truncated)
        );
    }

    #[test]
    fn a_cache_keeps_a_file_with_a_version_0_record_and_drops_one_with_a_bad_record() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let index: Arc<dyn MetaIndex> = Arc::new(MemIndex::new(100));
        let v = dirty();
        let size = v.local.size.max(v.reserved);
        let mut newer = encode_record(&v);
        newer[4..8].copy_from_slice(&9u32.to_le_bytes());
        let files = [
            (b"old".as_slice(), version_0(&v)),
            (b"new".as_slice(), encode_record(&v)),
            (b"bad".as_slice(), b"GVFX and then some".to_vec()),
            (b"future".as_slice(), newer),
        ];
        for (fh, record) in &files {
            let f = std::fs::File::create(dir.path().join(file_name(fh)))
                .unwrap_or_else(|e| panic!("{e}"));
            f.set_len(size).unwrap_or_else(|e| panic!("{e}"));
            index
                .put(&index_key(fh), record)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let c = FileCache::open(dir.path(), Some(index), 1 << 30, Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        for (fh, _) in &files[..2] {
            let f = c.get(fh).unwrap_or_else(|| panic!("{fh:?} not kept"));
            assert!(f.is_dirty(), "{fh:?} lost its writes");
            assert_eq!(f.local_attrs().size, size);
        }
        // As with no record: not kept, and the file is deleted.
        for (fh, _) in &files[2..] {
            assert!(c.get(fh).is_none(), "{fh:?} kept");
            assert!(
                !dir.path().join(file_name(fh)).exists(),
                "{fh:?} left behind"
            );
        }
    }
}
