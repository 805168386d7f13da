//! [`ExtServer`]: the answering side of the extension program, run by
//! every gvfs-proxy.
//!
//! A FETCH is answered from the best place this proxy has:
//! - its file cache, when its own upstream speaks the extension too (a LAN
//!   proxy in the middle): the whole file is fetched once into the cache,
//!   however many client proxies ask at once, and each chunk is served as
//!   soon as it has arrived, in the frame it came in (kept, so the chunk is
//!   neither compressed again nor decompressed for each client); chunks the
//!   file's zero map (found by this proxy's metadata layer) says are zeros
//!   are not fetched;
//! - its upstream's extension, forwarded as it came, when it has no file
//!   cache;
//! - otherwise (the proxy next to a plain NFS server) by reading the chunk
//!   through its own layers (block cache, zero maps) and compressing it.
//!
//! FETCH calls are independent, so chunks are read and compressed in
//! parallel: as many at once as the client keeps in flight, compression on
//! the blocking pool. Every FETCH procedure is decoded and answered in
//! `ext_server/fetch.rs`, with the class its caller asked with (FETCH_CLASS
//! carries one; the older procedures are demand or background), and any
//! fetch this proxy makes upstream for it goes with that class.
//!
//! The server is one of the front end's programs ([`Program`]): the front
//! end routes the extension's program number here and checks its version
//! against [`ExtServer::versions`]; this file alone names the program's
//! procedures. It reaches the proxy's stack in two ways only: calls on the
//! stack's top (an [`NfsService`]: ACCESS, GETATTR, READ, WRITE, COMMIT)
//! and the file cache's API: [`FileCache`] and [`Profiles`], and, for
//! what is kept beside an image at the origin (its metadata file, its
//! working-set profile), a [`SideFiles`] the stack gives it. `SideFiles`
//! is a trait rather than functions of the file cache because finding
//! those files takes the image's name, which only the metadata layer
//! learns; the layer implements it, so its table of names and metadata
//! keeps one owner and this server never names the layer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gvfs_nfs::layer::Calls;
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::rpc::ReplyStatus;
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService};

use gvfs_ext::{self as ext, CHUNK, ChunkSource, StoreArgs, encode_store_res, profile};
use gvfs_filecache::{FileCache, Profiles, SideFiles};
use gvfs_nfs::BoxFuture;
use gvfs_nfs::layer::Counter;
use gvfs_nfs::xdr::{XdrError, XdrReader};

use crate::front::program::{Answer, Call, FrontCounters, Program};

/// How long a file-cache entry is trusted without asking upstream for the
/// file's attributes again, for FETCHes that do not start a file.
const RECHECK: Duration = Duration::from_secs(3);
/// The longest a PROFILE_PUT or PROFILE_GET runs here, its calls below
/// and upstream included.
const PROFILE_CALL: Duration = Duration::from_secs(10);
/// Most (file, caller) read checks remembered.
const MAX_CHECKED: usize = 4096;

/// When each (file, caller) last passed a read check.
type ReadChecks = HashMap<(Vec<u8>, Vec<u32>), Instant>;

gvfs_nfs::counters! {
    /// Counters, for `gvfsctl stats` and the metrics endpoint.
    pub struct Counters => ExtStats {
        /// HELLO calls answered: connections of peers that agreed on
        /// version 2.
        hello_calls,
        /// FETCH calls answered, of every procedure.
        fetch_calls,
        /// File bytes those answers held.
        raw_bytes,
        /// Bytes sent for them (after compression).
        wire_bytes,
        /// Answered from the file cache.
        from_file_cache,
        /// Forwarded to the upstream's extension.
        forwarded,
        /// Read through the layers below and compressed here.
        compressed_here,
        /// STORE calls answered (chunks written back by client proxies).
        store_calls,
        /// Bytes received for them (compressed).
        stored_wire_bytes,
        /// File bytes they held.
        stored_raw_bytes,
        /// FETCH and STORE calls that failed.
        errors,
        /// FETCH calls answered for a reader downstream that waited
        /// (FETCH_DEMAND, or FETCH_HAVE or FETCH_CLASS asking as demand).
        demand_calls,
        /// Working-set profiles kept (PROFILE_PUT).
        profiles_stored,
        /// Working-set profiles answered (PROFILE_GET).
        profiles_served,
        /// Working-set profiles written beside their image at the origin.
        profiles_written,
        /// FETCH_HAVE calls answered (the caller held some blocks).
        have_calls,
        /// File bytes sent as zeros because the caller held them (a proxy
        /// that keeps a chunk's frame sends it as it is).
        have_bytes,
        /// FETCH_CLASS calls answered asking as bulk ...
        class_calls_bulk,
        /// ... as background ...
        class_calls_background,
        /// ... for a working-set profile ...
        class_calls_profile,
        /// ... and for a reader that waits.
        class_calls_demand,
    }
}

/// The extension program's server side.
pub struct ExtServer {
    inner: Arc<dyn NfsService>,
    files: Option<Arc<FileCache>>,
    upstream: Option<Arc<dyn ChunkSource>>,
    /// The files beside images at the origin (metadata files, profiles),
    /// as this proxy's metadata layer finds them: the zero maps of files
    /// it fetches whole, the repeats of chunks it reads here.
    side: Option<Arc<dyn SideFiles>>,
    /// Where working-set profiles are kept.
    profiles: Option<Arc<Profiles>>,
    /// Callers whose right to read a file was checked (FETCH at offset 0
    /// asks upstream), by (file, caller): their next chunks within
    /// [`RECHECK`] are not asked again.
    checked: Mutex<ReadChecks>,
    counters: Counters,
}

impl std::fmt::Debug for ExtServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtServer")
            .field("inner", &self.inner.describe())
            .field("files", &self.files)
            .finish()
    }
}

/// Why an extension call produced no results.
#[derive(Debug)]
pub enum ExtRefusal {
    /// Answer with this RPC status.
    Rpc(ReplyStatus),
}

impl ExtServer {
    /// A server reading through `inner` (the stack's top), with this
    /// proxy's file cache, its upstream's extension, the files beside
    /// images (from its metadata layer) and its kept profiles when it has
    /// them.
    pub fn new(
        inner: Arc<dyn NfsService>,
        files: Option<Arc<FileCache>>,
        upstream: Option<Arc<dyn ChunkSource>>,
        side: Option<Arc<dyn SideFiles>>,
        profiles: Option<Arc<Profiles>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            files,
            upstream,
            side,
            profiles,
            checked: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> ExtStats {
        self.counters.snapshot()
    }

    /// Runs one call of the program and returns its XDR results.
    pub async fn handle(
        &self,
        cx: &CallContext,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<u8>, ExtRefusal> {
        if let Some(status) = ext::rpc_refusal(vers, proc_) {
            return Err(ExtRefusal::Rpc(status));
        }
        if proc_ == ext::PROC_NULL {
            return Ok(Vec::new());
        }
        if proc_ == ext::PROC_HELLO {
            // HELLO (version 2): `uint32 caps` in, those both speak out.
            let mut r = gvfs_nfs::xdr::XdrReader::new(args);
            let Ok(asked) = r.u32().and_then(|caps| r.end().map(|()| caps)) else {
                return Err(ExtRefusal::Rpc(ReplyStatus::GarbageArgs));
            };
            self.counters.hello_calls.add(1);
            let mut out = Vec::with_capacity(4);
            gvfs_nfs::xdr::put_u32(&mut out, ext::hello_answer(asked));
            return Ok(out);
        }
        if proc_ == ext::PROC_PROFILE_PUT || proc_ == ext::PROC_PROFILE_GET {
            return self.profile_call(cx, proc_, args).await;
        }
        if proc_ == ext::PROC_STORE || proc_ == ext::PROC_STORE_GUARDED {
            let decoded = if proc_ == ext::PROC_STORE {
                StoreArgs::decode(args)
            } else {
                StoreArgs::decode_guarded(args)
            };
            let Ok(store) = decoded else {
                return Err(ExtRefusal::Rpc(ReplyStatus::GarbageArgs));
            };
            self.counters.store_calls.add(1);
            self.counters.stored_wire_bytes.add(store.data.len() as u64);
            let res = self.store(cx, store).await;
            if res.is_err() {
                self.counters.errors.add(1);
            }
            let mut out = Vec::new();
            encode_store_res(&mut out, &res);
            return Ok(out);
        }
        self.fetch_call(cx, proc_, args).await
    }

    /// PROFILE_PUT or PROFILE_GET, from a caller that may read the file:
    /// kept or answered here for the file's current version, and passed
    /// on to (or asked of) the upstream's extension when it has one.
    async fn profile_call(
        &self,
        cx: &CallContext,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<u8>, ExtRefusal> {
        let mut out = Vec::new();
        if proc_ == ext::PROC_PROFILE_PUT {
            let Ok((fh, p)) = profile::decode_put(args) else {
                return Err(ExtRefusal::Rpc(ReplyStatus::GarbageArgs));
            };
            // Its calls below (may it read, the origin's file) are bounded
            // as the caller's wait is: a profile is never waited out.
            let status = tokio::time::timeout(PROFILE_CALL, self.profile_put(cx, &fh, &p))
                .await
                .unwrap_or(nfsstat3::NFS3ERR_JUKEBOX);
            gvfs_nfs::xdr::encode_into(&mut out, &status);
        } else {
            let Ok(fh) = profile::decode_get(args) else {
                return Err(ExtRefusal::Rpc(ReplyStatus::GarbageArgs));
            };
            let p = tokio::time::timeout(PROFILE_CALL, self.profile_get(cx, &fh))
                .await
                .ok()
                .flatten();
            if p.is_some() {
                self.counters.profiles_served.add(1);
            }
            profile::encode_get_res(&mut out, p.as_ref());
        }
        Ok(out)
    }

    async fn upstream_speaks(&self) -> Option<&Arc<dyn ChunkSource>> {
        let up = self.upstream.as_ref()?;
        up.supported().await.then_some(up)
    }

    async fn profile_put(&self, cx: &CallContext, fh: &[u8], p: &profile::Profile) -> nfsstat3 {
        let attrs = match self.may_read(cx, fh).await {
            Ok(a) => a,
            Err(st) => return st,
        };
        if !p.version().describes(&attrs) {
            return nfsstat3::NFS3ERR_STALE;
        }
        let Some(profiles) = &self.profiles else {
            return nfsstat3::NFS3ERR_NOTSUPP;
        };
        profiles.put(fh, p);
        self.counters.profiles_stored.add(1);
        if let Some(up) = self.upstream_speaks().await {
            let sent = tokio::time::timeout(
                gvfs_filecache::PROFILE_WAIT,
                up.put_profile(&cx.cred, fh, p),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!("a working-set profile was not passed upstream");
            }
        } else if let Some(side) = &self.side {
            // The last proxy before the image server: kept beside the image.
            match side.write_profile(cx, fh, p).await {
                Ok(()) => self.counters.profiles_written.add(1),
                Err(why) => tracing::info!(
                    %why,
                    "a working-set profile is kept in this proxy only, not at the origin"
                ),
            }
        }
        nfsstat3::NFS3_OK
    }

    async fn profile_get(&self, cx: &CallContext, fh: &[u8]) -> Option<profile::Profile> {
        let attrs = self.may_read(cx, fh).await.ok()?;
        if let Some(p) = self.profiles.as_ref().and_then(|ps| ps.get(fh, &attrs)) {
            return Some(p);
        }
        let p = match self.upstream_speaks().await {
            Some(up) => {
                let asked = tokio::time::timeout(
                    gvfs_filecache::PROFILE_WAIT,
                    up.get_profile(&cx.cred, fh),
                )
                .await;
                asked.ok()?.ok()??
            }
            None => self.side.as_ref()?.read_profile(cx, fh, &attrs).await?,
        };
        if !p.version().describes(&attrs) {
            return None;
        }
        if let Some(profiles) = &self.profiles {
            profiles.put(fh, &p);
        }
        Some(p)
    }

    async fn getattr(&self, cx: &CallContext, fh: &[u8]) -> Result<fattr3, nfsstat3> {
        match self.inner.getattr(cx, fh).await {
            Ok(Nfs3Result::Ok(ok)) => Ok(ok.obj_attributes),
            Ok(Nfs3Result::Err((st, _))) => Err(st),
            Err(e) => Err(e.nfsstat()),
        }
    }

    /// The file's attributes, when the caller may read it: the file cache
    /// serves everyone, so each stream (a FETCH at offset 0) asks upstream.
    async fn may_read(&self, cx: &CallContext, fh: &[u8]) -> Result<fattr3, nfsstat3> {
        let req = NfsRequest::Access(ACCESS3args {
            object: nfs_fh3 {
                data: Opaque::owned(fh.to_vec()),
            },
            access: ACCESS3_READ,
        });
        match self.inner.call(cx, req).await {
            Ok(NfsReply::Access(Nfs3Result::Ok(ok))) => {
                if ok.access & ACCESS3_READ == 0 {
                    return Err(nfsstat3::NFS3ERR_ACCES);
                }
                match ok.obj_attributes {
                    Nfs3Option::Some(a) => Ok(a),
                    Nfs3Option::None => self.getattr(cx, fh).await,
                }
            }
            Ok(other) => Err(other.status()),
            Err(e) => Err(e.nfsstat()),
        }
    }

    /// A STORE: the chunk decompressed and written through the layers
    /// below, durably (FILE_SYNC, or a COMMIT when a layer answered
    /// UNSTABLE), before it is acknowledged.
    ///
    /// With a guard (STORE_GUARDED), the file's attributes are read first
    /// and nothing is written unless they are the guard's (else
    /// NFS3ERR_NOT_SYNC); the answer is then a GETATTR after the write, so
    /// that it is what the caller's next guard is compared with. The check
    /// and the write are two calls: a change at the origin between them
    /// is not seen.
    async fn store(&self, cx: &CallContext, args: StoreArgs) -> Result<fattr3, nfsstat3> {
        let fh = args.fh.clone();
        let offset = args.offset;
        let guard = args.guard;
        if let Some(g) = &guard {
            let now = self.getattr(cx, &fh).await?;
            if !g.describes(&now) {
                tracing::warn!(
                    fh = ?fh,
                    "refusing a write-back: the file changed since the writer's copy was \
                     fetched (size {} mtime {:?} ctime {:?}, expected size {} mtime {:?} \
                     ctime {:?})",
                    now.size,
                    now.mtime,
                    now.ctime,
                    g.size,
                    g.mtime,
                    g.ctime
                );
                return Err(nfsstat3::NFS3ERR_NOT_SYNC);
            }
        }
        let raw = tokio::task::spawn_blocking(move || args.raw())
            .await
            .map_err(|_| nfsstat3::NFS3ERR_SERVERFAULT)?
            .map_err(|why| {
                tracing::warn!(%why, "refusing a STORE");
                nfsstat3::NFS3ERR_INVAL
            })?;
        let count = raw.len() as u32;
        let file = nfs_fh3 {
            data: Opaque::owned(fh.clone()),
        };
        let req = NfsRequest::Write(WRITE3args {
            file: file.clone(),
            offset,
            count,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(raw),
        });
        let (mut attrs, committed) = match self.inner.call(cx, req).await {
            Ok(NfsReply::Write(Nfs3Result::Ok(ok))) => {
                if ok.count != count {
                    return Err(nfsstat3::NFS3ERR_IO);
                }
                let attrs = match ok.file_wcc.after {
                    Nfs3Option::Some(a) => Some(a),
                    Nfs3Option::None => None,
                };
                (attrs, !matches!(ok.committed, stable_how::UNSTABLE))
            }
            Ok(other) => return Err(other.status()),
            Err(e) => return Err(e.nfsstat()),
        };
        if !committed {
            let req = NfsRequest::Commit(COMMIT3args {
                file,
                offset,
                count,
            });
            match self.inner.call(cx, req).await {
                Ok(NfsReply::Commit(Nfs3Result::Ok(ok))) => {
                    if let Nfs3Option::Some(a) = ok.file_wcc.after {
                        attrs = Some(a);
                    }
                }
                Ok(other) => return Err(other.status()),
                Err(e) => return Err(e.nfsstat()),
            }
        }
        self.counters.stored_raw_bytes.add(u64::from(count));
        match attrs {
            Some(a) if guard.is_none() => Ok(a),
            _ => self.getattr(cx, &fh).await,
        }
    }
}

impl Program for ExtServer {
    fn number(&self) -> u32 {
        ext::PROGRAM
    }

    fn versions(&self) -> std::ops::RangeInclusive<u32> {
        ext::VERSION_1..=ext::VERSION
    }

    fn calls_counter<'c>(&self, counters: &'c FrontCounters) -> Option<&'c Counter> {
        Some(&counters.ext_calls)
    }

    /// Every kind of FETCH may answer with a whole chunk, in any version.
    fn reply_data(
        &self,
        _vers: u32,
        proc_: u32,
        _args: &mut XdrReader<'_>,
    ) -> Result<u32, XdrError> {
        let fetches = [
            ext::PROC_FETCH,
            ext::PROC_FETCH_REPEATS,
            ext::PROC_FETCH_DEMAND,
            ext::PROC_FETCH_HAVE,
            ext::PROC_FETCH_CLASS,
        ];
        Ok(if fetches.contains(&proc_) {
            CHUNK + ext::MAX_FRAME_SLACK
        } else {
            0
        })
    }

    fn class(&self, vers: u32, proc_: u32, args: &[u8]) -> gvfs_nfs::Class {
        crate::ext_server_class::ext_call_class(vers, proc_, args)
    }

    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            match self
                .handle(call.cx, call.hdr.vers, call.hdr.proc_, call.args)
                .await
            {
                Ok(results) => Answer::Results(results),
                Err(ExtRefusal::Rpc(status)) => Answer::Refused(status),
            }
        })
    }
}

mod fetch;
#[cfg(test)]
mod tests;
