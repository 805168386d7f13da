//! FETCH, FETCH_REPEATS, FETCH_DEMAND and FETCH_CLASS: their arguments
//! and results.

use std::io::Cursor;

use gvfs_metafile::{ByteRepeat, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::nfs3_types::xdr_codec::Unpack;
use gvfs_nfs::xdr::{XdrError, XdrReader, encode_into, put_opaque, put_u32, put_u64};

use crate::codec::{Codec, codec_of, data_limit, unpack};
use crate::error::ChunkError;
use crate::have::{Have, MAX_HAVE_BYTES};
use crate::proto::{CHUNK, Class, FHSIZE, MAX_REPEATS};

/// The arguments of FETCH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchArgs {
    /// The file's handle.
    pub fh: Vec<u8>,
    /// Where the chunk starts.
    pub offset: u64,
    /// How many bytes (at most [`CHUNK`]).
    pub count: u32,
    /// Blocks of the range the caller holds already (FETCH_HAVE only).
    pub have: Option<Have>,
}

/// A successful FETCH.
#[derive(Debug, Clone)]
pub struct FetchOk {
    /// The file's attributes when the chunk was read.
    pub attrs: fattr3,
    /// File bytes in the chunk (after decompression).
    pub raw_len: u32,
    /// Whether the chunk reaches the end of the file.
    pub eof: bool,
    /// How `data` is encoded.
    pub codec: Codec,
    /// The bytes on the wire.
    pub data: Vec<u8>,
    /// Ranges of the chunk sent as zeros that repeat earlier bytes of the
    /// file (FETCH_REPEATS only), in file order.
    pub repeats: Vec<ByteRepeat>,
}

impl FetchOk {
    /// Checks the repeats against the chunk at `offset`: each inside it,
    /// its source before it, in order, not overlapping.
    pub fn check_repeats(&self, offset: u64) -> Result<(), ChunkError> {
        let end = offset + u64::from(self.raw_len);
        let mut next = offset;
        for r in &self.repeats {
            let len = u64::from(r.len);
            let to_end = r.to.checked_add(len);
            let bad = len == 0
                || r.to < next
                || to_end.is_none_or(|e| e > end)
                || r.from.checked_add(len).is_none_or(|e| e > r.to);
            if bad {
                return Err(ChunkError::RepeatOutside {
                    to: r.to,
                    len: r.len,
                    from: r.from,
                    offset,
                });
            }
            next = r.to + len;
        }
        Ok(())
    }
}

impl FetchArgs {
    /// Appends the XDR arguments.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_opaque(out, &self.fh);
        put_u64(out, self.offset);
        put_u32(out, self.count);
    }

    /// Decodes arguments, refusing handles over 64 bytes and counts over
    /// [`CHUNK`].
    pub fn decode(bytes: &[u8]) -> Result<Self, XdrError> {
        let mut r = XdrReader::new(bytes);
        let fh = r.opaque(FHSIZE)?.to_vec();
        let offset = r.u64()?;
        let count = r.u32()?;
        if count > CHUNK {
            return Err(XdrError::TooLong {
                len: count as usize,
                limit: CHUNK as usize,
            });
        }
        r.end()?;
        Ok(Self {
            fh,
            offset,
            count,
            have: None,
        })
    }
}

/// Appends the XDR results of FETCH.
pub fn encode_fetch_res(out: &mut Vec<u8>, res: &Result<FetchOk, nfsstat3>) {
    match res {
        Ok(ok) => {
            encode_into(out, &nfsstat3::NFS3_OK);
            encode_into(out, &ok.attrs);
            put_u32(out, ok.raw_len);
            put_u32(out, u32::from(ok.eof));
            put_u32(out, ok.codec as u32);
            put_opaque(out, &ok.data);
        }
        Err(status) => encode_into(out, status),
    }
}

/// Appends the XDR results of FETCH_REPEATS.
pub fn encode_fetch_repeats_res(out: &mut Vec<u8>, res: &Result<FetchOk, nfsstat3>) {
    encode_fetch_res(out, res);
    if let Ok(ok) = res {
        put_u32(out, ok.repeats.len() as u32);
        for r in &ok.repeats {
            put_u64(out, r.to);
            put_u64(out, r.from);
            put_u32(out, r.len);
        }
    }
}

/// Decodes the XDR results of FETCH, with every length capped.
pub fn decode_fetch_res(bytes: &[u8]) -> Result<Result<FetchOk, nfsstat3>, XdrError> {
    decode_fetch(bytes, false)
}

/// Decodes the XDR results of FETCH_REPEATS, with every length capped.
pub fn decode_fetch_repeats_res(bytes: &[u8]) -> Result<Result<FetchOk, nfsstat3>, XdrError> {
    decode_fetch(bytes, true)
}

fn decode_fetch(bytes: &[u8], repeats: bool) -> Result<Result<FetchOk, nfsstat3>, XdrError> {
    let mut cur = Cursor::new(bytes);
    let (status, _) = nfsstat3::unpack(&mut cur)?;
    if !matches!(status, nfsstat3::NFS3_OK) {
        if cur.position() as usize != bytes.len() {
            return Err(XdrError::Trailing(bytes.len() - cur.position() as usize));
        }
        return Ok(Err(status));
    }
    let (attrs, _) = fattr3::unpack(&mut cur)?;
    let mut r = XdrReader::new(&bytes[cur.position() as usize..]);
    let raw_len = r.u32()?;
    if raw_len > CHUNK {
        return Err(XdrError::TooLong {
            len: raw_len as usize,
            limit: CHUNK as usize,
        });
    }
    let eof = match r.u32()? {
        0 => false,
        1 => true,
        v => return Err(XdrError::InvalidValue(v)),
    };
    let codec = codec_of(r.u32()?)?;
    let data = r.opaque(data_limit(codec, raw_len))?.to_vec();
    if codec == Codec::Stored && data.len() != raw_len as usize {
        return Err(XdrError::InvalidValue(raw_len));
    }
    let mut list = Vec::new();
    if repeats {
        let n = r.u32()? as usize;
        if n > MAX_REPEATS {
            return Err(XdrError::TooLong {
                len: n,
                limit: MAX_REPEATS,
            });
        }
        list.reserve(n);
        for _ in 0..n {
            list.push(ByteRepeat {
                to: r.u64()?,
                from: r.u64()?,
                len: r.u32()?,
            });
        }
    }
    r.end()?;
    Ok(Ok(FetchOk {
        attrs,
        raw_len,
        eof,
        codec,
        data,
        repeats: list,
    }))
}

/// The file bytes of a fetched chunk: decompressed into at most `raw_len`
/// bytes, and refused unless it is exactly `raw_len` long.
pub fn decompress(ok: FetchOk) -> Result<Vec<u8>, ChunkError> {
    unpack(ok.codec, ok.data, ok.raw_len)
}

/// Appends FETCH_HAVE's XDR arguments.
pub fn encode_have_args(out: &mut Vec<u8>, args: &FetchArgs, have: &Have, demand: bool) {
    args.encode(out);
    put_u32(out, u32::from(demand));
    put_u32(out, have.block_size);
    put_opaque(out, &have.bits);
}

/// Decodes FETCH_HAVE's arguments: the FETCH (with its `have`) and whether
/// it is demand. Refuses what FETCH refuses, a bad block size, a bitmap
/// over [`MAX_HAVE_BYTES`] or an offset not on a block.
pub fn decode_have_args(bytes: &[u8]) -> Result<(FetchArgs, bool), XdrError> {
    let mut r = XdrReader::new(bytes);
    let mut args = fetch_args(&mut r)?;
    let demand = bool_of(r.u32()?)?;
    args.have = Some(have_of(&mut r, args.offset)?);
    r.end()?;
    Ok((args, demand))
}

/// Appends FETCH_CLASS's XDR arguments: the FETCH, its class, and the
/// blocks the caller holds when it names any.
pub fn encode_class_args(out: &mut Vec<u8>, args: &FetchArgs, class: Class) {
    args.encode(out);
    put_u32(out, class.wire());
    match args.have.as_ref().filter(|h| !h.is_empty()) {
        Some(have) => {
            put_u32(out, 1);
            put_u32(out, have.block_size);
            put_opaque(out, &have.bits);
        }
        None => put_u32(out, 0),
    }
}

/// Decodes FETCH_CLASS's arguments: the FETCH (with its `have`, if any)
/// and its class. Refuses what FETCH_HAVE refuses and a class over 3.
pub fn decode_class_args(bytes: &[u8]) -> Result<(FetchArgs, Class), XdrError> {
    let mut r = XdrReader::new(bytes);
    let mut args = fetch_args(&mut r)?;
    let n = r.u32()?;
    let class = Class::from_wire(n).ok_or(XdrError::InvalidValue(n))?;
    if bool_of(r.u32()?)? {
        args.have = Some(have_of(&mut r, args.offset)?);
    }
    r.end()?;
    Ok((args, class))
}

/// FETCH's arguments at the front of a longer call, counts over [`CHUNK`]
/// refused.
fn fetch_args(r: &mut XdrReader<'_>) -> Result<FetchArgs, XdrError> {
    let fh = r.opaque(FHSIZE)?.to_vec();
    let offset = r.u64()?;
    let count = r.u32()?;
    if count > CHUNK {
        return Err(XdrError::TooLong {
            len: count as usize,
            limit: CHUNK as usize,
        });
    }
    Ok(FetchArgs {
        fh,
        offset,
        count,
        have: None,
    })
}

fn bool_of(v: u32) -> Result<bool, XdrError> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(XdrError::InvalidValue(v)),
    }
}

/// A have bitmap (block size, then the bits) for a range at `offset`:
/// a power-of-two block size in bounds, the offset on a block, at most
/// [`MAX_HAVE_BYTES`] of bits.
fn have_of(r: &mut XdrReader<'_>, offset: u64) -> Result<Have, XdrError> {
    let block_size = r.u32()?;
    let bits = r.opaque(MAX_HAVE_BYTES)?.to_vec();
    let bad_size =
        !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size);
    if bad_size || !offset.is_multiple_of(u64::from(block_size)) {
        return Err(XdrError::InvalidValue(block_size));
    }
    Ok(Have { block_size, bits })
}
