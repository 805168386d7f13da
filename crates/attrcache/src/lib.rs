//! An attribute and name cache, like an NFS client's `actimeo`
//! (`--attr-timeout SECS`; off by default).
//!
//! Every client session (an `nfs-cp`, a `qemu-img`, a QEMU opening its disk)
//! starts with the same few calls: NULL, MNT, FSINFO, then LOOKUP, GETATTR
//! and ACCESS along the path. Across a WAN each costs a round trip, and for
//! read-only golden images they return the same thing every time. With a
//! timeout set, this layer (just above the block cache, below the metadata
//! layer, so its patches stay on top) answers:
//! - NULL at once (it pings the server the client talks to: this proxy);
//! - the root handle (MNT), GETATTR, LOOKUP, ACCESS, FSINFO, PATHCONF and
//!   FSSTAT from a successful reply to the same arguments and the same
//!   caller's credentials at most the timeout ago (FSSTAT's free space as
//!   stale as attributes may be: a VM monitor asks for it whenever it opens
//!   its memory file, a round trip across a WAN);
//! - GETATTR also from the attributes a LOOKUP or ACCESS reply carried for
//!   that object (and a LOOKUP's for its directory), as a client's
//!   attribute cache takes them: opening a file costs LOOKUP and ACCESS,
//!   not a third round trip for GETATTR;
//! - LOOKUP of any name in a directory from one READDIRPLUS of it, sent
//!   along with the first LOOKUP there that misses (one reply of at most
//!   [`LIST_MAXCOUNT`] bytes): a clone's session looks up a handful of
//!   names in its image's directory (the files, their metadata files), and
//!   each would cost a round trip. When that reply holds the whole
//!   directory, names not in it are answered NOENT. Entries are kept only
//!   if the LOOKUP sent with it found the name or not (so the caller may
//!   search the directory), under that caller's credentials. The LOOKUP's
//!   reply waits for the listing at most [`LIST_GRACE`]; a slower one (a
//!   huge directory) is kept when it comes.
//!
//! Any call that may change something (WRITE, SETATTR, CREATE, REMOVE,
//! RENAME, COMMIT...) empties the cache before it is forwarded, and so does
//! the end of every write-back job (a reply on its way meanwhile is not
//! kept), so this proxy's own clients read their writes; changes made upstream by others
//! show within the timeout, as with a kernel client's attribute cache.
//! Entries are bounded ([`MAX_ENTRIES`]): when full, expired entries go,
//! and everything when that frees less than a quarter (so a full table is
//! not scanned again at every new entry).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gvfs_nfs::layer::{Layer, Lifecycle, lock};
use gvfs_nfs::nfs3_types::nfs3::{
    GETATTR3args, GETATTR3resok, LOOKUP3args, LOOKUP3resfail, LOOKUP3resok, Nfs3Option, Nfs3Result,
    READDIRPLUS3args, cookieverf3, diropargs3, fattr3, filename3, nfs_fh3, nfsstat3, post_op_attr,
};
use gvfs_nfs::nfs3_types::xdr_codec::{Opaque, Void};
use gvfs_nfs::proc::{NfsProc, NfsReply, NfsRequest};
use gvfs_nfs::rpc::Reply;
use gvfs_nfs::service::{BoxFuture, CallContext, NfsService, ServiceError};

/// Most cached replies (each a few hundred bytes at most).
pub const MAX_ENTRIES: usize = 16_384;
/// Most entries left after dropping the expired ones of a full table;
/// past this the table is emptied.
const KEPT_AFTER_EXPIRY: usize = MAX_ENTRIES / 4 * 3;

/// The READDIRPLUS sent with a directory's first LOOKUP asks for at most
/// this many bytes of reply (a few hundred entries), and ...
pub const LIST_MAXCOUNT: u32 = 32 * 1024;
/// ... this many bytes of names and cookies.
const LIST_DIRCOUNT: u32 = 8 * 1024;
/// How long a LOOKUP's reply waits, once it is here, for the READDIRPLUS
/// sent with it (which normally arrives with it), so that the next names
/// are answered here; a slower one is kept when it comes.
pub const LIST_GRACE: Duration = Duration::from_millis(100);

/// Calls whose successful replies are kept.
fn cacheable(p: NfsProc) -> bool {
    matches!(
        p,
        NfsProc::Getattr
            | NfsProc::Lookup
            | NfsProc::Access
            | NfsProc::Fsinfo
            | NfsProc::Pathconf
            | NfsProc::Fsstat
    )
}

/// Calls that change nothing, so they leave the cache as it is.
fn read_only(p: NfsProc) -> bool {
    cacheable(p)
        || matches!(
            p,
            NfsProc::Null
                | NfsProc::Read
                | NfsProc::Readlink
                | NfsProc::Readdir
                | NfsProc::Readdirplus
        )
}

/// The handle in a call's arguments whose attributes its reply carries
/// (LOOKUP's directory, ACCESS's object).
fn subject(req: &NfsRequest) -> Option<nfs_fh3> {
    match req {
        NfsRequest::Lookup(a) => Some(a.what.dir.clone()),
        NfsRequest::Access(a) => Some(a.object.clone()),
        _ => None,
    }
}

/// The objects a successful reply gives the attributes of, as GETATTR of
/// each would: LOOKUP's object and directory, ACCESS's object. An NFS
/// client's attribute cache takes them from any reply; kept as GETATTR
/// answers, they spare the GETATTR every client sends after LOOKUP and
/// ACCESS when it opens a file (a round trip per file across a WAN).
fn carried_attrs(subject: Option<nfs_fh3>, reply: &NfsReply) -> Vec<(nfs_fh3, &fattr3)> {
    let mut out = Vec::new();
    match (reply, subject) {
        (NfsReply::Lookup(Nfs3Result::Ok(ok)), Some(dir)) => {
            if let Nfs3Option::Some(a) = &ok.obj_attributes {
                out.push((ok.object.clone(), a));
            }
            if let Nfs3Option::Some(a) = &ok.dir_attributes {
                out.push((dir, a));
            }
        }
        (NfsReply::Access(Nfs3Result::Ok(ok)), Some(object)) => {
            if let Nfs3Option::Some(a) = &ok.obj_attributes {
                out.push((object, a));
            }
        }
        _ => {}
    }
    out
}

fn getattr_key(object: nfs_fh3, cred: Vec<u32>) -> Key {
    let mut args = Vec::new();
    NfsRequest::Getattr(GETATTR3args { object }).encode(&mut args);
    Key {
        proc_: NfsProc::Getattr as u32,
        args,
        cred,
    }
}

fn lookup_key(dir: &nfs_fh3, name: &[u8], cred: &[u32]) -> Key {
    let mut args = Vec::new();
    NfsRequest::Lookup(LOOKUP3args {
        what: diropargs3 {
            dir: dir.clone(),
            name: filename3(Opaque::owned(name.to_vec())),
        },
    })
    .encode(&mut args);
    Key {
        proc_: NfsProc::Lookup as u32,
        args,
        cred: cred.to_vec(),
    }
}

fn getattr_reply(attrs: &fattr3) -> NfsReply {
    NfsReply::Getattr(Nfs3Result::Ok(GETATTR3resok {
        obj_attributes: attrs.clone(),
    }))
}

#[derive(Hash, PartialEq, Eq)]
struct Key {
    proc_: u32,
    args: Vec<u8>,
    cred: Vec<u32>,
}

/// A reply, as XDR (replies are not `Clone`).
struct Entry {
    at: Instant,
    proc_: NfsProc,
    reply: Vec<u8>,
}

/// A directory's handle and a caller ([`gvfs_nfs::rpc::Credentials::key`]).
type ListedKey = (Vec<u8>, Vec<u32>);

/// A directory read ahead for one caller.
struct Listed {
    /// When it was asked for (no later than its entries were kept).
    at: Instant,
    /// Its attributes, when the reply held the whole directory: names not
    /// in it are answered NOENT.
    whole: Option<post_op_attr>,
}

gvfs_nfs::counters! {
    /// Hits and misses, for `gvfsctl stats`.
    pub struct Counters => AttrCacheStats {
        /// Calls answered here (NULL included).
        hits,
        /// Cacheable calls that went below.
        misses,
        /// Directories read (READDIRPLUS) along with a LOOKUP that missed.
        listings,
        /// Times a changing call or a write-back emptied a non-empty cache.
        invalidations,
    }
}

/// The layer.
pub struct AttrCache {
    /// Itself, for a directory's reading that outlasts the LOOKUP it went
    /// with.
    me: std::sync::Weak<AttrCache>,
    below: Arc<dyn NfsService>,
    ttl: Duration,
    entries: Mutex<HashMap<Key, Entry>>,
    roots: Mutex<HashMap<Vec<u32>, (Instant, nfs_fh3)>>,
    /// Directories read ahead, by handle and caller.
    listed: Mutex<HashMap<ListedKey, Listed>>,
    /// Bumped by every [`AttrCache::invalidate`], under the locks: a reply
    /// that was on its way while the cache was emptied is not kept.
    generation: AtomicU64,
    stats: Counters,
}

impl std::fmt::Debug for AttrCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttrCache")
            .field("ttl", &self.ttl)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AttrCache {
    /// Caches for `ttl` on top of `below`.
    pub fn new(below: Arc<dyn NfsService>, ttl: Duration) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            below,
            ttl,
            entries: Mutex::new(HashMap::new()),
            roots: Mutex::new(HashMap::new()),
            listed: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            stats: Counters::default(),
        })
    }

    /// Its counters.
    pub fn stats(&self) -> AttrCacheStats {
        self.stats.snapshot()
    }

    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() < self.ttl
    }

    /// Forgets every reply. Called before any changing call, and after a
    /// write-back (which changes files upstream without a call through
    /// here: a file held whole by compress-and-copy must not show its
    /// attributes from before the writes once the metadata layer lets it go).
    pub fn invalidate(&self) {
        let mut entries = lock(&self.entries);
        let mut roots = lock(&self.roots);
        let mut listed = lock(&self.listed);
        self.generation.fetch_add(1, Ordering::Relaxed);
        if entries.is_empty() && roots.is_empty() && listed.is_empty() {
            return;
        }
        self.stats.invalidations.inc();
        entries.clear();
        roots.clear();
        listed.clear();
    }

    /// Whether to read `dir` along with a LOOKUP in it: not when this
    /// caller had it read within the timeout. Marks it read.
    fn should_list(&self, dir: &nfs_fh3, cred: &[u32]) -> bool {
        let mut listed = lock(&self.listed);
        let key = (dir.data.as_ref().to_vec(), cred.to_vec());
        if listed.get(&key).is_some_and(|l| self.fresh(l.at)) {
            return false;
        }
        if listed.len() >= MAX_ENTRIES {
            listed.retain(|_, l| l.at.elapsed() < self.ttl);
            if listed.len() > KEPT_AFTER_EXPIRY {
                listed.clear();
            }
        }
        let at = Instant::now();
        listed.insert(key, Listed { at, whole: None });
        true
    }

    /// NOENT for a name in `dir` that a fresh reading of the whole
    /// directory for this caller did not hold (its names were kept, so a
    /// LOOKUP that got here is for another name).
    fn not_listed(&self, dir: &nfs_fh3, cred: &[u32]) -> Option<NfsReply> {
        let listed = lock(&self.listed);
        let l = listed.get(&(dir.data.as_ref().to_vec(), cred.to_vec()))?;
        let dir_attributes = l.whole.clone().filter(|_| self.fresh(l.at))?;
        Some(NfsReply::Lookup(Nfs3Result::Err((
            nfsstat3::NFS3ERR_NOENT,
            LOOKUP3resfail { dir_attributes },
        ))))
    }

    /// Keeps what a READDIRPLUS of `dir` says as LOOKUP replies (and
    /// their GETATTRs), and, when it is the whole directory, NOENT for
    /// every other name.
    fn store_listing(&self, dir: &nfs_fh3, cred: &[u32], listing: &NfsReply, seen: u64) {
        let NfsReply::Readdirplus(Nfs3Result::Ok(ok)) = listing else {
            return;
        };
        let at = Instant::now();
        let mut names = 0;
        // A name listed without its handle (a mount point, an entry that
        // changed while read) is not kept, so the listing no longer says
        // which names are absent.
        let mut all_kept = true;
        for e in &ok.reply.entries.0 {
            let name = e.name.0.as_ref();
            if name == b"." || name == b".." {
                continue;
            }
            let Nfs3Option::Some(object) = &e.name_handle else {
                all_kept = false;
                continue;
            };
            let reply = NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                object: object.clone(),
                obj_attributes: e.name_attributes.clone(),
                dir_attributes: ok.dir_attributes.clone(),
            }));
            for (object, attrs) in carried_attrs(Some(dir.clone()), &reply) {
                self.store(
                    getattr_key(object, cred.to_vec()),
                    &getattr_reply(attrs),
                    seen,
                );
            }
            self.store(lookup_key(dir, name, cred), &reply, seen);
            names += 1;
        }
        if ok.reply.eof && all_kept {
            let mut listed = lock(&self.listed);
            if self.generation.load(Ordering::Relaxed) != seen {
                return;
            }
            if let Some(l) = listed.get_mut(&(dir.data.as_ref().to_vec(), cred.to_vec())) {
                l.at = at;
                l.whole = Some(ok.dir_attributes.clone());
            }
        }
        tracing::debug!(
            names,
            whole = ok.reply.eof,
            "attribute cache: read a directory ahead"
        );
    }

    fn lookup(&self, key: &Key) -> Option<NfsReply> {
        let entries = lock(&self.entries);
        let e = entries.get(key)?;
        if !self.fresh(e.at) {
            return None;
        }
        NfsReply::decode(e.proc_, &e.reply).ok()
    }

    /// Keeps `reply` to `key`, unless the cache was emptied since `seen`
    /// (the generation when the call went below).
    fn store(&self, key: Key, reply: &NfsReply, seen: u64) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        let mut entries = lock(&self.entries);
        if self.generation.load(Ordering::Relaxed) != seen {
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.at.elapsed() < self.ttl);
            if entries.len() > KEPT_AFTER_EXPIRY {
                entries.clear();
                // Their names are gone: a listing no longer says which
                // names are not there, and one still being kept must not
                // mark its directory whole with half its names.
                lock(&self.listed).clear();
                self.generation.fetch_add(1, Ordering::Relaxed);
            }
        }
        entries.insert(
            key,
            Entry {
                at: Instant::now(),
                proc_: reply.proc_(),
                reply: bytes,
            },
        );
    }
}

impl AttrCache {
    /// Keeps a successful reply to `key` and the attributes it carries
    /// about `subject` and the object.
    fn keep(&self, key: Key, subject: Option<nfs_fh3>, reply: &NfsReply, seen: u64) {
        if reply.status() != nfsstat3::NFS3_OK {
            return;
        }
        for (object, attrs) in carried_attrs(subject, reply) {
            self.store(
                getattr_key(object, key.cred.clone()),
                &getattr_reply(attrs),
                seen,
            );
        }
        self.store(key, reply, seen);
    }
}

impl Layer for AttrCache {
    fn below(&self) -> &dyn NfsService {
        &*self.below
    }

    fn what(&self) -> String {
        format!("attribute cache ({} s)", self.ttl.as_secs_f64())
    }

    async fn handle(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        {
            let p = req.proc_();
            if p == NfsProc::Null {
                self.stats.hits.inc();
                return Ok(NfsReply::Null(Void));
            }
            if !read_only(p) {
                // Before, and again after: a reply fetched while the call
                // was on its way may describe the file before it changed.
                self.invalidate();
                let reply = self.below.call(cx, req).await;
                self.invalidate();
                return reply;
            }
            if !cacheable(p) {
                return self.below.call(cx, req).await;
            }
            let mut args = Vec::new();
            req.encode(&mut args);
            let key = Key {
                proc_: p as u32,
                args,
                cred: cx.cred.key(),
            };
            if let Some(reply) = self.lookup(&key) {
                self.stats.hits.inc();
                return Ok(reply);
            }
            let subject = subject(&req);
            let seen = self.generation.load(Ordering::Relaxed);
            if let (NfsRequest::Lookup(a), Some(dir)) = (&req, &subject) {
                // "." and ".." are in every directory, and not kept from
                // a listing.
                let dots = [&b"."[..], b".."].contains(&a.what.name.as_ref());
                if let Some(reply) = self.not_listed(dir, &key.cred).filter(|_| !dots) {
                    self.stats.hits.inc();
                    return Ok(reply);
                }
                if self.should_list(dir, &key.cred) {
                    self.stats.misses.inc();
                    self.stats.listings.inc();
                    let list = NfsRequest::Readdirplus(READDIRPLUS3args {
                        dir: dir.clone(),
                        cookie: 0,
                        cookieverf: cookieverf3::default(),
                        dircount: LIST_DIRCOUNT,
                        maxcount: LIST_MAXCOUNT,
                    });
                    // In a task of its own: a slow listing (a huge
                    // directory) never holds up the LOOKUP.
                    let listing = {
                        let (below, cx) = (self.below.clone(), cx.clone());
                        tokio::spawn(async move { below.call(&cx, list).await })
                    };
                    let reply = match self.below.call(cx, req).await {
                        Ok(reply) => reply,
                        Err(e) => {
                            listing.abort();
                            return Err(e);
                        }
                    };
                    let searched =
                        matches!(reply.status(), nfsstat3::NFS3_OK | nfsstat3::NFS3ERR_NOENT);
                    match self.me.upgrade() {
                        Some(me) if searched => {
                            let (dir, cred) = (dir.clone(), key.cred.clone());
                            let mut kept = tokio::spawn(async move {
                                if let Ok(Ok(listing)) = listing.await {
                                    me.store_listing(&dir, &cred, &listing, seen);
                                }
                            });
                            let _ = tokio::time::timeout(LIST_GRACE, &mut kept).await;
                        }
                        _ => listing.abort(),
                    }
                    self.keep(key, subject, &reply, seen);
                    return Ok(reply);
                }
            }
            self.stats.misses.inc();
            let reply = self.below.call(cx, req).await?;
            self.keep(key, subject, &reply, seen);
            Ok(reply)
        }
    }

    fn handle_root<'a>(
        &'a self,
        cx: &'a CallContext,
    ) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async move {
            let key = cx.cred.key();
            {
                let roots = lock(&self.roots);
                if let Some((at, fh)) = roots.get(&key)
                    && self.fresh(*at)
                {
                    self.stats.hits.inc();
                    return Ok(fh.clone());
                }
            }
            self.stats.misses.inc();
            let seen = self.generation.load(Ordering::Relaxed);
            let fh = self.below.root(cx).await?;
            let mut roots = lock(&self.roots);
            if self.generation.load(Ordering::Relaxed) != seen {
                return Ok(fh);
            }
            if roots.len() >= MAX_ENTRIES {
                roots.clear();
            }
            roots.insert(key, (Instant::now(), fh.clone()));
            Ok(fh)
        })
    }

    fn handle_raw<'a>(
        &'a self,
        cx: &'a CallContext,
        proc_: NfsProc,
        args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        if !read_only(proc_) {
            self.invalidate();
            let call = self.below.forward_raw(cx, proc_, args)?;
            return Some(Box::pin(async move {
                let reply = call.await;
                self.invalidate();
                reply
            }));
        }
        self.below.forward_raw(cx, proc_, args)
    }
}

/// The attribute cache's part in write-back: emptied when a write-back
/// changed files below without a call through it.
impl Lifecycle for AttrCache {
    fn name(&self) -> &'static str {
        "attribute cache"
    }

    fn invalidate(&self) {
        AttrCache::invalidate(self);
    }
}

#[cfg(test)]
mod tests;
