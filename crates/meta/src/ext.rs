//! The gvfs extension RPC program: what proxies say to each other that NFS
//! cannot, on the same connection as NFS (so inside the TLS tunnel when
//! there is one).
//!
//! Version 1 has eight procedures besides NULL (the eighth, FETCH_HAVE, is
//! specified in `ext/have.rs`):
//!
//! ```text
//! program GVFS_EXT  0x20475646  ("user-defined" range, RFC 5531 section 8.3)
//! version 1
//!   0  NULL   (void) -> void
//!   1  FETCH  (fetch_args) -> fetch_res
//!   2  STORE  (store_args) -> store_res
//!   3  FETCH_REPEATS (fetch_args) -> fetch_repeats_res
//!   4  STORE_GUARDED (store_guarded_args) -> store_res
//!   5  FETCH_DEMAND  (fetch_args) -> fetch_repeats_res
//!   6  PROFILE_PUT   (profile_put_args) -> nfsstat3
//!   7  PROFILE_GET   (opaque fh<64>) -> profile_get_res
//!
//! struct fetch_args {
//!     opaque   fh<64>;     /* the file's NFSv3 handle, as upstream gave it */
//!     uint64   offset;     /* clients ask at multiples of CHUNK */
//!     uint32   count;      /* at most CHUNK */
//! };
//! union fetch_res switch (nfsstat3 status) {
//! case NFS3_OK:
//!     fattr3   attrs;      /* the file's attributes when it was read */
//!     uint32   raw_len;    /* bytes of file data the chunk holds */
//!     bool     eof;        /* the chunk ends at the end of the file */
//!     uint32   codec;      /* 0 = stored, 1 = one zstd frame */
//!     opaque   data<>;     /* at most CHUNK + MAX_FRAME_SLACK bytes */
//! default:
//!     void;
//! };
//! struct store_args {      /* write one chunk back, durably */
//!     opaque   fh<64>;
//!     uint64   offset;
//!     uint32   raw_len;    /* at most CHUNK */
//!     uint32   codec;
//!     opaque   data<>;
//! };
//! union store_res switch (nfsstat3 status) {
//! case NFS3_OK:
//!     fattr3   attrs;      /* the file's attributes after the write */
//! default:
//!     void;
//! };
//! struct store_guarded_args {  /* STORE, only if the file is as expected */
//!     store_args args;
//!     wcc_attr   guard;    /* size, mtime, ctime the file must have now */
//! };                       /* else NFS3ERR_NOT_SYNC, nothing written;  */
//!                          /* attrs are then read after the write      */
//! struct repeat {          /* bytes to..to+len are those at from..from+len */
//!     uint64   to;         /* inside the chunk */
//!     uint64   from;       /* from + len <= to: earlier in the file */
//!     uint32   len;
//! };
//! union fetch_repeats_res switch (nfsstat3 status) {
//! case NFS3_OK:
//!     (fetch_res's fields)
//!     repeat   repeats<256>; /* sent as zeros, in file order */
//! default:
//!     void;
//! };
//! ```
//!
//! STORE_GUARDED is STORE for a write-back that must not overwrite a change
//! made at the origin since the copy was fetched: the answering proxy
//! compares the file's size, mtime and ctime (GETATTR through its layers)
//! with the guard before it writes, and answers with a GETATTR after the
//! write, the guard of the caller's next chunk. A caller whose upstream
//! answers it with PROC_UNAVAIL (an older proxy) warns and uses STORE.
//!
//! FETCH_REPEATS is FETCH for a caller that fills repeated bytes itself:
//! where the file's metadata says a range repeats an earlier one, the
//! server sends zeros there (which compress to nothing) and says so. Only
//! a FETCH of a whole chunk lists repeats; part of a chunk comes whole. A
//! caller whose upstream answers it with PROC_UNAVAIL (an older proxy)
//! uses FETCH from then on.
//!
//! FETCH_DEMAND is FETCH_REPEATS for bytes a reader waits for now (a lazy
//! clone's guest faulting on its memory: usually a few 8 KiB pieces of a
//! chunk, not the whole chunk), not a chunk a background stream fetches
//! ahead: a proxy that fetches them from its own upstream in turn asks
//! with FETCH_DEMAND too, and holds back its background stream
//! while demand fetches come (`filecache/fetch.rs`), so that at every depth
//! of a cascade demand goes first. A caller whose upstream answers it with
//! PROC_UNAVAIL (an older proxy) uses FETCH_REPEATS from then on.
//!
//! PROFILE_PUT and PROFILE_GET carry a file's working-set profile (the
//! chunks a guest touched first, `profile.rs`): PUT keeps it at every proxy
//! up to the image server's (NFS3_OK, or an error status), GET answers it
//! from the first that has it (`profile_get_res`: NFS3_OK and the profile,
//! or NFS3ERR_NOENT). An older proxy answers PROC_UNAVAIL: no profiles.
//!
//! A whole file is fetched as a stream of FETCH calls, several in flight at
//! once, each answered with one compressed chunk: the server side reads and
//! compresses chunks in parallel, the client side decompresses them into its
//! file cache as they arrive. Every length a peer sends is checked before
//! anything is allocated for it, and a chunk never decompresses to more
//! than `raw_len <= CHUNK` bytes.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::net::client::{ClientError, RpcClient};
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3, nfstime3};
use gvfs_nfs::nfs3_types::xdr_codec::Unpack;
use gvfs_nfs::rpc::{ReplyError, ReplyStatus};
use gvfs_nfs::xdr::{XdrError, XdrReader, encode_into, put_opaque, put_u32};
use gvfs_nfs::{BoxFuture, Credentials};

use crate::error::ChunkError;
use crate::format::ByteRepeat;
use crate::profile::Profile;

mod have;
pub use have::{Have, MAX_HAVE_BYTES, PROC_FETCH_HAVE, decode_have_args, encode_have_args};

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
/// Most repeats one FETCH_REPEATS answer lists (one per 4 KiB block).
pub const MAX_REPEATS: usize = (CHUNK / 4096) as usize;
/// Bytes of file data per chunk (and the most one FETCH may ask for).
pub const CHUNK: u32 = 1 << 20;
/// What a zstd frame may add to its input before it is sent stored instead.
pub const MAX_FRAME_SLACK: u32 = 4096;
/// Bytes of a STORE_GUARDED guard (a `wcc_attr`: size and two `nfstime3`).
const GUARD_LEN: usize = 24;
/// Largest NFSv3 file handle (RFC 1813, NFS3_FHSIZE).
pub(crate) const FHSIZE: usize = 64;
/// Longest wait for the upstream's answer to the extension's NULL; with
/// none by then, the next whole-file fetch asks again.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// How a chunk's bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As they are (they did not compress).
    Stored = 0,
    /// One zstd frame.
    Zstd = 1,
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
        let offset = get_u64(&mut r)?;
        let count = r.u32()?;
        if count > CHUNK {
            return Err(XdrError::TooLong {
                len: count as usize,
                limit: CHUNK as usize,
            });
        }
        end(&r)?;
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
                to: get_u64(&mut r)?,
                from: get_u64(&mut r)?,
                len: r.u32()?,
            });
        }
    }
    end(&r)?;
    Ok(Ok(FetchOk {
        attrs,
        raw_len,
        eof,
        codec,
        data,
        repeats: list,
    }))
}

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
    pub guard: Option<StoreGuard>,
}

/// What a file must still be for a STORE_GUARDED to write it (on the wire,
/// an NFSv3 `wcc_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreGuard {
    /// Size.
    pub size: u64,
    /// Modification time.
    pub mtime: nfstime3,
    /// Change time.
    pub ctime: nfstime3,
}

impl StoreGuard {
    /// The guard for a file with attributes `a`.
    pub fn of(a: &fattr3) -> Self {
        Self {
            size: a.size,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }

    /// Whether a file with attributes `a` passes it.
    pub fn passes(&self, a: &fattr3) -> bool {
        self.size == a.size && self.mtime == a.mtime && self.ctime == a.ctime
    }
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
            for t in [g.mtime, g.ctime] {
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
        let size = get_u64(&mut r)?;
        let mut time = || -> Result<nfstime3, XdrError> {
            Ok(nfstime3 {
                seconds: r.u32()?,
                nseconds: r.u32()?,
            })
        };
        let (mtime, ctime) = (time()?, time()?);
        args.guard = Some(StoreGuard { size, mtime, ctime });
        Ok(args)
    }

    /// Decodes STORE's arguments, every length capped.
    pub fn decode(bytes: &[u8]) -> Result<Self, XdrError> {
        let mut r = XdrReader::new(bytes);
        let fh = r.opaque(FHSIZE)?.to_vec();
        let offset = get_u64(&mut r)?;
        let raw_len = r.u32()?;
        if raw_len > CHUNK {
            return Err(XdrError::TooLong {
                len: raw_len as usize,
                limit: CHUNK as usize,
            });
        }
        let codec = codec_of(r.u32()?)?;
        let data = r.opaque(data_limit(codec, raw_len))?.to_vec();
        end(&r)?;
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

fn codec_of(v: u32) -> Result<Codec, XdrError> {
    match v {
        0 => Ok(Codec::Stored),
        1 => Ok(Codec::Zstd),
        v => Err(XdrError::InvalidValue(v)),
    }
}

fn data_limit(codec: Codec, raw_len: u32) -> usize {
    match codec {
        Codec::Stored => raw_len as usize,
        Codec::Zstd => (CHUNK + MAX_FRAME_SLACK) as usize,
    }
}

fn unpack(codec: Codec, data: Vec<u8>, raw_len: u32) -> Result<Vec<u8>, ChunkError> {
    let raw = match codec {
        Codec::Stored => data,
        Codec::Zstd => {
            zstd::bulk::decompress(&data, raw_len as usize).map_err(|e| ChunkError::BadFrame {
                source: Arc::new(e),
            })?
        }
    };
    if raw.len() != raw_len as usize {
        return Err(ChunkError::WrongLength {
            got: raw.len(),
            announced: raw_len,
        });
    }
    Ok(raw)
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn get_u64(r: &mut XdrReader<'_>) -> Result<u64, XdrError> {
    let hi = u64::from(r.u32()?);
    Ok(hi << 32 | u64::from(r.u32()?))
}

pub(crate) fn end(r: &XdrReader<'_>) -> Result<(), XdrError> {
    match r.rest().len() {
        0 => Ok(()),
        n => Err(XdrError::Trailing(n)),
    }
}

/// The zstd level chunks are compressed at: fast, and most of what a VM
/// image saves comes from runs of zeros and repeats any level finds.
pub const LEVEL: i32 = 3;

/// Compresses one chunk: a zstd frame, or the bytes as they are when the
/// frame would not be smaller.
pub fn compress(raw: &[u8], level: i32) -> (Codec, Vec<u8>) {
    match zstd::bulk::compress(raw, level) {
        Ok(z) if z.len() < raw.len() => (Codec::Zstd, z),
        _ => (Codec::Stored, raw.to_vec()),
    }
}

/// The file bytes of a fetched chunk: decompressed into at most `raw_len`
/// bytes, and refused unless it is exactly `raw_len` long.
pub fn decompress(ok: FetchOk) -> Result<Vec<u8>, ChunkError> {
    unpack(ok.codec, ok.data, ok.raw_len)
}

/// Why a FETCH (or STORE) through a [`ChunkSource`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Upstream answered with an NFS error.
    #[error("upstream answered {0:?}")]
    Nfs(nfsstat3),
    /// Upstream did not answer, refused us, or did not run the call.
    #[error(transparent)]
    Transport(#[from] ClientError),
    /// Upstream's results do not decode.
    #[error("{server}: bad {call} reply: {source}")]
    BadReply {
        /// Where the client connects.
        server: String,
        /// Which call ("FETCH", "STORE").
        call: &'static str,
        /// What is wrong with the results.
        source: XdrError,
    },
}

/// Where chunks of whole files come from: an upstream that speaks this
/// program (or, in tests, anything else).
pub trait ChunkSource: Send + Sync + 'static {
    /// One FETCH, asked with FETCH_DEMAND when a reader waits for it.
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        urgency: Urgency,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>>;

    /// Keeps a file's working-set profile upstream (PROFILE_PUT). A source
    /// that keeps none does nothing.
    fn put_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
        _profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async { Ok(()) })
    }

    /// The working-set profile upstream knows for a file (PROFILE_GET).
    fn get_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<Profile>, FetchError>> {
        Box::pin(async { Ok(None) })
    }

    /// One STORE: a chunk written back; the file's attributes after it.
    /// With `args.guard`, only if the file still has those attributes
    /// (else `FetchError::Nfs(NFS3ERR_NOT_SYNC)`), where the source can
    /// check; one that cannot (an older proxy) stores without the check.
    fn store<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>>;

    /// Whether the source answers FETCH at all (asked once, remembered).
    fn supported(&self) -> BoxFuture<'_, bool>;

    /// One FETCH sent on as it came, its XDR results returned as they came:
    /// what a middle proxy without a file cache does.
    fn forward<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>>;
}

/// The extension program spoken to an upstream over its NFS connection.
pub struct ExtClient {
    client: RpcClient,
    /// Whether the upstream speaks the program, once it has answered;
    /// callers that come while it is being asked wait for that answer.
    speaks: tokio::sync::OnceCell<bool>,
    /// Longest wait for that answer ([`PROBE_TIMEOUT`]).
    probe_timeout: Duration,
    /// Whether to ask with FETCH_REPEATS (until the upstream refuses it).
    repeats: std::sync::atomic::AtomicBool,
    /// Whether to store with STORE_GUARDED (until the upstream refuses it).
    guards: std::sync::atomic::AtomicBool,
    /// Whether to ask demand with FETCH_DEMAND (until the upstream refuses it).
    demand: std::sync::atomic::AtomicBool,
    /// Whether the upstream keeps profiles (until it refuses PROFILE_*).
    profiles: std::sync::atomic::AtomicBool,
    /// Whether to say which blocks are held with FETCH_HAVE (until the
    /// upstream refuses it).
    have: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ExtClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtClient")
            .field("server", &self.client.server())
            .finish()
    }
}

impl ExtClient {
    /// The program over `client`'s connection.
    pub fn new(client: RpcClient) -> Arc<Self> {
        Arc::new(Self {
            client,
            speaks: tokio::sync::OnceCell::new(),
            probe_timeout: PROBE_TIMEOUT,
            repeats: std::sync::atomic::AtomicBool::new(true),
            guards: std::sync::atomic::AtomicBool::new(true),
            demand: std::sync::atomic::AtomicBool::new(true),
            profiles: std::sync::atomic::AtomicBool::new(true),
            have: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Calls `proc_` unless the upstream refused it before (`flag`); on
    /// PROC_UNAVAIL notes that in `flag` and answers `Ok(None)`.
    async fn call_new(
        &self,
        flag: &std::sync::atomic::AtomicBool,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Option<Vec<u8>>, FetchError> {
        use std::sync::atomic::Ordering::Relaxed;
        if !flag.load(Relaxed) {
            return Ok(None);
        }
        match self.client.call(PROGRAM, VERSION, proc_, cred, args).await {
            Ok(reply) => Ok(Some(reply.to_vec())),
            Err(ClientError::Rpc {
                error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                ..
            }) => {
                tracing::info!(
                    server = %self.client.server(),
                    proc_,
                    "upstream does not know this extension procedure (an older gvfs-proxy)"
                );
                flag.store(false, Relaxed);
                Ok(None)
            }
            Err(e) => Err(FetchError::Transport(e)),
        }
    }

    async fn call(
        &self,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Vec<u8>, FetchError> {
        match self.client.call(PROGRAM, VERSION, proc_, cred, args).await {
            Ok(reply) => Ok(reply.to_vec()),
            Err(e) => Err(FetchError::Transport(e)),
        }
    }

    /// Sends the extension's NULL: `Ok` with whether the upstream speaks
    /// it, `Err` when no answer came (ask again next time).
    async fn probe(&self) -> Result<bool, ()> {
        let cred = Credentials::default();
        let call = self.client.call(PROGRAM, VERSION, PROC_NULL, &cred, &[]);
        match tokio::time::timeout(self.probe_timeout, call).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(ClientError::Rpc { error, .. })) => {
                tracing::info!(
                    server = %self.client.server(),
                    "upstream does not speak the gvfs extension ({error}); \
                     compress-and-copy files are read block by block"
                );
                Ok(false)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "extension probe got no answer");
                Err(())
            }
            Err(_) => {
                tracing::debug!(after = ?self.probe_timeout, "extension probe got no answer");
                Err(())
            }
        }
    }
}

impl ChunkSource for ExtClient {
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        urgency: Urgency,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::with_capacity(args.fh.len() + 24);
            args.encode(&mut buf);
            let with_repeats = self.repeats.load(std::sync::atomic::Ordering::Relaxed);
            let held = match &args.have {
                Some(have) if with_repeats && !have.is_empty() => {
                    let mut buf = Vec::with_capacity(buf.len() + 48);
                    encode_have_args(&mut buf, args, have, urgency == Urgency::Demand);
                    self.call_new(&self.have, PROC_FETCH_HAVE, cred, &buf)
                        .await?
                }
                _ => None,
            };
            let demand = if held.is_some() {
                held
            } else if urgency == Urgency::Demand && with_repeats {
                self.call_new(&self.demand, PROC_FETCH_DEMAND, cred, &buf)
                    .await?
            } else {
                None
            };
            let (bytes, with_repeats) = if let Some(bytes) = demand {
                (bytes, true)
            } else if with_repeats {
                let call = self
                    .client
                    .call(PROGRAM, VERSION, PROC_FETCH_REPEATS, cred, &buf)
                    .await;
                match call {
                    Ok(reply) => (reply.to_vec(), true),
                    Err(ClientError::Rpc {
                        error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                        ..
                    }) => {
                        tracing::info!(
                            server = %self.client.server(),
                            "upstream does not know FETCH_REPEATS; using FETCH"
                        );
                        self.repeats
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        (self.call(PROC_FETCH, cred, &buf).await?, false)
                    }
                    Err(e) => return Err(FetchError::Transport(e)),
                }
            } else {
                (self.call(PROC_FETCH, cred, &buf).await?, false)
            };
            let decoded = if with_repeats {
                decode_fetch_repeats_res(&bytes)
            } else {
                decode_fetch_res(&bytes)
            };
            match decoded {
                Ok(Ok(ok)) => Ok(ok),
                Ok(Err(st)) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "FETCH",
                    source,
                }),
            }
        })
    }

    fn store<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::with_capacity(args.fh.len() + args.data.len() + 56);
            args.encode(&mut buf);
            let guarded = args.guard.is_some();
            let bytes = if guarded && self.guards.load(std::sync::atomic::Ordering::Relaxed) {
                let call = self
                    .client
                    .call(PROGRAM, VERSION, PROC_STORE_GUARDED, cred, &buf)
                    .await;
                match call {
                    Ok(reply) => reply.to_vec(),
                    Err(ClientError::Rpc {
                        error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                        ..
                    }) => {
                        tracing::warn!(
                            server = %self.client.server(),
                            "upstream does not know STORE_GUARDED (an older gvfs-proxy): \
                             write-backs of whole files cannot check that the origin is \
                             unchanged and may overwrite changes made there"
                        );
                        self.guards
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        buf.truncate(buf.len() - GUARD_LEN);
                        self.call(PROC_STORE, cred, &buf).await?
                    }
                    Err(e) => return Err(FetchError::Transport(e)),
                }
            } else {
                if guarded {
                    // STORE's arguments: without the guard at the end.
                    buf.truncate(buf.len() - GUARD_LEN);
                }
                self.call(PROC_STORE, cred, &buf).await?
            };
            match decode_store_res(&bytes) {
                Ok(Ok(attrs)) => Ok(attrs),
                Ok(Err(st)) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "STORE",
                    source,
                }),
            }
        })
    }

    fn supported(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let answer = self.speaks.get_or_try_init(|| self.probe()).await;
            answer.is_ok_and(|yes| *yes)
        })
    }

    fn put_profile<'a>(
        &'a self,
        cred: &'a Credentials,
        fh: &'a [u8],
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::new();
            crate::profile::encode_put(&mut buf, fh, profile);
            let Some(bytes) = self
                .call_new(&self.profiles, PROC_PROFILE_PUT, cred, &buf)
                .await?
            else {
                return Ok(());
            };
            match gvfs_nfs::xdr::decode_exact::<nfsstat3>(&bytes) {
                Ok(nfsstat3::NFS3_OK) => Ok(()),
                Ok(st) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "PROFILE_PUT",
                    source,
                }),
            }
        })
    }

    fn get_profile<'a>(
        &'a self,
        cred: &'a Credentials,
        fh: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<Profile>, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::new();
            put_opaque(&mut buf, fh);
            let Some(bytes) = self
                .call_new(&self.profiles, PROC_PROFILE_GET, cred, &buf)
                .await?
            else {
                return Ok(None);
            };
            crate::profile::decode_get_res(&bytes).map_err(|source| FetchError::BadReply {
                server: self.client.server(),
                call: "PROFILE_GET",
                source,
            })
        })
    }

    fn forward<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(self.call(PROC_FETCH, cred, args))
    }
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

#[cfg(test)]
mod tests;
