//! The RPC front end: turns one incoming call record into one reply record.
//!
//! Sans-IO apart from awaiting the service: [`FrontEnd::handle`] takes the
//! bytes of a record and the caller's address and returns the reply record
//! (or nothing, when the call must be dropped). It routes the three programs
//! a proxy serves on its one port (NFS v3, MOUNT v3, PORTMAP v2) and answers
//! RPC-level errors as RFC 5531 section 9 says: PROG_UNAVAIL, PROG_MISMATCH,
//! PROC_UNAVAIL, GARBAGE_ARGS, RPC_MISMATCH and AUTH_ERROR.

mod mount;
mod portmap;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gvfs_nfs::proc::{MAX_DATA, NfsProc, raw};
use gvfs_nfs::rpc::{self, CallError, CallHeader, ReplyRecord, ReplyStatus, auth_stat};
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService, ServiceError};

use crate::drc::{Drc, DrcKey, Lookup, PeerId};

use gvfs_nfs::proc::CallName;
pub use gvfs_nfs::proc::{MOUNT_PROGRAM, NFS_PROGRAM};

/// Counters kept by the front end, shown by `gvfsctl status`.
#[derive(Debug, Default)]
pub struct FrontStats {
    /// NFS calls run, per procedure.
    pub nfs_calls: [AtomicU64; 22],
    /// NFS calls that failed below the front end (no reply from a layer).
    pub service_errors: AtomicU64,
    /// Retransmissions answered or dropped by the duplicate-request cache.
    pub drc_hits: AtomicU64,
    /// Calls answered GARBAGE_ARGS, PROC_UNAVAIL, PROG_* or AUTH_ERROR.
    pub rpc_errors: AtomicU64,
    /// MOUNT calls.
    pub mount_calls: AtomicU64,
    /// PORTMAP calls.
    pub portmap_calls: AtomicU64,
    /// Bytes returned by READ.
    pub read_bytes: AtomicU64,
    /// Bytes accepted by WRITE.
    pub write_bytes: AtomicU64,
    /// Calls of the gvfs extension program (compress-and-copy between
    /// proxies).
    pub ext_calls: AtomicU64,
}

/// Maps the credentials a call carries to those the layers below see: the
/// tunnel's identity mapping for one authenticated peer.
pub type CredMap = Arc<dyn Fn(&gvfs_nfs::Credentials) -> gvfs_nfs::Credentials + Send + Sync>;

/// Who is at the other end of a connection.
#[derive(Clone, Default)]
pub struct Peer {
    /// The socket address, when the call came over a socket.
    pub addr: Option<SocketAddr>,
    /// The name in the peer's verified TLS certificate, if it sent one.
    pub name: Option<Arc<str>>,
    /// Identity mapping for this peer; `None` passes credentials through.
    pub map: Option<CredMap>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("addr", &self.addr)
            .field("name", &self.name)
            .field("mapped", &self.map.is_some())
            .finish()
    }
}

impl Peer {
    /// A plain connection from `addr`.
    pub fn plain(addr: Option<SocketAddr>) -> Peer {
        Peer {
            addr,
            ..Peer::default()
        }
    }

    fn id(&self) -> PeerId {
        match (&self.name, self.addr) {
            (Some(name), _) => PeerId::cert(name),
            (None, Some(a)) => PeerId::Addr(a.ip()),
            (None, None) => PeerId::Unknown,
        }
    }
}

/// Serves NFS v3, MOUNT v3 and PORTMAP v2 for one export over `service`.
pub struct FrontEnd {
    service: Arc<dyn NfsService>,
    export: String,
    port: u16,
    drc: Drc,
    mounts: mount::MountTable,
    ext: Option<Arc<crate::ext_server::ExtServer>>,
    stats: FrontStats,
}

impl std::fmt::Debug for FrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontEnd")
            .field("export", &self.export)
            .field("service", &self.service.describe())
            .finish()
    }
}

impl FrontEnd {
    /// A front end exporting `service` as `export` (e.g. `/export`), whose
    /// PORTMAP answers `port` for its programs.
    pub fn new(service: Arc<dyn NfsService>, export: String, port: u16) -> Self {
        Self {
            service,
            export,
            port,
            drc: Drc::new(4096, Duration::from_secs(300)),
            mounts: mount::MountTable::default(),
            ext: None,
            stats: FrontStats::default(),
        }
    }

    /// Also answers the gvfs extension program with `ext`.
    pub fn with_ext(mut self, ext: Arc<crate::ext_server::ExtServer>) -> Self {
        self.ext = Some(ext);
        self
    }

    /// The export path clients mount.
    pub fn export(&self) -> &str {
        &self.export
    }

    /// The layer stack below.
    pub fn service(&self) -> &Arc<dyn NfsService> {
        &self.service
    }

    /// Counters.
    pub fn stats(&self) -> &FrontStats {
        &self.stats
    }

    /// Runs one call record from `peer` and returns the reply record, or
    /// `None` when the message must be dropped (not a call, or a duplicate
    /// whose original is still running).
    pub async fn handle(&self, msg: &[u8], peer: &Peer) -> Option<ReplyRecord> {
        let (hdr, args_at) = match rpc::parse_call(msg) {
            Ok(v) => v,
            Err(e) => return self.reject(e).map(ReplyRecord::from),
        };
        let args = &msg[args_at..];
        let cx = CallContext {
            cred: match &peer.map {
                Some(map) => map(&hdr.cred),
                None => hdr.cred.clone(),
            },
            peer: peer.addr,
            xid: hdr.xid,
        };
        let start = std::time::Instant::now();
        let reply = match hdr.prog {
            NFS_PROGRAM => self.nfs(&hdr, &cx, peer.id(), args).await,
            MOUNT_PROGRAM => {
                self.stats.mount_calls.fetch_add(1, Ordering::Relaxed);
                Some(self.mount(&hdr, &cx, args).await.into())
            }
            gvfs_nfs::portmap::PROGRAM => {
                self.stats.portmap_calls.fetch_add(1, Ordering::Relaxed);
                Some(self.portmap(&hdr, args).into())
            }
            gvfs_ext::PROGRAM if self.ext.is_some() => {
                self.stats.ext_calls.fetch_add(1, Ordering::Relaxed);
                let ext = self.ext.as_ref()?;
                Some(
                    match ext.handle(&cx, hdr.vers, hdr.proc_, args).await {
                        Ok(results) => rpc::reply_record(hdr.xid, ReplyStatus::Success, &results),
                        Err(crate::ext_server::ExtRefusal::Rpc(status)) => {
                            self.error(hdr.xid, status)
                        }
                    }
                    .into(),
                )
            }
            _ => Some(self.error(hdr.xid, ReplyStatus::ProgUnavail).into()),
        };
        tracing::trace!(
            peer = ?peer.addr,
            call = %CallName(hdr.prog, hdr.proc_),
            xid = hdr.xid,
            ms = start.elapsed().as_secs_f64() * 1e3,
            "client call answered"
        );
        reply
    }

    fn reject(&self, e: CallError) -> Option<Vec<u8>> {
        tracing::debug!(error = %e, "rejecting call");
        let (xid, status) = match e {
            CallError::RpcMismatch { xid, .. } => (xid, ReplyStatus::RpcMismatch),
            CallError::BadCredential { xid } => (xid, ReplyStatus::AuthError(auth_stat::BADCRED)),
            // RFC 9289 section 4.1: AUTH_TLS is only for the NULL probe.
            CallError::UnsupportedFlavor {
                xid,
                flavor: rpc::flavor::TLS,
                header: Some((_, _, proc_)),
            } if proc_ != 0 => (xid, ReplyStatus::AuthError(auth_stat::BADCRED)),
            CallError::UnsupportedFlavor { xid, .. } => {
                (xid, ReplyStatus::AuthError(auth_stat::TOOWEAK))
            }
            _ => return None,
        };
        Some(self.error(xid, status))
    }

    fn error(&self, xid: u32, status: ReplyStatus) -> Vec<u8> {
        self.stats.rpc_errors.fetch_add(1, Ordering::Relaxed);
        rpc::reply_record(xid, status, &[])
    }

    async fn nfs(
        &self,
        hdr: &CallHeader,
        cx: &CallContext,
        peer: PeerId,
        args: &[u8],
    ) -> Option<ReplyRecord> {
        if hdr.vers != 3 {
            return Some(
                self.error(hdr.xid, ReplyStatus::ProgMismatch { low: 3, high: 3 })
                    .into(),
            );
        }
        let Some(p) = NfsProc::from_u32(hdr.proc_) else {
            return Some(self.error(hdr.xid, ReplyStatus::ProcUnavail).into());
        };
        self.stats.nfs_calls[p as usize].fetch_add(1, Ordering::Relaxed);
        if !p.is_non_idempotent() {
            return Some(self.execute(cx, p, args).await);
        }
        let key = DrcKey::new(peer, hdr.xid, hdr.prog, hdr.proc_, &cx.cred, args);
        match self.drc.begin(key) {
            Lookup::New => {}
            Lookup::InProgress => {
                self.stats.drc_hits.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Lookup::Replay(reply) => {
                self.stats.drc_hits.fetch_add(1, Ordering::Relaxed);
                return Some(reply.to_vec().into());
            }
        }
        let reply = Arc::new(self.execute(cx, p, args).await.into_vec());
        self.drc.finish(key, Some(reply.clone()));
        Some(Arc::try_unwrap(reply).unwrap_or_else(|a| a.to_vec()).into())
    }

    /// Runs one NFS call: READ and WRITE in their XDR form when the layer
    /// below forwards them raw, everything else decoded and typed.
    async fn execute(&self, cx: &CallContext, p: NfsProc, args: &[u8]) -> ReplyRecord {
        let raw_len = match p {
            NfsProc::Write => raw::write_args(args).ok(),
            // A READ asking more than we carry goes the typed way, clamped.
            NfsProc::Read => raw::read_args(args)
                .ok()
                .filter(|count| *count <= MAX_DATA)
                .map(|_| 0),
            _ => None,
        };
        if let Some(write_len) = raw_len
            && let Some(forward) = self.service.forward_raw(cx, p, args)
        {
            return match forward.await {
                Ok(results) => {
                    self.stats
                        .write_bytes
                        .fetch_add(write_len as u64, Ordering::Relaxed);
                    if p == NfsProc::Read {
                        let n = raw::read_results(&results).unwrap_or(0);
                        self.stats.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    // Upstream's results follow our header as they came.
                    let (record, at) = results.into_record();
                    let head = rpc::reply_start(cx.xid, ReplyStatus::Success, 0);
                    ReplyRecord::new(head, record, at)
                }
                Err(e) => self.failed(cx, p, &e).into(),
            };
        }
        match NfsRequest::decode(p as u32, args) {
            Ok(req) => self.run(cx, req).await,
            Err(e) => {
                tracing::debug!(xid = cx.xid, error = %e, "garbage arguments");
                self.error(cx.xid, ReplyStatus::GarbageArgs).into()
            }
        }
    }

    /// The reply when a layer failed to produce one.
    fn failed(&self, cx: &CallContext, p: NfsProc, e: &ServiceError) -> Vec<u8> {
        self.stats.service_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(proc = p.name(), xid = cx.xid, error = %e, "call failed below the front end");
        match e.rpc_status() {
            Some(status) => self.error(cx.xid, status),
            None => encode_success(cx.xid, &e.to_reply(p)),
        }
    }

    /// Runs a decoded NFS call through the stack and encodes the reply.
    async fn run(&self, cx: &CallContext, mut req: NfsRequest) -> ReplyRecord {
        let p = req.proc_();
        clamp_request(&mut req);
        if let NfsRequest::Mknod(m) = &req
            && matches!(m.what, nfs3_types::nfs3::mknoddata3::default)
        {
            // MKNOD makes devices, sockets and FIFOs only (RFC 1813
            // section 3.3.11); any other type has no body to pass on.
            let reply = NfsReply::error(p, nfs3_types::nfs3::nfsstat3::NFS3ERR_BADTYPE);
            return encode_success(cx.xid, &reply).into();
        }
        if let NfsRequest::Write(w) = &req {
            self.stats
                .write_bytes
                .fetch_add(w.data.len() as u64, Ordering::Relaxed);
        }
        let mut reply = match self.service.call(cx, req).await {
            Ok(r) => r,
            Err(e) => return self.failed(cx, p, &e).into(),
        };
        clamp_reply(&mut reply);
        if let NfsReply::Read(nfs3_types::nfs3::Nfs3Result::Ok(ok)) = &reply {
            self.stats
                .read_bytes
                .fetch_add(ok.data.len() as u64, Ordering::Relaxed);
        }
        // A READ's data is not copied: it follows the header as it is.
        let mut head = rpc::reply_start(cx.xid, ReplyStatus::Success, 256);
        let data = reply.encode_split(&mut head);
        ReplyRecord::new(head, data, 0)
    }
}

/// Caps what a call may ask for at what this proxy carries ([`MAX_DATA`]):
/// servers may return less than asked (RFC 1813 sections 3.3.6, 3.3.16,
/// 3.3.17), so a clamped call is still answered correctly.
fn clamp_request(req: &mut NfsRequest) {
    match req {
        NfsRequest::Read(a) => a.count = a.count.min(MAX_DATA),
        NfsRequest::Readdir(a) => a.count = a.count.min(MAX_DATA),
        NfsRequest::Readdirplus(a) => {
            a.dircount = a.dircount.min(MAX_DATA);
            a.maxcount = a.maxcount.min(MAX_DATA);
        }
        _ => {}
    }
}

/// Advertises at most [`MAX_DATA`] per READ, WRITE and READDIR in FSINFO,
/// whatever the layer below allows, so clients never send a record larger
/// than this proxy's caps.
fn clamp_reply(reply: &mut NfsReply) {
    if let NfsReply::Fsinfo(nfs3_types::nfs3::Nfs3Result::Ok(ok)) = reply {
        for v in [
            &mut ok.rtmax,
            &mut ok.rtpref,
            &mut ok.wtmax,
            &mut ok.wtpref,
            &mut ok.dtpref,
        ] {
            *v = (*v).min(MAX_DATA);
        }
    }
}

/// A success reply record carrying `reply`.
fn encode_success(xid: u32, reply: &NfsReply) -> Vec<u8> {
    let hint = match reply {
        NfsReply::Read(nfs3_types::nfs3::Nfs3Result::Ok(ok)) => ok.data.len() + 128,
        _ => 256,
    };
    let mut out = rpc::reply_start(xid, ReplyStatus::Success, hint);
    reply.encode(&mut out);
    rpc::seal(out)
}

/// Room for a reply's header, attributes and handles.
const SMALL_REPLY: usize = 1024;

/// The most bytes the reply to call record `msg` can take as far as the
/// call says: a READ's count, a READDIR's, a whole-file chunk of the
/// extension program; [`SMALL_REPLY`] for any other call (or one that
/// does not parse). Reads only the header and a few arguments, for the
/// server edge's memory budget.
pub fn reply_size_hint(msg: &[u8]) -> usize {
    use gvfs_nfs::proc::MAX_FH_LEN;
    use gvfs_nfs::xdr::{XdrError, XdrReader};
    let mut r = XdrReader::new(msg);
    let mut data = || -> Result<u32, XdrError> {
        for _ in 0..3 {
            r.u32()?; // xid, message type, RPC version
        }
        let (prog, vers, proc_) = (r.u32()?, r.u32()?, r.u32()?);
        for _ in 0..2 {
            r.u32()?;
            r.opaque(rpc::MAX_AUTH_BYTES)?; // credential, verifier
        }
        let skip = |r: &mut XdrReader<'_>, words: usize| -> Result<(), XdrError> {
            for _ in 0..words {
                r.u32()?;
            }
            Ok(())
        };
        Ok(match (prog, vers, proc_) {
            // READ3args: file, offset, count.
            (NFS_PROGRAM, 3, 6) => {
                r.opaque(MAX_FH_LEN)?;
                skip(&mut r, 2)?;
                r.u32()?.min(MAX_DATA)
            }
            // READDIR3args: dir, cookie, verifier, count.
            (NFS_PROGRAM, 3, 16) => {
                r.opaque(MAX_FH_LEN)?;
                skip(&mut r, 4)?;
                r.u32()?.min(MAX_DATA)
            }
            // READDIRPLUS3args: dir, cookie, verifier, dircount, maxcount.
            (NFS_PROGRAM, 3, 17) => {
                r.opaque(MAX_FH_LEN)?;
                skip(&mut r, 5)?;
                r.u32()?.min(MAX_DATA)
            }
            // Every FETCH answers with up to a chunk.
            (gvfs_ext::PROGRAM, _, p)
                if [
                    gvfs_ext::PROC_FETCH,
                    gvfs_ext::PROC_FETCH_REPEATS,
                    gvfs_ext::PROC_FETCH_DEMAND,
                    gvfs_ext::PROC_FETCH_HAVE,
                ]
                .contains(&p) =>
            {
                gvfs_ext::CHUNK + gvfs_ext::MAX_FRAME_SLACK
            }
            _ => 0,
        })
    };
    // Counts are clamped to MAX_DATA as the calls are (`clamp_request`).
    data().unwrap_or(0) as usize + SMALL_REPLY
}

/// The NFS procedure named by `n`, for logs.
pub fn proc_name(n: usize) -> &'static str {
    NfsProc::ALL.get(n).map_or("?", |p| p.name())
}

#[cfg(test)]
mod tests;
