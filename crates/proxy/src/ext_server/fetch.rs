//! FETCH in all its procedures: FETCH, FETCH_REPEATS, FETCH_DEMAND,
//! FETCH_HAVE and FETCH_CLASS decoded into one [`FetchArgs`] and the class
//! the caller asked with, then answered from the file cache, forwarded, or
//! read below and compressed here.
//!
//! The class: FETCH_CLASS carries it; of the older procedures,
//! FETCH_DEMAND and FETCH_HAVE with `demand` set are [`Class::Demand`],
//! every other [`Class::Background`]. A fetch this proxy makes upstream
//! for the call goes with the same class, so a node's profile run stays a
//! profile run (its pieces, not their chunks) at every hop.

use std::sync::Arc;
use std::time::Instant;

use gvfs_ext::{self as ext, CHUNK, ChunkSource, Class, FetchArgs, FetchOk, LEVEL, Want};
use gvfs_ext::{compress, encode_fetch_repeats_res, encode_fetch_res};
use gvfs_filecache::{Asked, FileCache, same_version};
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::rpc::ReplyStatus;
use gvfs_nfs::{CallContext, NfsReply, NfsRequest};

use super::{ExtRefusal, ExtServer, MAX_CHECKED, RECHECK};

impl ExtServer {
    /// One FETCH call of any procedure: its XDR results.
    pub(super) async fn fetch_call(
        &self,
        cx: &CallContext,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<u8>, ExtRefusal> {
        let decoded = match proc_ {
            ext::PROC_FETCH_CLASS => ext::decode_class_args(args),
            ext::PROC_FETCH_HAVE => ext::decode_have_args(args).map(|(f, demand)| {
                (
                    f,
                    if demand {
                        Class::Demand
                    } else {
                        Class::Background
                    },
                )
            }),
            ext::PROC_FETCH_DEMAND => FetchArgs::decode(args).map(|f| (f, Class::Demand)),
            _ => FetchArgs::decode(args).map(|f| (f, Class::Background)),
        };
        let Ok((fetch, class)) = decoded else {
            return Err(ExtRefusal::Rpc(ReplyStatus::GarbageArgs));
        };
        if fetch.have.is_some() {
            self.counters.have_calls.add(1);
        }
        if class == Class::Demand {
            self.counters.demand_calls.add(1);
        }
        if proc_ == ext::PROC_FETCH_CLASS {
            let c = &self.counters;
            match class {
                Class::Bulk => c.class_calls_bulk.add(1),
                Class::Background => c.class_calls_background.add(1),
                Class::Profile => c.class_calls_profile.add(1),
                Class::Demand => c.class_calls_demand.add(1),
            }
        }
        let want = Want::new(class, cx.tenant);
        let repeats = proc_ != ext::PROC_FETCH;
        self.counters.fetch_calls.add(1);
        let upstream_speaks = match &self.upstream {
            Some(u) => u.supported().await,
            None => false,
        };
        let res = match (&self.files, &self.upstream) {
            (Some(files), Some(up)) if upstream_speaks => {
                self.counters.from_file_cache.add(1);
                self.via_file_cache(cx, files, up.clone(), &fetch, repeats, want)
                    .await
            }
            (None, Some(up)) if upstream_speaks && repeats => {
                // Asked of the upstream with FETCH_CLASS (or what it
                // knows of the older procedures); answered as it came.
                self.counters.forwarded.add(1);
                up.fetch(&cx.cred, &fetch, &want).await.map_err(|e| {
                    tracing::warn!(error = %e, "forwarding a FETCH failed");
                    match e {
                        ext::FetchError::Nfs(st) => st,
                        _ => nfsstat3::NFS3ERR_IO,
                    }
                })
            }
            (None, Some(up)) if upstream_speaks => {
                self.counters.forwarded.add(1);
                return match up.forward(&cx.cred, args).await {
                    Ok(bytes) => {
                        if let Ok(Ok(ok)) = ext::decode_fetch_res(&bytes) {
                            self.count(&ok);
                        }
                        Ok(bytes)
                    }
                    Err(e) => {
                        // Counted as an error by encode.
                        tracing::warn!(error = %e, "forwarding FETCH failed");
                        Ok(self.encode(&Err(nfsstat3::NFS3ERR_IO), false))
                    }
                };
            }
            _ => {
                self.counters.compressed_here.add(1);
                self.read_below(cx, &fetch, repeats).await
            }
        };
        Ok(self.encode(&res, repeats))
    }

    fn count(&self, ok: &FetchOk) {
        self.counters.raw_bytes.add(u64::from(ok.raw_len));
        self.counters.wire_bytes.add(ok.data.len() as u64);
    }

    /// Counts an answer and encodes it as FETCH's results, or with
    /// `repeats` as FETCH_REPEATS'.
    fn encode(&self, res: &Result<FetchOk, nfsstat3>, repeats: bool) -> Vec<u8> {
        match res {
            Ok(ok) => self.count(ok),
            Err(_) => self.counters.errors.add(1),
        }
        let mut out = Vec::new();
        if repeats {
            encode_fetch_repeats_res(&mut out, res);
        } else {
            encode_fetch_res(&mut out, res);
        }
        out
    }

    /// A chunk from this proxy's file cache, fetching the whole file into
    /// it (once, for everyone) when it is not there.
    async fn via_file_cache(
        &self,
        cx: &CallContext,
        files: &Arc<FileCache>,
        up: Arc<dyn ChunkSource>,
        args: &FetchArgs,
        repeats: bool,
        want: Want,
    ) -> Result<FetchOk, nfsstat3> {
        files.keep_frames();
        let cached = files.get(&args.fh);
        let who = (args.fh.clone(), cx.cred.key());
        // Only this caller's own check counts: another peer's would let
        // anyone with the handle read chunks past the first.
        let trust = args.offset != 0
            && cached.is_some()
            && lock(&self.checked)
                .get(&who)
                .is_some_and(|at| at.elapsed() < RECHECK);
        let entry = match cached {
            Some(f) if trust => f,
            _ => {
                let attrs = self.may_read(cx, &args.fh).await?;
                if attrs.type_ != ftype3::NF3REG {
                    return Err(nfsstat3::NFS3ERR_INVAL);
                }
                let zero = match &self.side {
                    Some(side) => side.meta_of_version(cx, &args.fh, &attrs).await,
                    None => None,
                };
                let f = files
                    .start(
                        &args.fh,
                        &attrs,
                        zero.as_deref(),
                        up.clone(),
                        &cx.cred,
                        false,
                        &want,
                    )
                    .map_err(|why| {
                        tracing::warn!(%why, "cannot hold a file for FETCH");
                        nfsstat3::NFS3ERR_IO
                    })?;
                let mut checked = lock(&self.checked);
                if checked.len() >= MAX_CHECKED {
                    checked.retain(|_, at| at.elapsed() < RECHECK);
                    if checked.len() >= MAX_CHECKED {
                        checked.clear();
                    }
                }
                checked.insert(who, Instant::now());
                f
            }
        };
        // The attributes of the version the bytes belong to: once this
        // proxy's clients wrote to the file, its local ones, so a client
        // proxy holding chunks of upstream's version sees a new version
        // and does not mix them (a FETCH that ran into a WRITE fails).
        let (frame, raw_len, eof, attrs) = entry
            .read_frame(
                files,
                &up,
                &cx.cred,
                args.offset,
                args.count,
                Asked::new(repeats, want),
                args.have.as_ref(),
            )
            .await
            .map_err(|why| {
                tracing::warn!(%why, "FETCH from the file cache failed");
                nfsstat3::NFS3ERR_IO
            })?;
        self.counters.have_bytes.add(frame.left_out);
        Ok(FetchOk {
            attrs,
            raw_len,
            eof,
            codec: frame.codec,
            data: frame.data,
            repeats: frame.repeats,
        })
    }

    /// A chunk read through the layers below and compressed here; with
    /// `repeats`, the ranges the file's metadata says repeat earlier bytes
    /// are sent as zeros and listed.
    async fn read_below(
        &self,
        cx: &CallContext,
        args: &FetchArgs,
        repeats: bool,
    ) -> Result<FetchOk, nfsstat3> {
        let mut data: Vec<u8> = Vec::new();
        let mut attrs = None;
        let mut eof = false;
        while !eof && (data.len() as u32) < args.count {
            let want = args.count - data.len() as u32;
            let req = NfsRequest::Read(READ3args {
                file: nfs_fh3 {
                    data: Opaque::owned(args.fh.clone()),
                },
                offset: args.offset + data.len() as u64,
                count: want.min(CHUNK),
            });
            match self.inner.call(cx, req).await {
                Ok(NfsReply::Read(Nfs3Result::Ok(ok))) => {
                    let Nfs3Option::Some(a) = ok.file_attributes else {
                        return Err(nfsstat3::NFS3ERR_SERVERFAULT);
                    };
                    // Every piece must come from one version of the file.
                    if attrs.as_ref().is_some_and(|b| !same_version(&a, b)) {
                        return Err(nfsstat3::NFS3ERR_JUKEBOX);
                    }
                    attrs = Some(a);
                    let n = ok.data.len().min(want as usize);
                    data.extend_from_slice(&ok.data[..n]);
                    eof = ok.eof || n == 0;
                }
                Ok(other) => return Err(other.status()),
                Err(e) => return Err(e.nfsstat()),
            }
        }
        let attrs = match attrs {
            Some(a) => a,
            None => self.getattr(cx, &args.fh).await?,
        };
        eof = eof || args.offset + data.len() as u64 >= attrs.size;
        // Only a whole chunk lists repeats: a reader's piece would wait
        // for their sources, anywhere before it in the file.
        let whole = args.offset.is_multiple_of(u64::from(CHUNK))
            && (args.count >= CHUNK
                || args.offset.saturating_add(u64::from(args.count)) >= attrs.size);
        let listed = match &self.side {
            Some(side) if repeats && whole => {
                match side.meta_of_version(cx, &args.fh, &attrs).await {
                    Some(meta) => meta.repeats_in(args.offset, data.len() as u64),
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        for r in &listed {
            let at = (r.to - args.offset) as usize;
            data[at..at + r.len as usize].fill(0);
        }
        if let Some(have) = &args.have {
            self.counters.have_bytes.add(have.zero_in(&mut data));
        }
        Self::package(attrs, data, eof, listed).await
    }

    async fn package(
        attrs: fattr3,
        raw: Vec<u8>,
        eof: bool,
        repeats: Vec<gvfs_metafile::ByteRepeat>,
    ) -> Result<FetchOk, nfsstat3> {
        let raw_len = raw.len() as u32;
        let (codec, data) = tokio::task::spawn_blocking(move || compress(&raw, LEVEL))
            .await
            .map_err(|_| nfsstat3::NFS3ERR_SERVERFAULT)?;
        Ok(FetchOk {
            attrs,
            raw_len,
            eof,
            codec,
            data,
            repeats,
        })
    }
}
