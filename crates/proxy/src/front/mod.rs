//! The RPC front end: turns one incoming call record into one reply record.
//!
//! Sans-IO apart from awaiting the service: [`FrontEnd::handle`] takes the
//! bytes of a record and the caller's address and returns the reply record
//! (or nothing, when the call must be dropped). It parses the call, maps
//! its credentials and routes it to the program registered for its number
//! ([`program::Programs`]): the three a proxy serves on its one port (NFS
//! v3 in `nfs.rs`, MOUNT v3 in `mount.rs`, PORTMAP v2 in `portmap.rs`) and
//! those given beside them (the extension program between proxies). It
//! answers RPC-level errors as RFC 5531 section 9 says: PROG_UNAVAIL,
//! PROG_MISMATCH (from the program's range of versions), and, from the
//! programs, PROC_UNAVAIL and GARBAGE_ARGS; RPC_MISMATCH and AUTH_ERROR
//! before a program is chosen.

mod mount;
mod nfs;
mod portmap;
pub mod program;

use std::net::SocketAddr;
use std::sync::Arc;

use gvfs_nfs::proc::CallName;
use gvfs_nfs::rpc::{self, CallError, ReplyRecord, ReplyStatus, auth_stat};
use gvfs_nfs::{CallContext, Class, NfsService, Tenant};

use crate::drc::PeerId;
use program::{Answer, Call, FrontCounters, Program, Programs};

pub use mount::{MOUNT_PROGRAM, MountProgram};
pub use nfs::{NFS_PROGRAM, NfsProgram};
pub use portmap::PortmapProgram;
pub use program::FrontCounts;

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
    /// The connection's id at its listener (0 when not over a socket).
    pub conn: u64,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("addr", &self.addr)
            .field("name", &self.name)
            .field("mapped", &self.map.is_some())
            .field("conn", &self.conn)
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

    /// Whom this peer's calls are billed to: one tenant per certificate
    /// name, whichever connection it comes on (the top bit set, so it never
    /// meets a connection id), else one per connection. Not the address: on
    /// loopback every plain client has the same one.
    pub fn tenant(&self) -> Tenant {
        match self.name.as_deref().map(PeerId::cert) {
            Some(PeerId::Cert(hash)) => Tenant(hash | 1 << 63),
            _ => Tenant(self.conn),
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

/// Serves NFS v3, MOUNT v3 and PORTMAP v2 for one export over a layer
/// stack, and the programs registered beside them.
pub struct FrontEnd {
    export: String,
    nfs: Arc<NfsProgram>,
    programs: Programs,
    counters: FrontCounters,
}

impl std::fmt::Debug for FrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontEnd")
            .field("export", &self.export)
            .field("programs", &self.programs)
            .finish()
    }
}

impl FrontEnd {
    /// A front end exporting `service` as `export` (e.g. `/export`) over
    /// NFS v3 and MOUNT v3, answering the programs of `more` beside them
    /// (the extension program), and PORTMAP for those it advertises, on
    /// `port`.
    pub fn new(
        service: Arc<dyn NfsService>,
        export: String,
        port: u16,
        more: Vec<Arc<dyn Program>>,
    ) -> Self {
        let nfs = Arc::new(NfsProgram::new(service.clone()));
        let mut list: Vec<Arc<dyn Program>> = vec![
            nfs.clone(),
            Arc::new(MountProgram::new(service, export.clone())),
        ];
        list.extend(more);
        let portmap = PortmapProgram::new(port, &Programs::new(list.clone()));
        list.insert(0, Arc::new(portmap));
        Self {
            export,
            nfs,
            programs: Programs::new(list),
            counters: FrontCounters::default(),
        }
    }

    /// The export path clients mount.
    pub fn export(&self) -> &str {
        &self.export
    }

    /// The counts so far.
    pub fn stats(&self) -> FrontCounts {
        self.counters.snapshot()
    }

    /// NFS calls so far of each procedure called at least once, by name.
    pub fn nfs_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.nfs.calls()
    }

    /// Runs one call record from `peer` and returns the reply record, or
    /// `None` when the message must be dropped (not a call, or a duplicate
    /// whose original is still running).
    pub async fn handle(&self, msg: &[u8], peer: &Peer) -> Option<ReplyRecord> {
        let (hdr, args_at) = match rpc::parse_call(msg) {
            Ok(v) => v,
            Err(e) => return self.reject(e).map(ReplyRecord::from),
        };
        let cx = CallContext {
            cred: match &peer.map {
                Some(map) => map(&hdr.cred),
                None => hdr.cred.clone(),
            },
            peer: peer.addr,
            xid: hdr.xid,
            tenant: peer.tenant(),
        };
        let start = std::time::Instant::now();
        let answer = match self.programs.get(hdr.prog) {
            None => Answer::Refused(ReplyStatus::ProgUnavail),
            Some(program) => {
                if let Some(calls) = program.calls_counter(&self.counters) {
                    calls.inc();
                }
                let versions = program.versions();
                if versions.contains(&hdr.vers) {
                    let call = Call {
                        hdr: &hdr,
                        cx: &cx,
                        peer: peer.id(),
                        args: &msg[args_at..],
                        counters: &self.counters,
                    };
                    program.answer(call).await
                } else {
                    Answer::Refused(ReplyStatus::ProgMismatch {
                        low: *versions.start(),
                        high: *versions.end(),
                    })
                }
            }
        };
        let reply = match answer {
            Answer::Results(results) => {
                Some(rpc::reply_record(hdr.xid, ReplyStatus::Success, &results).into())
            }
            Answer::Record(record) => Some(record),
            Answer::Refused(status) => Some(self.counters.refuse(hdr.xid, status).into()),
            Answer::Dropped => None,
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
        Some(self.counters.refuse(xid, status))
    }

    /// The most bytes the reply to call record `msg` can take as far as
    /// the call says: the data its program says the reply may carry (a
    /// READ's count, a READDIR's, a whole-file chunk of the extension
    /// program) plus [`SMALL_REPLY`]; [`SMALL_REPLY`] for any other call
    /// (or one that does not parse). Reads only the header and a few
    /// arguments, for the server edge's memory budget.
    pub fn reply_size_hint(&self, msg: &[u8]) -> usize {
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
            match self.programs.get(prog) {
                Some(program) => program.reply_data(vers, proc_, &mut r),
                None => Ok(0),
            }
        };
        data().unwrap_or(0) as usize + SMALL_REPLY
    }

    /// The class of call record `msg`, as its program says (reading the
    /// record as [`FrontEnd::reply_size_hint`] does): the order its reply
    /// leaves in when replies queue. A record that does not parse, or names
    /// no registered program, is [`Class::Demand`]: it is answered at once
    /// with an error, a small reply.
    pub fn call_class(&self, msg: &[u8]) -> Class {
        let Ok((hdr, args_at)) = rpc::parse_call(msg) else {
            return Class::Demand;
        };
        match self.programs.get(hdr.prog) {
            Some(program) => program.class(hdr.vers, hdr.proc_, &msg[args_at..]),
            None => Class::Demand,
        }
    }
}

/// Room for a reply's header, attributes and handles.
const SMALL_REPLY: usize = 1024;

#[cfg(test)]
mod tests;
