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
//! - the root handle (MNT), GETATTR, LOOKUP, ACCESS, FSINFO and PATHCONF
//!   from a successful reply to the same arguments and the same caller's
//!   credentials at most the timeout ago;
//! - GETATTR also from the attributes a LOOKUP or ACCESS reply carried for
//!   that object (and a LOOKUP's for its directory), as a client's
//!   attribute cache takes them: opening a file costs LOOKUP and ACCESS,
//!   not a third round trip for GETATTR.
//!
//! Any call that may change something (WRITE, SETATTR, CREATE, REMOVE,
//! RENAME, COMMIT...) empties the cache before it is forwarded, and so does
//! the end of every write-back job, so this proxy's own clients read their
//! writes; changes made upstream by others
//! show within the timeout, as with a kernel client's attribute cache.
//! Entries are bounded ([`MAX_ENTRIES`]): when full, expired entries go,
//! then everything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gvfs_nfs::client::Reply;
use gvfs_nfs::nfs3_types::nfs3::{
    GETATTR3args, GETATTR3resok, Nfs3Option, Nfs3Result, fattr3, nfs_fh3, nfsstat3,
};
use gvfs_nfs::nfs3_types::xdr_codec::Void;
use gvfs_nfs::proc::{NfsProc, NfsReply, NfsRequest};
use gvfs_nfs::rpc::Credentials;
use gvfs_nfs::service::{BoxFuture, CallContext, NfsService, ServiceError};

/// Most cached replies (each a few hundred bytes at most).
pub const MAX_ENTRIES: usize = 16_384;

/// Calls whose successful replies are kept.
fn cacheable(p: NfsProc) -> bool {
    matches!(
        p,
        NfsProc::Getattr | NfsProc::Lookup | NfsProc::Access | NfsProc::Fsinfo | NfsProc::Pathconf
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
                | NfsProc::Fsstat
        )
}

/// The caller as far as permissions go.
fn cred_key(cred: &Credentials) -> Vec<u32> {
    match cred {
        Credentials::None => vec![u32::MAX],
        Credentials::Unix(u) => {
            let mut k = vec![u.uid, u.gid];
            k.extend(&u.gids);
            k
        }
    }
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

/// Hits and misses, for `gvfsctl stats`.
#[derive(Debug, Default)]
pub struct AttrCacheStats {
    /// Calls answered here (NULL included).
    pub hits: AtomicU64,
    /// Cacheable calls that went below.
    pub misses: AtomicU64,
    /// Times a changing call or a write-back emptied a non-empty cache.
    pub invalidations: AtomicU64,
}

/// The layer.
pub struct AttrCache {
    below: Arc<dyn NfsService>,
    ttl: Duration,
    entries: Mutex<HashMap<Key, Entry>>,
    roots: Mutex<HashMap<Vec<u32>, (Instant, nfs_fh3)>>,
    stats: AttrCacheStats,
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
        Arc::new(Self {
            below,
            ttl,
            entries: Mutex::new(HashMap::new()),
            roots: Mutex::new(HashMap::new()),
            stats: AttrCacheStats::default(),
        })
    }

    /// Its counters.
    pub fn stats(&self) -> &AttrCacheStats {
        &self.stats
    }

    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() < self.ttl
    }

    /// Forgets every reply. Called before any changing call, and after a
    /// write-back (which changes files upstream without a call through
    /// here: a file held whole by compress-and-copy must not show its
    /// attributes from before the writes once the metadata layer lets it go).
    pub fn invalidate(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut roots = self.roots.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.is_empty() && roots.is_empty() {
            return;
        }
        self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
        entries.clear();
        roots.clear();
    }

    fn lookup(&self, key: &Key) -> Option<NfsReply> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let e = entries.get(key)?;
        if !self.fresh(e.at) {
            return None;
        }
        NfsReply::decode(e.proc_, &e.reply).ok()
    }

    fn store(&self, key: Key, reply: &NfsReply) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.at.elapsed() < self.ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
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

impl NfsService for AttrCache {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            let p = req.proc_();
            if p == NfsProc::Null {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(NfsReply::Null(Void));
            }
            if !read_only(p) {
                self.invalidate();
                return self.below.call(cx, req).await;
            }
            if !cacheable(p) {
                return self.below.call(cx, req).await;
            }
            let mut args = Vec::new();
            req.encode(&mut args);
            let key = Key {
                proc_: p as u32,
                args,
                cred: cred_key(&cx.cred),
            };
            if let Some(reply) = self.lookup(&key) {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(reply);
            }
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
            let subject = subject(&req);
            let reply = self.below.call(cx, req).await?;
            if reply.status() == nfsstat3::NFS3_OK {
                for (object, attrs) in carried_attrs(subject, &reply) {
                    self.store(getattr_key(object, key.cred.clone()), &getattr_reply(attrs));
                }
                self.store(key, &reply);
            }
            Ok(reply)
        })
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async move {
            let key = cred_key(&cx.cred);
            {
                let roots = self.roots.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some((at, fh)) = roots.get(&key)
                    && self.fresh(*at)
                {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(fh.clone());
                }
            }
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
            let fh = self.below.root(cx).await?;
            let mut roots = self.roots.lock().unwrap_or_else(PoisonError::into_inner);
            if roots.len() >= MAX_ENTRIES {
                roots.clear();
            }
            roots.insert(key, (Instant::now(), fh.clone()));
            Ok(fh)
        })
    }

    fn describe(&self) -> String {
        format!(
            "attribute cache ({} s) over {}",
            self.ttl.as_secs_f64(),
            self.below.describe()
        )
    }

    fn forward_raw<'a>(
        &'a self,
        cx: &'a CallContext,
        proc_: NfsProc,
        args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        if !read_only(proc_) {
            self.invalidate();
        }
        self.below.forward_raw(cx, proc_, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gvfs_nfs::nfs3_types::nfs3::{
        ACCESS3args, ACCESS3resok, COMMIT3args, LOOKUP3args, LOOKUP3resok, diropargs3, filename3,
    };
    use gvfs_nfs::nfs3_types::xdr_codec::Opaque;

    const LOOKUP_OBJ_SIZE: u64 = 1 << 40;
    const LOOKUP_DIR_SIZE: u64 = 1 << 41;
    const ACCESS_OBJ_SIZE: u64 = 1 << 42;

    /// Answers GETATTR with the number of calls that reached it as the size,
    /// LOOKUP (but of `missing`) and ACCESS with attributes of the sizes
    /// above, and every other call with an error; counts what reached it.
    #[derive(Default)]
    struct Below {
        calls: AtomicU64,
        roots: AtomicU64,
    }

    fn fh(b: &[u8]) -> nfs_fh3 {
        nfs_fh3 {
            data: Opaque::owned(b.to_vec()),
        }
    }

    fn attrs(size: u64) -> fattr3 {
        gvfs_nfs::testing::file_attrs(size, 0)
    }

    impl NfsService for Below {
        fn call<'a>(
            &'a self,
            _cx: &'a CallContext,
            req: NfsRequest,
        ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
                Ok(match req {
                    NfsRequest::Lookup(a) if a.what.name.as_ref() != b"missing" => {
                        NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                            object: fh(a.what.name.as_ref()),
                            obj_attributes: Nfs3Option::Some(attrs(LOOKUP_OBJ_SIZE)),
                            dir_attributes: Nfs3Option::Some(attrs(LOOKUP_DIR_SIZE)),
                        }))
                    }
                    NfsRequest::Access(a) => NfsReply::Access(Nfs3Result::Ok(ACCESS3resok {
                        obj_attributes: Nfs3Option::Some(attrs(ACCESS_OBJ_SIZE)),
                        access: a.access,
                    })),
                    NfsRequest::Getattr(a) if a.object.data.as_ref() != b"gone" => {
                        NfsReply::Getattr(Nfs3Result::Ok(GETATTR3resok {
                            obj_attributes: attrs(n),
                        }))
                    }
                    other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOENT),
                })
            })
        }

        fn root<'a>(
            &'a self,
            _cx: &'a CallContext,
        ) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
            Box::pin(async move {
                self.roots.fetch_add(1, Ordering::Relaxed);
                Ok(fh(b"root"))
            })
        }

        fn describe(&self) -> String {
            "fake".into()
        }
    }

    async fn size(c: &AttrCache, cx: &CallContext, f: &[u8]) -> Option<u64> {
        match c
            .call(cx, NfsRequest::Getattr(GETATTR3args { object: fh(f) }))
            .await
            .expect("call")
        {
            NfsReply::Getattr(Nfs3Result::Ok(ok)) => Some(ok.obj_attributes.size),
            _ => None,
        }
    }

    fn setup(ttl: Duration) -> (Arc<Below>, Arc<AttrCache>) {
        let below = Arc::new(Below::default());
        let cache = AttrCache::new(below.clone(), ttl);
        (below, cache)
    }

    #[tokio::test]
    async fn repeated_getattr_is_answered_here_until_the_timeout() {
        let (below, c) = setup(Duration::from_millis(300));
        let cx = CallContext::with_cred(Credentials::unix(1, 1));
        assert_eq!(size(&c, &cx, b"a").await, Some(1));
        assert_eq!(size(&c, &cx, b"a").await, Some(1), "from the cache");
        assert_eq!(size(&c, &cx, b"b").await, Some(2), "another handle");
        assert_eq!(below.calls.load(Ordering::Relaxed), 2);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(size(&c, &cx, b"a").await, Some(3), "expired: asked again");
        assert_eq!(c.stats().hits.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats().misses.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn errors_are_not_kept_and_callers_do_not_share_entries() {
        let (below, c) = setup(Duration::from_secs(60));
        let cx = CallContext::with_cred(Credentials::unix(1, 1));
        assert_eq!(size(&c, &cx, b"gone").await, None);
        assert_eq!(size(&c, &cx, b"gone").await, None);
        assert_eq!(
            below.calls.load(Ordering::Relaxed),
            2,
            "NOENT is not cached"
        );
        assert_eq!(size(&c, &cx, b"a").await, Some(3));
        let other = CallContext::with_cred(Credentials::unix(2, 2));
        assert_eq!(
            size(&c, &other, b"a").await,
            Some(4),
            "another user asks below"
        );
        assert_eq!(size(&c, &other, b"a").await, Some(4));
    }

    #[tokio::test]
    async fn lookup_and_access_replies_answer_getattr_of_what_they_describe() {
        let (below, c) = setup(Duration::from_secs(60));
        let cx = CallContext::with_cred(Credentials::unix(1, 1));
        let lookup = |name: &[u8]| {
            NfsRequest::Lookup(LOOKUP3args {
                what: diropargs3 {
                    dir: fh(b"dir"),
                    name: filename3::from(name.to_vec()),
                },
            })
        };
        match c.call(&cx, lookup(b"f")).await.expect("lookup") {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => assert_eq!(ok.object, fh(b"f")),
            other => panic!("{other:?}"),
        }
        let asked = below.calls.load(Ordering::Relaxed);
        assert_eq!(size(&c, &cx, b"f").await, Some(LOOKUP_OBJ_SIZE));
        assert_eq!(size(&c, &cx, b"dir").await, Some(LOOKUP_DIR_SIZE));
        assert_eq!(
            below.calls.load(Ordering::Relaxed),
            asked,
            "GETATTR of the object and its directory answered from the LOOKUP"
        );
        let other = CallContext::with_cred(Credentials::unix(2, 2));
        assert_ne!(
            size(&c, &other, b"f").await,
            Some(LOOKUP_OBJ_SIZE),
            "another caller asks below"
        );

        let access = NfsRequest::Access(ACCESS3args {
            object: fh(b"g"),
            access: 1,
        });
        c.call(&cx, access).await.expect("access");
        let asked = below.calls.load(Ordering::Relaxed);
        assert_eq!(size(&c, &cx, b"g").await, Some(ACCESS_OBJ_SIZE));
        assert_eq!(below.calls.load(Ordering::Relaxed), asked);

        // A failed LOOKUP leaves nothing behind.
        c.call(&cx, lookup(b"missing")).await.expect("lookup");
        assert_ne!(size(&c, &cx, b"missing").await, Some(LOOKUP_OBJ_SIZE));
    }

    #[tokio::test]
    async fn a_changing_call_empties_it_and_null_and_root_stay_local() {
        let (below, c) = setup(Duration::from_secs(60));
        let cx = CallContext::with_cred(Credentials::unix(1, 1));
        assert_eq!(size(&c, &cx, b"a").await, Some(1));
        let commit = NfsRequest::Commit(COMMIT3args {
            file: fh(b"a"),
            offset: 0,
            count: 0,
        });
        c.call(&cx, commit).await.expect("commit");
        assert_eq!(
            size(&c, &cx, b"a").await,
            Some(3),
            "asked again after COMMIT"
        );
        assert_eq!(c.stats().invalidations.load(Ordering::Relaxed), 1);

        let before = below.calls.load(Ordering::Relaxed);
        let null = NfsRequest::decode(0, &[]).expect("NULL");
        assert!(matches!(c.call(&cx, null).await, Ok(NfsReply::Null(_))));
        assert_eq!(
            below.calls.load(Ordering::Relaxed),
            before,
            "NULL stays here"
        );
        for _ in 0..3 {
            assert_eq!(c.root(&cx).await.expect("root"), fh(b"root"));
        }
        assert_eq!(below.roots.load(Ordering::Relaxed), 1);
    }
}
