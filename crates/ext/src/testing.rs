//! A fake chunk source for the tests of crates built on this one (feature
//! `test-util`): serves one file's bytes over the [`ChunkSource`] API,
//! counting and optionally holding its FETCHes, keeping STOREs and
//! profiles.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gvfs_metafile::ByteRepeat;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::{BoxFuture, Credentials};

use crate::{
    CHUNK, ChunkSource, Class, FetchArgs, FetchError, FetchOk, Profile, StoreArgs, Tenant, Ticket,
    Want, compress,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn attrs(size: u64, mtime: u32) -> fattr3 {
    gvfs_nfs::testing::file_attrs(size, mtime)
}

/// A source serving `data` as a file, counting FETCHes, optionally
/// holding every fetch until released.
pub struct FakeSource {
    /// The file's bytes.
    pub data: Vec<u8>,
    /// The file's attributes, as FETCH answers them.
    pub attrs: fattr3,
    /// FETCHes asked.
    pub calls: AtomicU64,
    /// A permit a FETCH takes before it is answered.
    pub gate: tokio::sync::Semaphore,
    /// What each STORE wrote: offset and raw bytes.
    pub stored: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Ranges of `data` repeating earlier ranges: sent as zeros and
    /// listed, as a server with a repeat map does.
    pub repeats: Mutex<Vec<ByteRepeat>>,
    /// Files' attributes at the origin now (`attrs` for files not
    /// listed): a STORE's guard is checked against them, and each
    /// STORE moves their times on.
    pub origin: Mutex<HashMap<Vec<u8>, fattr3>>,
    /// STOREs started.
    pub stores: AtomicU64,
    /// A gate each STORE waits at (open unless a test closes it).
    pub store_gate: tokio::sync::Semaphore,
    /// Every FETCH's offset, count and class, in the order they came.
    pub fetched: Mutex<Vec<(u64, u32, Class)>>,
    /// Every FETCH's tenant, in the same order.
    pub tenants: Mutex<Vec<Tenant>>,
    /// Every FETCH's ticket, in the same order (its class may have been
    /// raised since).
    pub tickets: Mutex<Vec<Option<Arc<Ticket>>>>,
    /// The profile PROFILE_GET answers.
    pub profile: Mutex<Option<Profile>>,
    /// Profiles PROFILE_PUT was given.
    pub put: Mutex<Vec<Profile>>,
    /// What [`ChunkSource::part`] answers for background and bulk.
    pub part: AtomicU32,
}

impl FakeSource {
    /// A source of `data` whose FETCHes are answered at once when `open`,
    /// else each waits for a permit a test adds to [`FakeSource::gate`].
    pub fn new(data: Vec<u8>, open: bool) -> Arc<Self> {
        Arc::new(Self {
            attrs: attrs(data.len() as u64, 7),
            data,
            calls: AtomicU64::new(0),
            gate: tokio::sync::Semaphore::new(if open { 1 << 20 } else { 0 }),
            stored: Mutex::new(Vec::new()),
            repeats: Mutex::new(Vec::new()),
            origin: Mutex::new(HashMap::new()),
            stores: AtomicU64::new(0),
            store_gate: tokio::sync::Semaphore::new(1 << 20),
            fetched: Mutex::new(Vec::new()),
            tenants: Mutex::new(Vec::new()),
            tickets: Mutex::new(Vec::new()),
            profile: Mutex::new(None),
            put: Mutex::new(Vec::new()),
            part: AtomicU32::new(CHUNK),
        })
    }
}

impl ChunkSource for FakeSource {
    fn fetch<'a>(
        &'a self,
        _cred: &'a Credentials,
        args: &'a FetchArgs,
        want: &'a Want,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::Relaxed);
            {
                // Both under one lock's section, so their orders agree.
                let mut fetched = lock(&self.fetched);
                fetched.push((args.offset, args.count, want.class));
                lock(&self.tenants).push(want.tenant);
                lock(&self.tickets).push(want.ticket.clone());
            }
            // Each fetch uses up a permit: the test decides how many pass.
            if let Ok(p) = self.gate.acquire().await {
                p.forget();
            }
            let s = args.offset as usize;
            let e = (s + args.count as usize).min(self.data.len());
            let mut raw = self.data[s..e].to_vec();
            let mut listed = Vec::new();
            for r in lock(&self.repeats).iter() {
                let (a, b) = (
                    (r.to as usize).max(s),
                    (r.to as usize + r.len as usize).min(e),
                );
                if a < b {
                    raw[a - s..b - s].fill(0);
                    listed.push(ByteRepeat {
                        to: a as u64,
                        from: r.from + (a as u64 - r.to),
                        len: (b - a) as u32,
                    });
                }
            }
            let (codec, data) = compress(&raw, 3);
            Ok(FetchOk {
                attrs: self.attrs.clone(),
                raw_len: (e - s) as u32,
                eof: e == self.data.len(),
                codec,
                data,
                repeats: listed,
            })
        })
    }
    fn store<'a>(
        &'a self,
        _cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>> {
        Box::pin(async move {
            self.stores.fetch_add(1, Ordering::Relaxed);
            if let Ok(p) = self.store_gate.acquire().await {
                p.forget();
            }
            // A STORE that does not decompress, refused as the server does.
            let raw = args
                .clone()
                .raw()
                .map_err(|_| FetchError::Nfs(nfsstat3::NFS3ERR_INVAL))?;
            let mut files = lock(&self.origin);
            let origin = files
                .entry(args.fh.clone())
                .or_insert_with(|| self.attrs.clone());
            if args.guard.is_some_and(|g| !g.describes(origin)) {
                return Err(FetchError::Nfs(nfsstat3::NFS3ERR_NOT_SYNC));
            }
            let end = args.offset + raw.len() as u64;
            lock(&self.stored).push((args.offset, raw));
            let t = origin.mtime.seconds + 1;
            *origin = attrs(origin.size.max(end), t);
            Ok(origin.clone())
        })
    }
    fn supported(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }
    fn part(&self, class: Class) -> u32 {
        if class <= Class::Background {
            self.part.load(Ordering::Relaxed)
        } else {
            CHUNK
        }
    }
    fn put_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            lock(&self.put).push(profile.clone());
            Ok(())
        })
    }
    fn get_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<Profile>, FetchError>> {
        Box::pin(async move { Ok(lock(&self.profile).clone()) })
    }
    fn forward<'a>(
        &'a self,
        _cred: &'a Credentials,
        _args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(async { Err(FetchError::Nfs(nfsstat3::NFS3ERR_NOTSUPP)) })
    }
}
