//! STORE and STORE_GUARDED: a chunk written back, durably, and only over
//! the version of the file it was fetched from when guarded.

use std::io::Cursor;

use gvfs_nfs::FileVersion;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::nfs3_types::xdr_codec::Unpack;
use gvfs_nfs::xdr::{XdrError, XdrReader, encode_into, put_opaque, put_u32, put_u64};

use crate::codec::{Codec, codec_of, compress, data_limit, unpack};
use crate::error::ChunkError;
use crate::proto::{CHUNK, FHSIZE, GUARD_LEN};

/// The arguments of STORE: one chunk of file data, compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreArgs {
    /// The file's handle.
    pub fh: Vec<u8>,
    /// Where the bytes go.
    pub offset: u64,
    /// File bytes (after decompression), at most [`CHUNK`].
    pub raw_len: u32,
    /// How `data` is encoded.
    pub codec: Codec,
    /// The bytes on the wire.
    pub data: Vec<u8>,
    /// With STORE_GUARDED: the size, mtime and ctime the file must have
    /// for the write to go ahead.
    pub guard: Option<FileVersion>,
}

impl StoreArgs {
    /// Compresses `raw` (at most [`CHUNK`] bytes) into arguments.
    pub fn new(fh: Vec<u8>, offset: u64, raw: &[u8], level: i32) -> Self {
        let (codec, data) = compress(raw, level);
        Self {
            fh,
            offset,
            raw_len: raw.len() as u32,
            codec,
            data,
            guard: None,
        }
    }

    /// Appends the XDR arguments: STORE's, or STORE_GUARDED's with a guard.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_opaque(out, &self.fh);
        put_u64(out, self.offset);
        put_u32(out, self.raw_len);
        put_u32(out, self.codec as u32);
        put_opaque(out, &self.data);
        if let Some(g) = &self.guard {
            put_u64(out, g.size);
            for t in [g.mtime3(), g.ctime3()] {
                put_u32(out, t.seconds);
                put_u32(out, t.nseconds);
            }
        }
    }

    /// Decodes STORE_GUARDED's arguments.
    pub fn decode_guarded(bytes: &[u8]) -> Result<Self, XdrError> {
        let len = bytes.len();
        let split = len.checked_sub(GUARD_LEN).ok_or(XdrError::Truncated)?;
        let mut args = Self::decode(&bytes[..split])?;
        let mut r = XdrReader::new(&bytes[split..]);
        let size = r.u64()?;
        let mut time = || -> Result<(u64, u32), XdrError> { Ok((u64::from(r.u32()?), r.u32()?)) };
        let (mtime, ctime) = (time()?, time()?);
        args.guard = Some(FileVersion { size, mtime, ctime });
        Ok(args)
    }

    /// Decodes STORE's arguments, every length capped.
    pub fn decode(bytes: &[u8]) -> Result<Self, XdrError> {
        let mut r = XdrReader::new(bytes);
        let fh = r.opaque(FHSIZE)?.to_vec();
        let offset = r.u64()?;
        let raw_len = r.u32()?;
        if raw_len > CHUNK {
            return Err(XdrError::TooLong {
                len: raw_len as usize,
                limit: CHUNK as usize,
            });
        }
        let codec = codec_of(r.u32()?)?;
        let data = r.opaque(data_limit(codec, raw_len))?.to_vec();
        r.end()?;
        Ok(Self {
            fh,
            offset,
            raw_len,
            codec,
            data,
            guard: None,
        })
    }

    /// The file bytes, checked to be exactly `raw_len` long.
    pub fn raw(self) -> Result<Vec<u8>, ChunkError> {
        unpack(self.codec, self.data, self.raw_len)
    }
}

/// Appends the XDR results of STORE.
pub fn encode_store_res(out: &mut Vec<u8>, res: &Result<fattr3, nfsstat3>) {
    match res {
        Ok(attrs) => {
            encode_into(out, &nfsstat3::NFS3_OK);
            encode_into(out, attrs);
        }
        Err(status) => encode_into(out, status),
    }
}

/// Decodes the XDR results of STORE.
pub fn decode_store_res(bytes: &[u8]) -> Result<Result<fattr3, nfsstat3>, XdrError> {
    let mut cur = Cursor::new(bytes);
    let (status, _) = nfsstat3::unpack(&mut cur)?;
    let res = if matches!(status, nfsstat3::NFS3_OK) {
        Ok(fattr3::unpack(&mut cur)?.0)
    } else {
        Err(status)
    };
    match bytes.len() - cur.position() as usize {
        0 => Ok(res),
        n => Err(XdrError::Trailing(n)),
    }
}
