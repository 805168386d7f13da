//! The gvfs metadata layer (the GVFS paper, section 3.2.2).
//!
//! [`MetaLayer`]: metadata actions as an NFSv3 layer (an [`NfsService`]
//! over the layer below it, usually the block cache).
//!
//! The layer learns each file's name from LOOKUP and READDIRPLUS replies.
//! On the first READ of a regular file it looks for `.NAME.gvfsmeta` in the
//! same directory (through the layers below, with the caller's credentials),
//! checks that whoever may write it may write the file too (see
//! `gvfs_metafile::trust`), reads it (at most [`MAX_META_LEN`] bytes),
//! decodes it and checks that it still describes the file (size, mtime and
//! ctime). The answer, "none" included, is remembered in memory (at most
//! [`MAX_FILES`] files and [`MAX_META_BYTES`] of decoded metadata), so a file costs one extra
//! LOOKUP per session at most; a [`MetaIndex`], when one is given, keeps
//! the files' names across restarts, so the metadata of a file a client
//! reads without looking it up again can still be found.
//!
//! With valid metadata, a READ is split into runs of zero blocks and runs
//! of data: zero runs are answered here with zeros and never reach the
//! layers below; only the data runs are read from them. Metadata that is
//! corrupt, truncated, of another version, stale, or not trusted is ignored
//! with a warning and reads take the normal path, so metadata can never make the
//! proxy serve bytes other than the file's: a zero answer needs both the
//! map and the file's current attributes to agree, and any reply carrying
//! other attributes for the file (a write through this proxy, a change at
//! the origin) drops its metadata.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gvfs_nfs::layer::{Calls, Layer, WriteCheck, WriteTarget, lock};
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::xdr::zeros;
use gvfs_nfs::{CallContext, FileVersion, NfsReply, NfsRequest, NfsService, ServiceError};

use gvfs_ext::ChunkSource;
use gvfs_filecache::MetaIndex;
use gvfs_filecache::{CachedFile, FileCache, HeldWriteError, same_version};
use gvfs_metafile::trust::{self, WarnLimit};
use gvfs_metafile::{MAX_META_LEN, MetaFile, is_meta_name, meta_name};

mod held;
mod profile;
mod zeros;

/// Where compress-and-copy files go and come from: this proxy's file
/// cache, and its upstream's extension program.
#[derive(Clone)]
pub struct CopyPath {
    /// The file cache.
    pub files: Arc<FileCache>,
    /// The upstream that compresses.
    pub source: Arc<dyn ChunkSource>,
}

/// Files whose names and metadata are remembered at once; the tables are
/// cleared when full (they are only a cache of what upstream says).
pub const MAX_FILES: usize = 65_536;
/// Largest READ sent for one data run or for the metadata file.
const MAX_READ: u32 = 1 << 20;

/// Most metadata lookups started by LOOKUPs at once.
const MAX_EARLY: usize = 4;

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
    /// Compress-and-copy failed for this file: read it block by block
    /// until its metadata is looked up again.
    no_copy: bool,
}

/// Most bytes of decoded metadata remembered at once (a metadata file may
/// be [`MAX_META_LEN`], mostly block hashes, and anyone who can write a
/// file can give it one): past this the table is emptied, as when it holds
/// [`MAX_FILES`] files.
pub const MAX_META_BYTES: usize = 256 << 20;

/// The table of files, and (at least) how much memory the metadata it
/// remembers takes.
#[derive(Debug, Default)]
struct Files {
    map: HashMap<Vec<u8>, Entry>,
    /// Memory of the metadata remembered since the table was last emptied
    /// (an upper bound: what an entry forgets is not taken off).
    meta_bytes: usize,
}

impl Files {
    /// Makes room for metadata taking `len` bytes, about to be remembered.
    fn remember(&mut self, len: usize) {
        if self.meta_bytes + len > MAX_META_BYTES {
            self.map.clear();
            self.meta_bytes = 0;
        }
        self.meta_bytes += len;
    }
}

/// The metadata layer's table of files: what it knows of each file's
/// metadata and attributes. Made before the layers, so a layer below (the
/// block cache's read-ahead) can ask it which ranges are known zeros
/// ([`MetaFiles::known_zero`]) without a reference back up the stack.
#[derive(Debug, Default)]
pub struct MetaFiles {
    files: Mutex<Files>,
}

impl MetaFiles {
    /// An empty table.
    pub fn new() -> Arc<MetaFiles> {
        Arc::new(MetaFiles::default())
    }

    /// Whether `offset..offset + len` of `fh` (clipped to its size) is
    /// known to be zeros that the metadata layer answers itself: for the
    /// layers below, so they do not read such ranges ahead.
    pub fn known_zero(&self, fh: &[u8], offset: u64, len: u64) -> bool {
        let files = self.lock();
        let Some(Entry {
            known: Known::Meta(m),
            attrs: Some(a),
            ..
        }) = files.get(fh)
        else {
            return false;
        };
        let len = len.min(a.size.saturating_sub(offset));
        m.file_version().describes(a) && m.range_is_zero(offset, len)
    }

    /// The metadata of `fh`, when it has content hashes and describes the
    /// file as last seen: what its blocks may be copied by.
    pub fn content(&self, fh: &[u8]) -> Option<Arc<MetaFile>> {
        match self.lock().get(fh) {
            Some(Entry {
                known: Known::Meta(m),
                attrs: Some(a),
                ..
            }) if m.hashes.is_some() && m.file_version().describes(a) => Some(m.clone()),
            _ => None,
        }
    }

    /// Whether `fh` has metadata with content hashes (cheap: for the block
    /// cache, under its lock).
    pub fn has_content(&self, fh: &[u8]) -> bool {
        matches!(
            self.lock().get(fh),
            Some(Entry { known: Known::Meta(m), .. }) if m.hashes.is_some()
        )
    }

    fn lock(&self) -> MutexGuard<'_, Files> {
        lock(&self.files)
    }
}

impl std::ops::Deref for Files {
    type Target = HashMap<Vec<u8>, Entry>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Files {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

gvfs_nfs::counters! {
    /// Counters, for `gvfsctl stats` and the metrics endpoint.
    pub struct Counters => MetaStats {
        /// READs answered entirely here (all zero blocks).
        zero_reads,
        /// Bytes of zeros answered here instead of read from below.
        zero_bytes,
        /// READs sent below for the data runs of split READs.
        data_reads,
        /// Metadata files found, valid, and used.
        meta_found,
        /// Files looked up with no metadata file beside them.
        meta_absent,
        /// Metadata files ignored: corrupt, truncated, other version, stale,
        /// or not trusted.
        meta_rejected,
        /// Of those, the ones not trusted: writable by someone who may not
        /// write the file they describe (see the rule in docs/guide/site.md).
        meta_untrusted,
        /// READs of compress-and-copy files served from the file cache.
        copy_reads,
        /// WRITEs into files held whole in the file cache.
        copy_writes,
    }
}

/// The metadata-actions layer.
pub struct MetaLayer {
    inner: Arc<dyn NfsService>,
    files: Arc<MetaFiles>,
    index: Option<Arc<dyn MetaIndex>>,
    /// One metadata fetch at a time (they are rare: once per file).
    fetching: tokio::sync::Mutex<()>,
    /// This layer, for the metadata lookups a LOOKUP starts in the
    /// background.
    me: std::sync::Weak<MetaLayer>,
    /// Background metadata lookups under way (at most [`MAX_EARLY`]).
    early: AtomicUsize,
    copy: Option<CopyPath>,
    counters: Counters,
    /// Whether callers may write the files held whole here.
    write_checks: WriteCheck,
    /// Warnings about ignored metadata files: a few a minute at most.
    warnings: WarnLimit,
}

impl std::fmt::Debug for MetaLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaLayer")
            .field("inner", &self.inner.describe())
            .finish()
    }
}

impl MetaLayer {
    /// A layer over `inner` keeping what it learns in `files`; `index`
    /// keeps file names across restarts when given; `copy` enables
    /// compress-and-copy.
    pub fn new(
        inner: Arc<dyn NfsService>,
        files: Arc<MetaFiles>,
        index: Option<Arc<dyn MetaIndex>>,
        copy: Option<CopyPath>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            inner,
            files,
            index,
            fetching: tokio::sync::Mutex::new(()),
            me: me.clone(),
            early: AtomicUsize::new(0),
            copy,
            counters: Counters::default(),
            write_checks: WriteCheck::default(),
            warnings: WarnLimit::new(10, std::time::Duration::from_secs(60)),
        })
    }

    /// The counters.
    pub fn stats(&self) -> MetaStats {
        self.counters.snapshot()
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        self.files.lock()
    }

    fn entry<'a>(files: &'a mut Files, fh: &[u8]) -> &'a mut Entry {
        if files.len() >= MAX_FILES && !files.contains_key(fh) {
            files.clear();
            files.meta_bytes = 0;
        }
        files.entry(fh.to_vec()).or_insert(Entry {
            name: None,
            known: Known::Unknown,
            attrs: None,
            no_copy: false,
        })
    }

    /// The name a LOOKUP or listing last gave `fh`, if it is remembered.
    pub fn name_of(&self, fh: &[u8]) -> Option<String> {
        self.files().get(fh)?.name.as_ref().map(|(_, n)| n.clone())
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
            && !m.file_version().describes(a)
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
                        .file_version()
                        .describes(a)
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
        if let Known::Meta(m) = &known {
            files.remember(m.memory_len());
        }
        let e = Self::entry(&mut files, fh);
        e.name = Some(name);
        e.attrs = Some(attrs.clone());
        e.known = known.clone();
        e.no_copy = false;
        match known {
            Known::Meta(m) => Some((m, attrs)),
            _ => None,
        }
    }

    /// The metadata of `fh` when it is valid for this version of the file
    /// (`attrs`, fresh from upstream), looking for it on first use.
    pub async fn meta_of_version(
        &self,
        cx: &CallContext,
        fh: &[u8],
        attrs: &fattr3,
    ) -> Option<Arc<MetaFile>> {
        self.note_attrs(fh, attrs);
        let (m, _) = self.meta_for(cx, fh).await?;
        m.file_version().describes(attrs).then_some(m)
    }

    /// Starts looking for the metadata of a file just looked up, so that
    /// it is known (or known absent) by the time the client has opened the
    /// file and sends its first READ: the round trips of `.NAME.gvfsmeta`
    /// overlap the client's own. At most [`MAX_EARLY`] at once; beyond
    /// that (a client walking a directory) the first READ looks, as
    /// before.
    fn look_early(&self, cx: &CallContext, fh: Vec<u8>) {
        let unknown = self
            .files()
            .get(&fh)
            .is_some_and(|e| matches!(e.known, Known::Unknown) && e.name.is_some());
        let (Some(me), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        if !unknown
            || self
                .early
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_EARLY).then_some(n + 1)
                })
                .is_err()
        {
            return;
        }
        let cx = cx.clone();
        rt.spawn(async move {
            me.meta_for(&cx, &fh).await;
            me.early.fetch_sub(1, Ordering::AcqRel);
        });
    }

    async fn getattr(&self, cx: &CallContext, fh: &[u8]) -> Option<fattr3> {
        match self.inner.getattr(cx, fh).await {
            Ok(Nfs3Result::Ok(ok)) => Some(ok.obj_attributes),
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
        let (mfh, mattrs) = match self.inner.call(cx, lookup).await {
            Ok(NfsReply::Lookup(Nfs3Result::Ok(ok))) => {
                let attrs = match ok.obj_attributes {
                    Nfs3Option::Some(a) => Some(a),
                    Nfs3Option::None => None,
                };
                (ok.object.data.to_vec(), attrs)
            }
            Ok(_) => {
                self.counters.meta_absent.add(1);
                return Known::Nothing;
            }
            Err(e) => {
                // Not an answer about the file: look again next time.
                tracing::debug!(error = %e, "metadata lookup failed");
                return Known::Unknown;
            }
        };
        let reject = |why: String| {
            self.counters.meta_rejected.add(1);
            if let Some(held) = self.warnings.allow(std::time::Instant::now()) {
                let held = if held > 0 {
                    format!(" ({held} more such warnings held back)")
                } else {
                    String::new()
                };
                tracing::warn!(file = %name, "ignoring metadata {mname}: {why}{held}");
            }
            Known::Nothing
        };
        // Who may write the metadata file decides whether it is believed
        // (see `trust`): from the attributes LOOKUP gave, or a GETATTR.
        let mattrs = match mattrs {
            Some(a) => a,
            None => match self.getattr(cx, &mfh).await {
                Some(a) => a,
                None => return reject("no attributes to check its owner".into()),
            },
        };
        if let Err(why) = trust::check(&(&mattrs).into(), &attrs.into()) {
            self.counters.meta_untrusted.add(1);
            return reject(format!("not trusted: {why}"));
        }
        if mattrs.size > MAX_META_LEN as u64 {
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
        let (described, now) = (meta.file_version(), FileVersion::of(attrs));
        if described != now {
            return reject(format!(
                "stale: it describes size {} mtime {:?} ctime {:?}, the file has size {} \
                 mtime {:?} ctime {:?} (regenerate it with `gvfsctl meta gen`)",
                described.size, described.mtime, described.ctime, now.size, now.mtime, now.ctime
            ));
        }
        self.counters.meta_found.add(1);
        tracing::info!(
            file = %name,
            zero_blocks = meta.zero.zero_blocks(),
            blocks = meta.zero.blocks(),
            "using metadata {mname}"
        );
        Known::Meta(Arc::new(meta))
    }

    /// The client changed the file: its metadata describes an older one,
    /// and a whole copy of it is out of date.
    fn changed(&self, fh: &[u8]) {
        let mut files = self.files();
        if let Some(e) = files.get_mut(fh)
            && matches!(e.known, Known::Meta(_))
        {
            e.known = Known::Nothing;
        }
        drop(files);
        if let Some(copy) = &self.copy {
            copy.files.forget(fh);
        }
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
        // CREATE UNCHECKED with a size truncates the file if it exists.
        let truncates = matches!(
            &req,
            NfsRequest::Create(a) if matches!(
                &a.how,
                createhow3::UNCHECKED(s) if matches!(s.size, Nfs3Option::Some(_))
            )
        );
        let reply = self.inner.call(cx, req).await?;
        if changes && let Some(fh) = &subject {
            self.changed(fh);
        }
        if truncates
            && let NfsReply::Create(Nfs3Result::Ok(ok)) = &reply
            && let Nfs3Option::Some(h) = &ok.obj
        {
            self.changed(&h.data);
        }
        match &reply {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                let fh = ok.object.data.to_vec();
                if let Some((dir, name)) = &lookup {
                    self.note_name(&fh, dir, name);
                }
                self.note_post_op(&fh, &ok.obj_attributes);
                if matches!(&ok.obj_attributes, Nfs3Option::Some(a) if a.type_ == ftype3::NF3REG) {
                    self.look_early(cx, fh);
                }
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
        NfsRequest::Access(a) => &a.object,
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

impl Layer for MetaLayer {
    fn below(&self) -> &dyn NfsService {
        &*self.inner
    }

    fn what(&self) -> String {
        "metadata actions".into()
    }

    async fn handle(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        {
            match req {
                NfsRequest::Read(args) => self.read(cx, args).await,
                NfsRequest::Write(args) => match self.held_whole(&args.file.data) {
                    Some(f) => self.write_held(cx, &f, args).await,
                    None => self.forward(cx, NfsRequest::Write(args)).await,
                },
                NfsRequest::Commit(args) => match self.held_dirty(&args.file.data) {
                    Some(f) => self.commit_held(&f).await,
                    None => self.forward(cx, NfsRequest::Commit(args)).await,
                },
                NfsRequest::Setattr(args) => {
                    // A size or time change applies to upstream's copy:
                    // write the file's local writes back first, and let
                    // it go, WRITEs that come meanwhile going upstream
                    // (none may stay here, unseen by the change).
                    if let (Some(f), Some(copy)) = (self.held_dirty(&args.object.data), &self.copy)
                    {
                        copy.files
                            .write_back_and_let_go(copy.source.as_ref(), &f)
                            .await
                            .map_err(ServiceError::from)?;
                    }
                    self.forward(cx, NfsRequest::Setattr(args)).await
                }
                other => {
                    // Only a proxy with a file cache has files to patch.
                    let fh = self.copy.as_ref().and_then(|_| subject_of(&other));
                    let mut reply = self.forward(cx, other).await?;
                    if self.copy.is_some() {
                        self.patch_held(&mut reply, fh);
                    }
                    Ok(reply)
                }
            }
        }
    }
}

#[cfg(test)]
mod files_tests {
    use super::*;

    #[test]
    fn remembered_metadata_is_held_to_a_memory_budget() {
        let mut files = Files::default();
        let half = MAX_META_BYTES / 2;
        for (i, fh) in [b"a", b"b"].iter().enumerate() {
            files.remember(half - 1);
            MetaLayer::entry(&mut files, &fh[..]);
            assert_eq!(files.len(), i + 1);
        }
        // A third would pass the budget: the table empties first.
        files.remember(half);
        assert!(files.is_empty());
        assert_eq!(files.meta_bytes, half);
    }
}
