//! [`MetaLayer`]: metadata actions as an NFSv3 layer (an [`NfsService`]
//! over the layer below it, usually the block cache).
//!
//! The layer learns each file's name from LOOKUP and READDIRPLUS replies.
//! On the first READ of a regular file it looks for `.NAME.gvfsmeta` in the
//! same directory (through the layers below, with the caller's credentials),
//! reads it (at most [`MAX_META_LEN`] bytes), decodes it and checks that it
//! still describes the file (size and mtime). The answer, "none" included,
//! is remembered, in memory and in a [`MetaIndex`] when one is given, so a
//! file costs one extra LOOKUP per session at most.
//!
//! With valid metadata, a READ is split into runs of zero blocks and runs
//! of data: zero runs are answered here with zeros and never reach the
//! layers below; only the data runs are read from them. Metadata that is
//! corrupt, truncated, of another version, or stale is ignored with a
//! warning and reads take the normal path, so metadata can never make the
//! proxy serve bytes other than the file's: a zero answer needs both the
//! map and the file's current attributes to agree, and any reply carrying
//! other attributes for the file (a write through this proxy, a change at
//! the origin) drops its metadata.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::{BoxFuture, CallContext, NfsReply, NfsRequest, NfsService, ServiceError};

use crate::MetaIndex;
use crate::format::{MAX_META_LEN, MetaFile, is_meta_name, meta_name};

/// Files whose names and metadata are remembered at once; the tables are
/// cleared when full (they are only a cache of what upstream says).
const MAX_FILES: usize = 65_536;
/// Largest READ sent for one data run or for the metadata file.
const MAX_READ: u32 = 1 << 20;

/// What the layer knows about a file's metadata.
#[derive(Debug, Clone)]
enum Known {
    /// Not looked for yet.
    Unknown,
    /// Looked for: there is none, or it was refused.
    Nothing,
    /// Valid when fetched; checked against the attributes at every use.
    Meta(Arc<MetaFile>),
}

#[derive(Debug, Clone)]
struct Entry {
    /// Directory handle and name, from LOOKUP or READDIRPLUS.
    name: Option<(Vec<u8>, String)>,
    known: Known,
    /// The file's attributes as last reported by any reply.
    attrs: Option<fattr3>,
}

/// Counters, for `gvfsctl stats` and the metrics endpoint.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MetaStats {
    /// READs answered entirely here (all zero blocks).
    pub zero_reads: u64,
    /// Bytes of zeros answered here instead of read from below.
    pub zero_bytes: u64,
    /// READs sent below for the data runs of split READs.
    pub data_reads: u64,
    /// Metadata files found, valid, and used.
    pub meta_found: u64,
    /// Files looked up with no metadata file beside them.
    pub meta_absent: u64,
    /// Metadata files ignored: corrupt, truncated, other version, stale.
    pub meta_rejected: u64,
}

#[derive(Debug, Default)]
struct Counters {
    zero_reads: AtomicU64,
    zero_bytes: AtomicU64,
    data_reads: AtomicU64,
    meta_found: AtomicU64,
    meta_absent: AtomicU64,
    meta_rejected: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn mtime_of(a: &fattr3) -> (u64, u32) {
    (u64::from(a.mtime.seconds), a.mtime.nseconds)
}

fn ctime_of(a: &fattr3) -> (u64, u32) {
    (u64::from(a.ctime.seconds), a.ctime.nseconds)
}

/// The metadata-actions layer.
pub struct MetaLayer {
    inner: Arc<dyn NfsService>,
    files: Mutex<HashMap<Vec<u8>, Entry>>,
    index: Option<Arc<dyn MetaIndex>>,
    /// One metadata fetch at a time (they are rare: once per file).
    fetching: tokio::sync::Mutex<()>,
    counters: Counters,
}

impl std::fmt::Debug for MetaLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaLayer")
            .field("inner", &self.inner.describe())
            .finish()
    }
}

impl MetaLayer {
    /// A layer over `inner`; `index` keeps file names and metadata answers
    /// across restarts when given.
    pub fn new(inner: Arc<dyn NfsService>, index: Option<Arc<dyn MetaIndex>>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            files: Mutex::new(HashMap::new()),
            index,
            fetching: tokio::sync::Mutex::new(()),
            counters: Counters::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> MetaStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        MetaStats {
            zero_reads: g(&c.zero_reads),
            zero_bytes: g(&c.zero_bytes),
            data_reads: g(&c.data_reads),
            meta_found: g(&c.meta_found),
            meta_absent: g(&c.meta_absent),
            meta_rejected: g(&c.meta_rejected),
        }
    }

    /// Whether `offset..offset + len` of `fh` (clipped to its size) is
    /// known to be zeros that this layer answers itself: for the layers
    /// below, so they do not read such ranges ahead.
    pub fn known_zero(&self, fh: &[u8], offset: u64, len: u64) -> bool {
        let files = self.files();
        let Some(Entry {
            known: Known::Meta(m),
            attrs: Some(a),
            ..
        }) = files.get(fh)
        else {
            return false;
        };
        let len = len.min(a.size.saturating_sub(offset));
        m.matches(a.size, mtime_of(a), ctime_of(a), false) && m.range_is_zero(offset, len)
    }

    fn files(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry<'a>(files: &'a mut HashMap<Vec<u8>, Entry>, fh: &[u8]) -> &'a mut Entry {
        if files.len() >= MAX_FILES && !files.contains_key(fh) {
            files.clear();
        }
        files.entry(fh.to_vec()).or_insert(Entry {
            name: None,
            known: Known::Unknown,
            attrs: None,
        })
    }

    /// Records a file's name (not for metadata files themselves).
    fn note_name(&self, fh: &[u8], dir: &[u8], name: &str) {
        if is_meta_name(name) || meta_name(name).is_none() {
            return;
        }
        let mut files = self.files();
        let e = Self::entry(&mut files, fh);
        if e.name.as_ref().is_none_or(|(d, n)| d != dir || n != name) {
            e.name = Some((dir.to_vec(), name.to_string()));
            e.known = Known::Unknown;
            drop(files);
            self.persist_name(fh, dir, name);
        }
    }

    fn persist_name(&self, fh: &[u8], dir: &[u8], name: &str) {
        let Some(index) = &self.index else { return };
        let mut v = Vec::with_capacity(4 + dir.len() + name.len());
        v.extend_from_slice(&(dir.len() as u32).to_le_bytes());
        v.extend_from_slice(dir);
        v.extend_from_slice(name.as_bytes());
        if let Err(e) = index.put(&key(b'n', fh), &v) {
            tracing::debug!(error = %e, "metadata index: cannot record a name");
        }
    }

    /// The name of `fh` from the index (after a restart).
    fn indexed_name(&self, fh: &[u8]) -> Option<(Vec<u8>, String)> {
        let v = self.index.as_ref()?.get(&key(b'n', fh)).ok()??;
        let n = u32::from_le_bytes(v.get(..4)?.try_into().ok()?) as usize;
        let dir = v.get(4..4usize.checked_add(n)?)?.to_vec();
        let name = std::str::from_utf8(v.get(4 + n..)?).ok()?.to_string();
        Some((dir, name))
    }

    /// Records attributes a reply carried for `fh`; metadata that no
    /// longer matches them is dropped.
    fn note_attrs(&self, fh: &[u8], a: &fattr3) {
        let mut files = self.files();
        // Files known to have no metadata need no attributes kept.
        let Some(e) = files
            .get_mut(fh)
            .filter(|e| !matches!(e.known, Known::Nothing))
        else {
            return;
        };
        if let Known::Meta(m) = &e.known
            && !m.matches(a.size, mtime_of(a), ctime_of(a), false)
        {
            tracing::info!(fh = ?fh, "file changed; its metadata no longer applies");
            e.known = Known::Nothing;
        }
        e.attrs = Some(a.clone());
    }

    fn note_post_op(&self, fh: &[u8], a: &post_op_attr) {
        if let Nfs3Option::Some(a) = a {
            self.note_attrs(fh, a);
        }
    }

    /// The file's valid metadata and current attributes, looking for the
    /// metadata file on first use.
    async fn meta_for(&self, cx: &CallContext, fh: &[u8]) -> Option<(Arc<MetaFile>, fattr3)> {
        // The common cases (no metadata, or metadata known) copy no more
        // than they return: this runs for every READ.
        let (attrs, name) = {
            let files = self.files();
            match files.get(fh) {
                Some(Entry {
                    known: Known::Nothing,
                    ..
                }) => return None,
                Some(Entry {
                    known: Known::Meta(m),
                    attrs,
                    ..
                }) => {
                    let a = attrs.as_ref()?;
                    return m
                        .matches(a.size, mtime_of(a), ctime_of(a), false)
                        .then(|| (m.clone(), a.clone()));
                }
                Some(e) => (e.attrs.clone(), e.name.clone()),
                None => (None, None),
            }
        };
        let name = name.or_else(|| self.indexed_name(fh))?;
        let _one = self.fetching.lock().await;
        // Another READ may have fetched it meanwhile.
        let fetched = self
            .files()
            .get(fh)
            .is_some_and(|e| !matches!(e.known, Known::Unknown));
        if fetched {
            drop(_one);
            return Box::pin(self.meta_for(cx, fh)).await;
        }
        let attrs = match attrs {
            Some(a) => a,
            None => self.getattr(cx, fh).await?,
        };
        let known = self.fetch(cx, &name, &attrs).await;
        let mut files = self.files();
        let e = Self::entry(&mut files, fh);
        e.name = Some(name);
        e.attrs = Some(attrs.clone());
        e.known = known.clone();
        match known {
            Known::Meta(m) => Some((m, attrs)),
            _ => None,
        }
    }

    async fn getattr(&self, cx: &CallContext, fh: &[u8]) -> Option<fattr3> {
        let req = NfsRequest::Getattr(GETATTR3args {
            object: nfs_fh3 {
                data: Opaque::owned(fh.to_vec()),
            },
        });
        match self.inner.call(cx, req).await {
            Ok(NfsReply::Getattr(Nfs3Result::Ok(ok))) => Some(ok.obj_attributes),
            _ => None,
        }
    }

    /// Looks for, reads and checks `.NAME.gvfsmeta` beside the file.
    async fn fetch(
        &self,
        cx: &CallContext,
        (dir, name): &(Vec<u8>, String),
        attrs: &fattr3,
    ) -> Known {
        if attrs.type_ != ftype3::NF3REG {
            return Known::Nothing;
        }
        let Some(mname) = meta_name(name) else {
            return Known::Nothing;
        };
        let lookup = NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: nfs_fh3 {
                    data: Opaque::owned(dir.clone()),
                },
                name: filename3::from(mname.clone().into_bytes()),
            },
        });
        let (mfh, msize) = match self.inner.call(cx, lookup).await {
            Ok(NfsReply::Lookup(Nfs3Result::Ok(ok))) => {
                let size = match &ok.obj_attributes {
                    Nfs3Option::Some(a) => Some(a.size),
                    Nfs3Option::None => None,
                };
                (ok.object.data.to_vec(), size)
            }
            Ok(_) => {
                bump(&self.counters.meta_absent, 1);
                return Known::Nothing;
            }
            Err(e) => {
                // Not an answer about the file: look again next time.
                tracing::debug!(error = %e, "metadata lookup failed");
                return Known::Unknown;
            }
        };
        let reject = |why: String| {
            bump(&self.counters.meta_rejected, 1);
            tracing::warn!(file = %name, "ignoring metadata {mname}: {why}");
            Known::Nothing
        };
        if msize.is_some_and(|s| s > MAX_META_LEN as u64) {
            return reject(format!("larger than {MAX_META_LEN} bytes"));
        }
        let mut bytes: Vec<u8> = Vec::new();
        loop {
            let req = NfsRequest::Read(READ3args {
                file: nfs_fh3 {
                    data: Opaque::owned(mfh.clone()),
                },
                offset: bytes.len() as u64,
                count: MAX_READ,
            });
            match self.inner.call(cx, req).await {
                Ok(NfsReply::Read(Nfs3Result::Ok(ok))) => {
                    if bytes.len() + ok.data.len() > MAX_META_LEN {
                        return reject(format!("larger than {MAX_META_LEN} bytes"));
                    }
                    bytes.extend_from_slice(&ok.data);
                    if ok.eof || ok.data.is_empty() {
                        break;
                    }
                }
                Ok(other) => return reject(format!("READ failed: {:?}", other.status())),
                Err(e) => {
                    tracing::debug!(error = %e, "metadata read failed");
                    return Known::Unknown;
                }
            }
        }
        let meta = match MetaFile::decode(&bytes) {
            Ok(m) => m,
            Err(e) => return reject(e.to_string()),
        };
        if !meta.matches(attrs.size, mtime_of(attrs), ctime_of(attrs), false) {
            return reject(format!(
                "stale: it describes size {} mtime {:?}, the file has size {} mtime {:?}",
                meta.file_size,
                meta.mtime,
                attrs.size,
                mtime_of(attrs)
            ));
        }
        bump(&self.counters.meta_found, 1);
        tracing::info!(
            file = %name,
            zero_blocks = meta.zero.zero_blocks(),
            blocks = meta.zero.blocks(),
            "using metadata {mname}"
        );
        Known::Meta(Arc::new(meta))
    }

    async fn read(&self, cx: &CallContext, args: READ3args) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        let Some((meta, attrs)) = self.meta_for(cx, &fh).await else {
            return self.forward(cx, NfsRequest::Read(args)).await;
        };
        let size = attrs.size;
        let count = u64::from(args.count.min(MAX_READ));
        if args.offset >= size || count == 0 {
            return self.forward(cx, NfsRequest::Read(args)).await;
        }
        let end = (args.offset + count).min(size);
        // Runs of (start, end, zero) over the blocks of the range.
        let bs = u64::from(meta.block_size);
        let mut runs: Vec<(u64, u64, bool)> = Vec::new();
        let mut pos = args.offset;
        while pos < end {
            let block_end = ((pos / bs) + 1) * bs;
            let hi = block_end.min(end);
            let zero = meta.range_is_zero(pos, hi - pos);
            match runs.last_mut() {
                Some(r) if r.2 == zero => r.1 = hi,
                _ => runs.push((pos, hi, zero)),
            }
            pos = hi;
        }
        let mut data = vec![0u8; (end - args.offset) as usize];
        let mut zero_bytes = 0;
        let mut last_attrs = Nfs3Option::Some(attrs.clone());
        for &(lo, hi, zero) in &runs {
            if zero {
                zero_bytes += hi - lo;
                continue;
            }
            let mut at = lo;
            while at < hi {
                bump(&self.counters.data_reads, 1);
                let req = NfsRequest::Read(READ3args {
                    file: args.file.clone(),
                    offset: at,
                    count: (hi - at) as u32,
                });
                match self.inner.call(cx, req).await? {
                    NfsReply::Read(Nfs3Result::Ok(ok)) => {
                        self.note_post_op(&fh, &ok.file_attributes);
                        last_attrs = ok.file_attributes.clone();
                        let n = ok.data.len().min((hi - at) as usize);
                        let off = (at - args.offset) as usize;
                        data[off..off + n].copy_from_slice(&ok.data[..n]);
                        at += n as u64;
                        if n == 0 || ok.eof {
                            break;
                        }
                    }
                    other => return Ok(other),
                }
            }
        }
        // A data run may have shown the file changed: then start over the
        // normal way rather than mix zeros from an old map into new data.
        if self.meta_for(cx, &fh).await.is_none() {
            return self.forward(cx, NfsRequest::Read(args)).await;
        }
        bump(&self.counters.zero_bytes, zero_bytes);
        if runs.iter().all(|r| r.2) {
            bump(&self.counters.zero_reads, 1);
        }
        let n = data.len() as u32;
        Ok(NfsReply::Read(Nfs3Result::Ok(READ3resok {
            file_attributes: last_attrs,
            count: n,
            eof: end >= size,
            data: Opaque::owned(data),
        })))
    }

    /// Forwards a call, learning names and attributes from the reply.
    async fn forward(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        let lookup = match &req {
            NfsRequest::Lookup(a) => Some((
                a.what.dir.data.to_vec(),
                String::from_utf8_lossy(&a.what.name.0).into_owned(),
            )),
            _ => None,
        };
        let subject = subject_of(&req);
        let changes = matches!(
            req,
            NfsRequest::Write(_) | NfsRequest::Setattr(_) | NfsRequest::Commit(_)
        );
        let reply = self.inner.call(cx, req).await?;
        if changes && let Some(fh) = &subject {
            // The client changed the file: its metadata describes an older one.
            let mut files = self.files();
            if let Some(e) = files.get_mut(fh)
                && matches!(e.known, Known::Meta(_))
            {
                e.known = Known::Nothing;
            }
        }
        match &reply {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                let fh = ok.object.data.to_vec();
                if let Some((dir, name)) = &lookup {
                    self.note_name(&fh, dir, name);
                }
                self.note_post_op(&fh, &ok.obj_attributes);
            }
            NfsReply::Readdirplus(Nfs3Result::Ok(ok)) => {
                if let Some(dir) = &subject {
                    for e in &ok.reply.entries.0 {
                        if let Nfs3Option::Some(h) = &e.name_handle {
                            let name = String::from_utf8_lossy(&e.name.0).into_owned();
                            self.note_name(&h.data, dir, &name);
                            self.note_post_op(&h.data, &e.name_attributes);
                        }
                    }
                }
            }
            NfsReply::Getattr(Nfs3Result::Ok(ok)) => {
                if let Some(fh) = &subject {
                    self.note_attrs(fh, &ok.obj_attributes);
                }
            }
            NfsReply::Read(Nfs3Result::Ok(ok)) => {
                if let Some(fh) = &subject {
                    self.note_post_op(fh, &ok.file_attributes);
                }
            }
            NfsReply::Write(Nfs3Result::Ok(ok)) => {
                if let Some(fh) = &subject {
                    self.note_post_op(fh, &ok.file_wcc.after);
                }
            }
            _ => {}
        }
        Ok(reply)
    }
}

/// The file a call is about, when it has one handle.
fn subject_of(req: &NfsRequest) -> Option<Vec<u8>> {
    let fh = match req {
        NfsRequest::Getattr(a) => &a.object,
        NfsRequest::Setattr(a) => &a.object,
        NfsRequest::Read(a) => &a.file,
        NfsRequest::Write(a) => &a.file,
        NfsRequest::Commit(a) => &a.file,
        NfsRequest::Readdirplus(a) => &a.dir,
        _ => return None,
    };
    Some(fh.data.to_vec())
}

/// An index key: a one-byte kind and the file handle.
fn key(kind: u8, fh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + fh.len());
    k.push(kind);
    k.extend_from_slice(fh);
    k
}

impl NfsService for MetaLayer {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            match req {
                NfsRequest::Read(args) => self.read(cx, args).await,
                other => self.forward(cx, other).await,
            }
        })
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        self.inner.root(cx)
    }

    fn describe(&self) -> String {
        format!("metadata actions over {}", self.inner.describe())
    }
}
