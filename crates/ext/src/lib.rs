//! The gvfs extension RPC program: what proxies say to each other that NFS
//! cannot, on the same connection as NFS (so inside the TLS tunnel when
//! there is one).
//!
//! Version 1 has eight procedures besides NULL (the eighth, FETCH_HAVE, is
//! specified in `have.rs`); version 2 has the same, HELLO, so that
//! what two proxies speak is agreed once per connection instead of learned
//! from refusals, and FETCH_CLASS:
//!
//! ```text
//! version 2
//!   0..8   as in version 1
//!   9  HELLO  (uint32 caps) -> uint32 caps
//!   10 FETCH_CLASS (fetch_class_args) -> fetch_repeats_res
//!
//! struct have_set {        /* as in fetch_have_args (have.rs) */
//!     uint32   block_size;
//!     opaque   have<32>;
//! };
//! struct fetch_class_args {
//!     fetch_args args;
//!     uint32     class;    /* 0 bulk, 1 background, 2 profile, 3 demand */
//!     have_set   *have;    /* the blocks the caller holds, if any */
//! };
//! ```
//!
//! HELLO's argument names the capabilities the caller speaks (bit 0
//! FETCH_REPEATS, 1 STORE_GUARDED, 2 FETCH_DEMAND, 3 PROFILE_PUT and
//! PROFILE_GET, 4 FETCH_HAVE, 5 FETCH_CLASS: [`Caps`]), its result those
//! the server speaks too. A caller sends it first on each connection (a reconnect may
//! reach another build) and then calls only what was agreed. A server
//! answers versions 1 and 2 (PROG_MISMATCH 1..2 otherwise); a proxy from
//! before version 2 answers version 2 with PROG_MISMATCH 1..1, and is then
//! spoken to in version 1, as it speaks: every procedure is tried until it
//! answers PROC_UNAVAIL. FETCH_HAVE's bitmap and every other length are
//! capped as before; HELLO's is one word, anything else GARBAGE_ARGS.
//!
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
//! FETCH_CLASS is FETCH_REPEATS (or FETCH_HAVE, with `have`) that says
//! why the bytes are wanted, its priority class ([`Class`]): a reader
//! waits for them (demand), a working-set profile names them (profile),
//! the file's background stream is at them (background), or a copy reads
//! the file in order (bulk). A proxy that fetches them from its own
//! upstream in turn asks with the same class, so a node's profile run is
//! fetched at every hop as its pieces (a LAN proxy used to widen it to its
//! whole chunk). A class over 3 is GARBAGE_ARGS. No tenant goes on the
//! wire: an upstream's tenants are its own peers. A caller sends it only
//! when HELLO agreed on bit 5; to an older peer (one that speaks version
//! 1, or version 2 without the bit) demand goes as FETCH_DEMAND (or
//! FETCH_HAVE with `demand` set) and every other class as FETCH_REPEATS
//! (or FETCH_HAVE), and a server takes those as demand and background.
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
#![warn(missing_docs)]

mod client;
mod codec;
mod error;
mod fetch;
pub mod gate;
mod have;
pub mod profile;
mod proto;
mod source;
mod store;

pub use client::ExtClient;
pub use codec::{Codec, compress};
pub use error::{ChunkError, FetchError};
pub use fetch::{
    FetchArgs, FetchOk, decode_class_args, decode_fetch_repeats_res, decode_fetch_res,
    decode_have_args, decompress, encode_class_args, encode_fetch_repeats_res, encode_fetch_res,
    encode_have_args,
};
pub use gate::{Gate, Permit, Ticket};
pub use gvfs_metafile::LEVEL;
pub use have::{Have, MAX_HAVE_BYTES};
pub use profile::Profile;
pub use proto::*;
pub use source::{ChunkSource, Want};
pub use store::{StoreArgs, decode_store_res, encode_store_res};

#[cfg(any(test, feature = "test-util"))]
pub mod testing;
#[cfg(test)]
mod tests;
