//! The kit every layer of a stack is built with, so each layer's code says
//! only what it adds:
//!
//! - [`Layer`]: a layer handles calls over the one below it; the
//!   [`NfsService`] plumbing (boxing, the root, descriptions that name the
//!   layers below) is written once, here.
//! - [`Calls`]: typed calls to the layer below (`getattr`, `read`,
//!   `lookup`, `access`, `write`, `commit`), a reply of the wrong kind
//!   being the layer below's protocol error.
//! - [`WriteCheck`]: may this caller write this file? By its mode, else by
//!   ACCESS through the layers below, remembered for a while.
//! - [`Counter`] and [`counters!`](crate::counters): event counters and
//!   the serde snapshot that `gvfsctl stats` and metrics show.
//! - [`lock`]: a mutex guard even when a holder panicked (the tables
//!   layers keep stay usable; a panic is a bug reported on its own).
//! - [`Lifecycle`]: a layer's part in write-back and exit (write back,
//!   invalidate, close, its backlog), so a stack walks its layers for
//!   them without naming their types.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nfs3_types::nfs3::{
    ACCESS3_EXTEND, ACCESS3_MODIFY, ACCESS3args, ACCESS3res, COMMIT3args, COMMIT3res, GETATTR3args,
    GETATTR3res, LOOKUP3args, LOOKUP3res, READ3args, READ3res, WRITE3args, WRITE3res, diropargs3,
    filename3, nfs_fh3, nfsstat3,
};
use nfs3_types::xdr_codec::Opaque;

use crate::proc::{NfsProc, NfsReply, NfsRequest};
use crate::rpc::Reply;
use crate::service::{BoxFuture, CallContext, NfsService, ServiceError};

mod lifecycle;

pub use lifecycle::{Backlog, Lifecycle, Progress, WriteBackKind, WriteBackReport};

/// A layer of the stack: an [`NfsService`] over the service below it.
/// Implement this (not `NfsService`) and the layer is a service.
pub trait Layer: Send + Sync + 'static {
    /// The service below.
    fn below(&self) -> &dyn NfsService;

    /// What this layer is, in a few words and its settings: a stack
    /// describes itself as each layer's words "over" the one below.
    fn what(&self) -> String;

    /// Runs one NFSv3 call on behalf of `cx`.
    fn handle(
        &self,
        cx: &CallContext,
        req: NfsRequest,
    ) -> impl Future<Output = Result<NfsReply, ServiceError>> + Send;

    /// The root's file handle: by default, the layer below's.
    fn handle_root<'a>(
        &'a self,
        cx: &'a CallContext,
    ) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        self.below().root(cx)
    }

    /// A READ or WRITE in XDR form (see [`NfsService::forward_raw`]): by
    /// default `None`, the layer sees every call typed. A layer that only
    /// watches calls go by may pass them on.
    fn handle_raw<'a>(
        &'a self,
        _cx: &'a CallContext,
        _proc: NfsProc,
        _args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        None
    }
}

impl<L: Layer> NfsService for L {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(self.handle(cx, req))
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        self.handle_root(cx)
    }

    fn describe(&self) -> String {
        format!("{} over {}", self.what(), self.below().describe())
    }

    fn forward_raw<'a>(
        &'a self,
        cx: &'a CallContext,
        proc_: NfsProc,
        args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        self.handle_raw(cx, proc_, args)
    }
}

/// A file handle for a call.
pub fn fh3(fh: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(fh.to_vec()),
    }
}

/// The error for a reply of another kind than the call: the service that
/// sent it broke the protocol.
fn mismatch(below: &(impl NfsService + ?Sized), what: NfsProc, got: &NfsReply) -> ServiceError {
    ServiceError::UpstreamProtocol {
        upstream: below.describe(),
        reason: format!(
            "{} answered with a {} reply",
            what.name(),
            got.proc_().name()
        ),
    }
}

/// Typed calls to a service, for layers that make calls of their own.
/// Each answers the procedure's result (`Ok` or an NFS status), or the
/// service's error; a reply of another kind is a protocol error.
pub trait Calls: NfsService {
    /// GETATTR of `fh`.
    fn getattr<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &[u8],
    ) -> impl Future<Output = Result<GETATTR3res, ServiceError>> + Send + 'a {
        let req = NfsRequest::Getattr(GETATTR3args { object: fh3(fh) });
        async move {
            match self.call(cx, req).await? {
                NfsReply::Getattr(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Getattr, &other)),
            }
        }
    }

    /// READ of `count` bytes of `fh` at `offset`.
    fn read<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &[u8],
        offset: u64,
        count: u32,
    ) -> impl Future<Output = Result<READ3res<'static>, ServiceError>> + Send + 'a {
        let req = NfsRequest::Read(READ3args {
            file: fh3(fh),
            offset,
            count,
        });
        async move {
            match self.call(cx, req).await? {
                NfsReply::Read(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Read, &other)),
            }
        }
    }

    /// LOOKUP of `name` in `dir`.
    fn lookup<'a>(
        &'a self,
        cx: &'a CallContext,
        dir: &nfs_fh3,
        name: &filename3<'_>,
    ) -> impl Future<Output = Result<LOOKUP3res, ServiceError>> + Send + 'a {
        let req = NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: dir.clone(),
                name: name.clone_to_owned(),
            },
        });
        async move {
            match self.call(cx, req).await? {
                NfsReply::Lookup(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Lookup, &other)),
            }
        }
    }

    /// ACCESS: which of `access` the caller has on `fh`.
    fn access<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &[u8],
        access: u32,
    ) -> impl Future<Output = Result<ACCESS3res, ServiceError>> + Send + 'a {
        let req = NfsRequest::Access(ACCESS3args {
            object: fh3(fh),
            access,
        });
        async move {
            match self.call(cx, req).await? {
                NfsReply::Access(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Access, &other)),
            }
        }
    }

    /// WRITE (arguments as given).
    fn write<'a>(
        &'a self,
        cx: &'a CallContext,
        args: WRITE3args<'static>,
    ) -> impl Future<Output = Result<WRITE3res, ServiceError>> + Send + 'a {
        async move {
            match self.call(cx, NfsRequest::Write(args)).await? {
                NfsReply::Write(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Write, &other)),
            }
        }
    }

    /// COMMIT of the whole of `fh`.
    fn commit<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &[u8],
    ) -> impl Future<Output = Result<COMMIT3res, ServiceError>> + Send + 'a {
        let req = NfsRequest::Commit(COMMIT3args {
            file: fh3(fh),
            offset: 0,
            count: 0,
        });
        async move {
            match self.call(cx, req).await? {
                NfsReply::Commit(r) => Ok(r),
                other => Err(mismatch(self, NfsProc::Commit, &other)),
            }
        }
    }
}

impl<S: NfsService + ?Sized> Calls for S {}

/// What a file's attributes say about writing it, for [`WriteCheck`].
#[derive(Debug, Clone, Copy)]
pub struct WriteTarget<'a> {
    /// The file's handle.
    pub fh: &'a [u8],
    /// Its owner, group and mode.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Its mode bits.
    pub mode: u32,
    /// Whether the write makes it longer (needs ACCESS3_EXTEND).
    pub extends: bool,
}

/// Whether callers may write files, for layers that answer WRITEs without
/// sending them below at once (the block cache, the file cache). Upstream
/// would check when the WRITE reached it; kept here, it is checked first:
/// by the file's mode (no round trip, so writes go on during an outage),
/// and when the mode says no, by ACCESS with the caller's credentials (an
/// ACL may say yes), whose answer is remembered for [`WriteCheck::TTL`].
#[derive(Debug, Default)]
pub struct WriteCheck {
    granted: Mutex<HashMap<CallerFile, (Instant, u32)>>,
}

/// A file handle and a caller's credentials ([`Credentials::key`](crate::Credentials::key)).
type CallerFile = (Vec<u8>, Vec<u32>);

impl WriteCheck {
    /// How long an ACCESS answer is trusted.
    pub const TTL: Duration = Duration::from_secs(30);
    /// Answers remembered at most (then all are forgotten).
    pub const MAX_ENTRIES: usize = 4096;

    /// `Ok(Ok(()))` when `cx`'s caller may write `file`, `Ok(Err(status))`
    /// when not (NFS3ERR_ACCES, or the status ACCESS failed with), `Err`
    /// when `below` could not answer.
    pub async fn may_write(
        &self,
        below: &(impl NfsService + ?Sized),
        cx: &CallContext,
        file: WriteTarget<'_>,
    ) -> Result<Result<(), nfsstat3>, ServiceError> {
        if cx.cred.may_write_by_mode(file.uid, file.gid, file.mode) {
            return Ok(Ok(()));
        }
        let want = ACCESS3_MODIFY | if file.extends { ACCESS3_EXTEND } else { 0 };
        let key = (file.fh.to_vec(), cx.cred.key());
        let known = lock(&self.granted)
            .get(&key)
            .filter(|(at, _)| at.elapsed() < Self::TTL)
            .map(|(_, granted)| *granted);
        let granted = match known {
            Some(g) => g,
            None => {
                let granted = match below
                    .access(cx, file.fh, ACCESS3_MODIFY | ACCESS3_EXTEND)
                    .await?
                {
                    nfs3_types::nfs3::Nfs3Result::Ok(ok) => ok.access,
                    nfs3_types::nfs3::Nfs3Result::Err((st, _)) => return Ok(Err(st)),
                };
                let mut checks = lock(&self.granted);
                if checks.len() >= Self::MAX_ENTRIES {
                    checks.clear();
                }
                checks.insert(key, (Instant::now(), granted));
                granted
            }
        };
        Ok(if granted & want == want {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_ACCES)
        })
    }
}

/// A mutex's guard even when a holder panicked.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An event counter (relaxed: counters are for people, not for
/// synchronisation).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Counts `n` more.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one more.
    pub fn inc(&self) {
        self.add(1);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Declares a layer's counters once: a struct of [`Counter`]s the layer
/// bumps, and its snapshot, a plain serde struct of the same fields and
/// docs, which `gvfsctl stats`, the control socket and metrics show.
///
/// ```
/// gvfs_nfs::counters! {
///     /// What the layer counts.
///     pub struct Counters => Snapshot {
///         /// READ calls.
///         reads,
///     }
/// }
/// let c = Counters::default();
/// c.reads.inc();
/// assert_eq!(c.snapshot(), Snapshot { reads: 1 });
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $counters:ident => $snapshot:ident {
            $( $(#[$field_meta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $counters {
            $( $(#[$field_meta])* pub $field: $crate::layer::Counter, )*
        }

        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        $vis struct $snapshot {
            $( $(#[$field_meta])* pub $field: u64, )*
        }

        impl $counters {
            /// The counts now.
            pub fn snapshot(&self) -> $snapshot {
                $snapshot { $( $field: self.$field.get(), )* }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use nfs3_types::nfs3::{ACCESS3resok, Nfs3Option, Nfs3Result};
    use nfs3_types::xdr_codec::Void;

    use super::*;
    use crate::Credentials;

    /// Answers ACCESS with `grant` (or `status`), counting the calls, and
    /// NULL to anything else (a reply of the wrong kind).
    struct Below {
        grant: u32,
        status: Option<nfsstat3>,
        calls: AtomicU32,
    }

    impl NfsService for Below {
        fn call<'a>(
            &'a self,
            _cx: &'a CallContext,
            req: NfsRequest,
        ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let reply = match (req, self.status) {
                (NfsRequest::Access(_), Some(st)) => NfsReply::error(NfsProc::Access, st),
                (NfsRequest::Access(_), None) => NfsReply::Access(Nfs3Result::Ok(ACCESS3resok {
                    obj_attributes: Nfs3Option::None,
                    access: self.grant,
                })),
                _ => NfsReply::Null(Void),
            };
            Box::pin(async move { Ok(reply) })
        }

        fn root<'a>(
            &'a self,
            _cx: &'a CallContext,
        ) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
            Box::pin(async { Ok(fh3(b"root")) })
        }

        fn describe(&self) -> String {
            "below".into()
        }
    }

    fn below(grant: u32, status: Option<nfsstat3>) -> Below {
        Below {
            grant,
            status,
            calls: AtomicU32::new(0),
        }
    }

    /// A file of uid 1, gid 1, mode 0644.
    fn file(extends: bool) -> WriteTarget<'static> {
        WriteTarget {
            fh: b"f",
            uid: 1,
            gid: 1,
            mode: 0o644,
            extends,
        }
    }

    fn run<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn the_owner_writes_by_mode_without_asking() {
        let (b, check) = (below(0, None), WriteCheck::default());
        let owner = CallContext::with_cred(Credentials::unix(1, 1));
        assert_eq!(run(check.may_write(&b, &owner, file(true))), Ok(Ok(())));
        assert_eq!(b.calls.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stranger_is_asked_about_once_and_extending_needs_extend() {
        let (b, check) = (below(ACCESS3_MODIFY, None), WriteCheck::default());
        let stranger = CallContext::with_cred(Credentials::unix(7, 7));
        // The mode says no; ACCESS (an ACL) says MODIFY but not EXTEND.
        assert_eq!(run(check.may_write(&b, &stranger, file(false))), Ok(Ok(())));
        assert_eq!(
            run(check.may_write(&b, &stranger, file(true))),
            Ok(Err(nfsstat3::NFS3ERR_ACCES))
        );
        // The answer is remembered: one ACCESS for both.
        assert_eq!(b.calls.load(Ordering::Relaxed), 1);
        // Another caller is asked about on its own.
        let other = CallContext::with_cred(Credentials::unix(8, 8));
        let _ = run(check.may_write(&b, &other, file(false)));
        assert_eq!(b.calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_access_failure_is_the_answer_and_not_remembered() {
        let (b, check) = (
            below(0, Some(nfsstat3::NFS3ERR_STALE)),
            WriteCheck::default(),
        );
        let stranger = CallContext::with_cred(Credentials::unix(7, 7));
        for _ in 0..2 {
            assert_eq!(
                run(check.may_write(&b, &stranger, file(false))),
                Ok(Err(nfsstat3::NFS3ERR_STALE))
            );
        }
        assert_eq!(b.calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_reply_of_another_kind_is_the_layer_belows_protocol_error() {
        let b = below(0, None);
        let cx = CallContext::with_cred(Credentials::unix(0, 0));
        match run(b.getattr(&cx, b"f")) {
            Err(ServiceError::UpstreamProtocol { upstream, reason }) => {
                assert_eq!(upstream, "below");
                assert!(
                    reason.contains("GETATTR") && reason.contains("NULL"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
