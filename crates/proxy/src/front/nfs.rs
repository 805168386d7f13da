//! NFS version 3 (RFC 1813) as a front end's program: each call decoded
//! (or, for READ and WRITE, offered raw to a layer that forwards them),
//! clamped to what this proxy carries, run on the stack's top, and
//! encoded; non-idempotent calls go through the duplicate-request cache.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::layer::Counter;
use gvfs_nfs::proc::{MAX_DATA, MAX_FH_LEN, NfsProc, raw};
use gvfs_nfs::rpc::{self, ReplyRecord, ReplyStatus};
use gvfs_nfs::xdr::{XdrError, XdrReader};
use gvfs_nfs::{BoxFuture, CallContext, NfsReply, NfsRequest, NfsService, ServiceError};

use super::program::{Answer, Call, FrontCounters, Program};
use crate::drc::{Drc, DrcKey, Lookup};

pub use gvfs_nfs::proc::NFS_PROGRAM;

/// NFS v3 over the layer stack.
pub struct NfsProgram {
    service: Arc<dyn NfsService>,
    drc: Drc,
    /// Calls run, per procedure.
    calls: [Counter; 22],
}

impl NfsProgram {
    /// NFS v3 answered by `service`, with a duplicate-request cache of
    /// 4096 replies kept 300 s.
    pub fn new(service: Arc<dyn NfsService>) -> Self {
        Self {
            service,
            drc: Drc::new(4096, Duration::from_secs(300)),
            calls: Default::default(),
        }
    }

    /// The calls run so far of each procedure called at least once, by
    /// name.
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.calls
            .iter()
            .zip(NfsProc::ALL)
            .filter(|(c, _)| c.get() > 0)
            .map(|(c, p)| (p.name().to_string(), c.get()))
            .collect()
    }

    async fn call(&self, call: Call<'_>) -> Answer {
        let Call {
            hdr,
            cx,
            peer,
            args,
            counters,
        } = call;
        let Some(p) = NfsProc::from_u32(hdr.proc_) else {
            return Answer::Refused(ReplyStatus::ProcUnavail);
        };
        self.calls[p as usize].inc();
        if !p.is_non_idempotent() {
            return Answer::Record(self.execute(cx, p, args, counters).await);
        }
        let key = DrcKey::new(peer, hdr.xid, hdr.prog, hdr.proc_, &cx.cred, args);
        match self.drc.begin(key) {
            Lookup::New => {}
            Lookup::InProgress => {
                counters.drc_hits.inc();
                return Answer::Dropped;
            }
            Lookup::Replay(reply) => {
                counters.drc_hits.inc();
                return Answer::Record(reply.to_vec().into());
            }
        }
        let reply = Arc::new(self.execute(cx, p, args, counters).await.into_vec());
        self.drc.finish(key, Some(reply.clone()));
        Answer::Record(Arc::try_unwrap(reply).unwrap_or_else(|a| a.to_vec()).into())
    }

    /// Runs one NFS call: READ and WRITE in their XDR form when the layer
    /// below forwards them raw, everything else decoded and typed.
    async fn execute(
        &self,
        cx: &CallContext,
        p: NfsProc,
        args: &[u8],
        counters: &FrontCounters,
    ) -> ReplyRecord {
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
                    counters.write_bytes.add(write_len as u64);
                    if p == NfsProc::Read {
                        let n = raw::read_results(&results).unwrap_or(0);
                        counters.read_bytes.add(n as u64);
                    }
                    // Upstream's results follow our header as they came.
                    let (record, at) = results.into_record();
                    let head = rpc::reply_start(cx.xid, ReplyStatus::Success, 0);
                    ReplyRecord::new(head, record, at)
                }
                Err(e) => failed(cx, p, &e, counters).into(),
            };
        }
        match NfsRequest::decode(p as u32, args) {
            Ok(req) => self.run(cx, req, counters).await,
            Err(e) => {
                tracing::debug!(xid = cx.xid, error = %e, "garbage arguments");
                counters.refuse(cx.xid, ReplyStatus::GarbageArgs).into()
            }
        }
    }

    /// Runs a decoded NFS call through the stack and encodes the reply.
    async fn run(
        &self,
        cx: &CallContext,
        mut req: NfsRequest,
        counters: &FrontCounters,
    ) -> ReplyRecord {
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
            counters.write_bytes.add(w.data.len() as u64);
        }
        let mut reply = match self.service.call(cx, req).await {
            Ok(r) => r,
            Err(e) => return failed(cx, p, &e, counters).into(),
        };
        clamp_reply(&mut reply);
        if let NfsReply::Read(nfs3_types::nfs3::Nfs3Result::Ok(ok)) = &reply {
            counters.read_bytes.add(ok.data.len() as u64);
        }
        // A READ's data is not copied: it follows the header as it is.
        let mut head = rpc::reply_start(cx.xid, ReplyStatus::Success, 256);
        let data = reply.encode_split(&mut head);
        ReplyRecord::new(head, data, 0)
    }
}

impl Program for NfsProgram {
    fn number(&self) -> u32 {
        NFS_PROGRAM
    }

    fn versions(&self) -> RangeInclusive<u32> {
        3..=3
    }

    fn advertised(&self) -> Option<u32> {
        Some(3)
    }

    /// A READ's count, a READDIR's or READDIRPLUS's, clamped to
    /// [`MAX_DATA`] as the calls are (`clamp_request`).
    fn reply_data(&self, vers: u32, proc_: u32, r: &mut XdrReader<'_>) -> Result<u32, XdrError> {
        let skip = |r: &mut XdrReader<'_>, words: usize| -> Result<(), XdrError> {
            for _ in 0..words {
                r.u32()?;
            }
            Ok(())
        };
        let words = match (vers, proc_) {
            // READ3args: file, offset, count.
            (3, 6) => 2,
            // READDIR3args: dir, cookie, verifier, count.
            (3, 16) => 4,
            // READDIRPLUS3args: dir, cookie, verifier, dircount, maxcount.
            (3, 17) => 5,
            _ => return Ok(0),
        };
        r.opaque(MAX_FH_LEN)?;
        skip(r, words)?;
        Ok(r.u32()?.min(MAX_DATA))
    }

    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(self.call(call))
    }
}

/// The reply when a layer failed to produce one.
fn failed(cx: &CallContext, p: NfsProc, e: &ServiceError, counters: &FrontCounters) -> Vec<u8> {
    counters.service_errors.inc();
    tracing::warn!(proc = p.name(), xid = cx.xid, error = %e, "call failed below the front end");
    match e.rpc_status() {
        Some(status) => counters.refuse(cx.xid, status),
        None => encode_success(cx.xid, &e.to_reply(p)),
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
