//! Working-set profiles: which parts of a file held whole (a VM's memory
//! image) a lazy clone's guest touched, in the order it first touched them
//! (parts of 8 KiB, the file cache's `PIECE`, as learned; any power of two
//! from 4 KiB to a chunk is read).
//!
//! The proxy whose clients read the file learns the profile (see
//! `filecache/learn.rs`) and sends it upstream with PROFILE_PUT; every
//! proxy on the way keeps it in its index (sled when the proxy has
//! a cache directory, so it survives a restart) and passes it on, up to the
//! proxy next to the image server. A proxy that starts fetching a file
//! whole asks its upstream for the file's profile (PROFILE_GET, answered
//! from the first proxy on the way that has it) and fetches the profile's
//! parts first, many at once.
//!
//! A profile names the version of the file it was learned on (size, mtime,
//! ctime) and is used, kept and answered only for that version: a changed
//! image drops it. It only orders fetches: a wrong one (a lying peer, a
//! guest that behaves differently) costs bytes fetched early, never wrong
//! bytes, and every index is checked against the file's size before use.
//!
//! The bytes, on the wire (XDR) and in the index:
//!
//! ```text
//! struct profile {
//!     uint64  size;          /* the version it describes */
//!     nfstime3 mtime;
//!     nfstime3 ctime;
//!     uint32  unit;          /* bytes per part: a power of two, 4 KiB to CHUNK */
//!     uint32  parts<MAX_PROFILE_PARTS>;  /* part numbers (offset / unit),
//!                                           first touched first, each once
//!                                           and below ceil(size / unit) */
//! };
//! index record: "GVWS", uint32 version 1, profile, uint32 CRC32 (IEEE) of
//! every byte before it; under the key 'p' + the file handle.
//! ```

use gvfs_nfs::FileVersion;
use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::xdr::{XdrError, XdrReader, put_opaque, put_u32, put_u64};

use crate::proto::{CHUNK, FHSIZE};

/// Most parts a profile names (512 MiB of working set at 8 KiB).
pub const MAX_PROFILE_PARTS: usize = 65_536;
/// The smallest part a profile may name.
pub const MIN_UNIT: u32 = 4096;

const RECORD_MAGIC: [u8; 4] = *b"GVWS";
const RECORD_VERSION: u32 = 1;

/// A file's learned working set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// The size of the version it was learned on.
    pub size: u64,
    /// That version's mtime (seconds, nanoseconds).
    pub mtime: (u32, u32),
    /// That version's ctime.
    pub ctime: (u32, u32),
    /// Bytes per part.
    pub unit: u32,
    /// Part numbers (offset / `unit`), first touched first, each once.
    pub parts: Vec<u32>,
}

impl Profile {
    /// A profile of the version with attributes `a`, in parts of `unit`.
    pub fn of(a: &fattr3, unit: u32, parts: Vec<u32>) -> Self {
        Self {
            size: a.size,
            mtime: (a.mtime.seconds, a.mtime.nseconds),
            ctime: (a.ctime.seconds, a.ctime.nseconds),
            unit,
            parts,
        }
    }

    /// The byte ranges of its parts, in its order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let unit = u64::from(self.unit);
        self.parts.iter().map(move |&p| {
            let start = u64::from(p) * unit;
            (start, (start + unit).min(self.size))
        })
    }

    /// The version of the file it was learned on: it holds for that one
    /// only.
    pub fn version(&self) -> FileVersion {
        let t = |(s, ns): (u32, u32)| (u64::from(s), ns);
        FileVersion {
            size: self.size,
            mtime: t(self.mtime),
            ctime: t(self.ctime),
        }
    }

    /// File bytes its parts hold.
    pub fn bytes(&self) -> u64 {
        self.ranges().map(|(a, b)| b.saturating_sub(a)).sum()
    }

    /// Appends the XDR `profile`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.size);
        for (s, ns) in [self.mtime, self.ctime] {
            put_u32(out, s);
            put_u32(out, ns);
        }
        put_u32(out, self.unit);
        put_u32(out, self.parts.len() as u32);
        for &c in &self.parts {
            put_u32(out, c);
        }
    }

    /// Reads an XDR `profile`: a unit of 4 KiB to [`CHUNK`], a power of
    /// two; at most [`MAX_PROFILE_PARTS`] parts (the count is checked
    /// before anything is allocated), each inside the file and named once.
    pub fn decode_from(r: &mut XdrReader<'_>) -> Result<Self, XdrError> {
        let size = r.u64()?;
        let mtime = (r.u32()?, r.u32()?);
        let ctime = (r.u32()?, r.u32()?);
        let unit = r.u32()?;
        if !unit.is_power_of_two() || !(MIN_UNIT..=CHUNK).contains(&unit) {
            return Err(XdrError::InvalidValue(unit));
        }
        let n = r.u32()? as usize;
        if n > MAX_PROFILE_PARTS {
            return Err(XdrError::TooLong {
                len: n,
                limit: MAX_PROFILE_PARTS,
            });
        }
        if r.rest().len() < n * 4 {
            return Err(XdrError::Truncated);
        }
        let count = size.div_ceil(u64::from(unit));
        let mut seen = std::collections::HashSet::with_capacity(n);
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let c = r.u32()?;
            if u64::from(c) >= count || !seen.insert(c) {
                return Err(XdrError::InvalidValue(c));
            }
            parts.push(c);
        }
        Ok(Self {
            size,
            mtime,
            ctime,
            unit,
            parts,
        })
    }

    /// The bytes of a kept profile: in the index, and in the
    /// `.NAME.gvfsprofile` file beside the image at the origin.
    pub fn record(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + 4 * self.parts.len());
        out.extend_from_slice(&RECORD_MAGIC);
        put_u32(&mut out, RECORD_VERSION);
        self.encode(&mut out);
        let crc = crc32fast::hash(&out);
        put_u32(&mut out, crc);
        out
    }

    /// A kept profile's bytes, if they are whole (magic, version, CRC).
    pub fn from_record(bytes: &[u8]) -> Option<Self> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32fast::hash(body).to_be_bytes() != crc || !body.starts_with(&RECORD_MAGIC) {
            return None;
        }
        let mut r = XdrReader::new(&body[4..]);
        if r.u32().ok()? != RECORD_VERSION {
            return None;
        }
        let p = Self::decode_from(&mut r).ok()?;
        r.end().ok()?;
        Some(p)
    }
}

/// The suffix of the file beside an image at the origin that keeps its
/// profile: `.NAME.gvfsprofile`.
pub const PROFILE_SUFFIX: &str = ".gvfsprofile";

/// The largest profile file read: a record of [`MAX_PROFILE_PARTS`].
pub const MAX_PROFILE_LEN: usize = 52 + 4 * MAX_PROFILE_PARTS;

/// The name of the profile file beside `name`, if `name` can have one.
pub fn profile_name(name: &str) -> Option<String> {
    let meta = gvfs_metafile::meta_name(name)?;
    let n = format!(".{name}{PROFILE_SUFFIX}");
    (meta.len() < n.len()
        && n.len() <= gvfs_metafile::format::MAX_NAME_LEN
        && !name.ends_with(PROFILE_SUFFIX))
    .then_some(n)
}

/// PROFILE_PUT's arguments: `opaque fh<64>; profile profile;`.
pub fn encode_put(out: &mut Vec<u8>, fh: &[u8], p: &Profile) {
    put_opaque(out, fh);
    p.encode(out);
}

/// Decodes PROFILE_PUT's arguments.
pub fn decode_put(bytes: &[u8]) -> Result<(Vec<u8>, Profile), XdrError> {
    let mut r = XdrReader::new(bytes);
    let fh = r.opaque(FHSIZE)?.to_vec();
    let p = Profile::decode_from(&mut r)?;
    r.end()?;
    Ok((fh, p))
}

/// Decodes PROFILE_GET's arguments: `opaque fh<64>;`.
pub fn decode_get(bytes: &[u8]) -> Result<Vec<u8>, XdrError> {
    let mut r = XdrReader::new(bytes);
    let fh = r.opaque(FHSIZE)?.to_vec();
    r.end()?;
    Ok(fh)
}

/// PROFILE_GET's results: `nfsstat3 status;` then, for NFS3_OK, the
/// profile (NFS3ERR_NOENT: none known).
pub fn encode_get_res(out: &mut Vec<u8>, p: Option<&Profile>) {
    match p {
        Some(p) => {
            put_u32(out, 0);
            p.encode(out);
        }
        None => put_u32(out, 2),
    }
}

/// Decodes PROFILE_GET's results.
pub fn decode_get_res(bytes: &[u8]) -> Result<Option<Profile>, XdrError> {
    let mut r = XdrReader::new(bytes);
    if r.u32()? != 0 {
        return Ok(None);
    }
    let p = Profile::decode_from(&mut r)?;
    r.end()?;
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gvfs_nfs::xdr::put_u64;

    fn attrs(size: u64, mtime: u32) -> fattr3 {
        gvfs_nfs::testing::file_attrs(size, mtime)
    }

    #[test]
    fn a_profile_round_trips_and_refuses_parts_outside_the_file() {
        let a = attrs(5 * u64::from(CHUNK) + 1, 7);
        let p = Profile::of(&a, CHUNK, vec![5, 0, 3]);
        let mut buf = Vec::new();
        encode_put(&mut buf, b"handle", &p);
        assert_eq!(decode_put(&buf).expect("decodes"), (b"handle".to_vec(), p));

        for bad in [vec![6], vec![1, 1]] {
            let mut buf = Vec::new();
            encode_put(&mut buf, b"h", &Profile::of(&a, CHUNK, bad.clone()));
            assert!(decode_put(&buf).is_err(), "{bad:?} was accepted");
        }
        // A count over the cap is refused before anything is allocated.
        let mut buf = Vec::new();
        put_opaque(&mut buf, b"h");
        put_u64(&mut buf, u64::MAX);
        buf.extend_from_slice(&[0; 16]);
        put_u32(&mut buf, 65536);
        put_u32(&mut buf, u32::MAX);
        assert!(matches!(decode_put(&buf), Err(XdrError::TooLong { .. })));
    }
}
