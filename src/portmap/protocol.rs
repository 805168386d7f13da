//! The answers: PORTMAP v2 and rpcbind v3/v4 (RFC 1833), and the log of
//! calls that tests read.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use gvfs_nfs::portmap::{self as pm, Mapping};
use gvfs_nfs::rpc::{self, CallError, ReplyStatus};
use gvfs_nfs::xdr::{self, XdrError, XdrReader};

use super::state::{
    LoggedCall, Peer, Registration, Shared, format_uaddr, lock, parse_uaddr, prune_dead,
};

/// rpcbind protocol version 3 (RFC 1833 section 2.2).
pub const RPCBVERS3: u32 = 3;
/// rpcbind protocol version 4 (RFC 1833 section 2.2).
pub const RPCBVERS4: u32 = 4;

/// Largest netid, universal address or owner string accepted.
const MAX_STRING: usize = 255;
/// Most registrations kept; SETs beyond this are refused.
const MAX_REGISTRATIONS: usize = 1024;
/// Most calls kept in the call log.
const MAX_LOGGED_CALLS: usize = 512;

/// rpcbind procedure numbers (RFC 1833 section 2.2); v3 uses 0-8, v4 adds 9-12.
pub mod rpcb_procs {
    /// Do nothing.
    pub const NULL: u32 = 0;
    /// Register an address.
    pub const SET: u32 = 1;
    /// Remove registrations.
    pub const UNSET: u32 = 2;
    /// Look up an address.
    pub const GETADDR: u32 = 3;
    /// List all registrations.
    pub const DUMP: u32 = 4;
    /// Current time in seconds since the epoch.
    pub const GETTIME: u32 = 6;
    /// v4: GETADDR that honours the version exactly.
    pub const GETVERSADDR: u32 = 9;
}

/// What a procedure answers: its results and a summary for the log;
/// `Ok(None)` for a procedure not served (PROC_UNAVAIL), `Err` for arguments
/// that do not decode (GARBAGE_ARGS).
type Outcome = Result<Option<(Vec<u8>, String)>, XdrError>;

/// Answers one call; `None` when the message deserves no answer.
pub(super) fn handle(shared: &Shared, msg: &[u8], peer: &Peer) -> Option<Vec<u8>> {
    let (header, offset) = match rpc::parse_call(msg) {
        Ok(h) => h,
        Err(CallError::RpcMismatch { xid, .. }) => {
            return Some(rpc::reply_record(xid, ReplyStatus::RpcMismatch, &[]));
        }
        Err(CallError::BadCredential { xid }) => {
            return Some(rpc::reply_record(
                xid,
                ReplyStatus::AuthError(rpc::auth_stat::BADCRED),
                &[],
            ));
        }
        Err(CallError::UnsupportedFlavor { xid, .. }) => {
            return Some(rpc::reply_record(
                xid,
                ReplyStatus::AuthError(rpc::auth_stat::TOOWEAK),
                &[],
            ));
        }
        Err(_) => return None,
    };
    let xid = header.xid;
    if header.prog != pm::PROGRAM {
        return Some(rpc::reply_record(xid, ReplyStatus::ProgUnavail, &[]));
    }
    if !(pm::VERSION..=RPCBVERS4).contains(&header.vers) {
        let status = ReplyStatus::ProgMismatch {
            low: pm::VERSION,
            high: RPCBVERS4,
        };
        return Some(rpc::reply_record(xid, status, &[]));
    }
    let args = &msg[offset..];
    let outcome = if header.vers == pm::VERSION {
        portmap_v2(shared, header.proc_, args, peer)
    } else {
        rpcbind(shared, header.vers, header.proc_, args, peer)
    };
    let (status, results, summary) = match outcome {
        Ok(Some((results, summary))) => (ReplyStatus::Success, results, summary),
        Ok(None) => (
            ReplyStatus::ProcUnavail,
            Vec::new(),
            "PROC_UNAVAIL".to_owned(),
        ),
        Err(e) => (
            ReplyStatus::GarbageArgs,
            Vec::new(),
            format!("GARBAGE_ARGS: {e}"),
        ),
    };
    log_call(shared, peer, header.vers, header.proc_, summary);
    Some(rpc::reply_record(xid, status, &results))
}

pub(super) fn log_call(shared: &Shared, peer: &Peer, vers: u32, proc_: u32, summary: String) {
    if std::env::var_os("GVFS_PORTMAP_LOG").is_some() {
        eprintln!(
            "portmap: {} pid={:?} v{vers} proc {proc_}: {summary}",
            peer.transport, peer.pid
        );
    }
    let mut log = lock(&shared.log);
    if log.len() == MAX_LOGGED_CALLS {
        log.pop_front();
    }
    log.push_back(LoggedCall {
        seq: shared.calls.fetch_add(1, Ordering::Relaxed) + 1,
        transport: peer.transport,
        vers,
        proc_,
        pid: peer.pid,
        summary,
    });
}

pub(super) fn xdr_bool(v: bool) -> Vec<u8> {
    let mut out = Vec::new();
    xdr::put_u32(&mut out, u32::from(v));
    out
}

pub(super) fn netids_for(prot: u32) -> &'static [&'static str] {
    match prot {
        pm::IPPROTO_TCP => &["tcp", "tcp6"],
        pm::IPPROTO_UDP => &["udp", "udp6"],
        _ => &[],
    }
}

pub(super) fn prot_of(netid: &str) -> Option<u32> {
    match netid {
        "tcp" | "tcp6" => Some(pm::IPPROTO_TCP),
        "udp" | "udp6" => Some(pm::IPPROTO_UDP),
        _ => None,
    }
}

/// PORTMAP v2 (RFC 1833 section 3.2).
pub(super) fn portmap_v2(shared: &Shared, proc_: u32, args: &[u8], peer: &Peer) -> Outcome {
    let mut regs = lock(&shared.regs);
    prune_dead(&mut regs);
    match proc_ {
        pm::procs::NULL => Ok(Some((Vec::new(), "NULL".to_owned()))),
        pm::procs::SET => {
            let m = Mapping::decode(args)?;
            let Some(&netid) = netids_for(m.prot).first() else {
                return Ok(Some((
                    xdr_bool(false),
                    format!("SET {m:?}: unknown protocol"),
                )));
            };
            let port = u16::try_from(m.port).ok();
            let ok = port.is_some() && regs.len() < MAX_REGISTRATIONS;
            if let (true, Some(port)) = (ok, port) {
                regs.retain(|r| !(r.prog == m.prog && r.vers == m.vers && r.netid == netid));
                regs.push(Registration {
                    prog: m.prog,
                    vers: m.vers,
                    netid: netid.to_owned(),
                    uaddr: format_uaddr(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                    owner: "portmap-v2".to_owned(),
                    pid: peer.pid,
                });
            }
            Ok(Some((xdr_bool(ok), format!("SET {m:?} -> {ok}"))))
        }
        pm::procs::UNSET => {
            let m = Mapping::decode(args)?;
            let before = regs.len();
            regs.retain(|r| {
                !(r.prog == m.prog && r.vers == m.vers && (peer.pid.is_none() || r.pid == peer.pid))
            });
            let ok = regs.len() != before;
            Ok(Some((xdr_bool(ok), format!("UNSET {m:?} -> {ok}"))))
        }
        pm::procs::GETPORT => {
            let m = Mapping::decode(args)?;
            let port = lookup(&regs, m.prog, Some(m.vers), netids_for(m.prot), peer.local)
                .and_then(Registration::port)
                .unwrap_or(0);
            let mut out = Vec::new();
            xdr::put_u32(&mut out, u32::from(port));
            Ok(Some((out, format!("GETPORT {m:?} -> {port}"))))
        }
        pm::procs::DUMP => {
            let mappings: Vec<Mapping> = regs
                .iter()
                .filter_map(|r| {
                    Some(Mapping {
                        prog: r.prog,
                        vers: r.vers,
                        prot: prot_of(&r.netid)?,
                        port: u32::from(r.port()?),
                    })
                })
                .collect();
            let mut out = Vec::new();
            pm::encode_dump(&mappings, &mut out);
            Ok(Some((out, format!("DUMP -> {} mappings", mappings.len()))))
        }
        _ => Ok(None),
    }
}

/// The `rpcb` argument of rpcbind v3/v4 (RFC 1833 section 2.1).
#[derive(Debug)]
pub(super) struct Rpcb {
    prog: u32,
    vers: u32,
    netid: String,
    addr: String,
    owner: String,
}

pub(super) fn decode_rpcb(args: &[u8]) -> Result<Rpcb, XdrError> {
    let mut r = XdrReader::new(args);
    let prog = r.u32()?;
    let vers = r.u32()?;
    let mut string = || -> Result<String, XdrError> {
        let bytes = r.opaque(MAX_STRING)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    };
    let netid = string()?;
    let addr = string()?;
    let owner = string()?;
    if !r.rest().is_empty() {
        return Err(XdrError::Trailing(r.rest().len()));
    }
    Ok(Rpcb {
        prog,
        vers,
        netid,
        addr,
        owner,
    })
}

pub(super) fn encode_rpcb(r: &Registration, out: &mut Vec<u8>) {
    xdr::put_u32(out, r.prog);
    xdr::put_u32(out, r.vers);
    xdr::put_opaque(out, r.netid.as_bytes());
    xdr::put_opaque(out, r.uaddr.as_bytes());
    xdr::put_opaque(out, r.owner.as_bytes());
}

/// rpcbind v3 and v4 (RFC 1833 section 2.2).
pub(super) fn rpcbind(shared: &Shared, vers: u32, proc_: u32, args: &[u8], peer: &Peer) -> Outcome {
    use rpcb_procs::*;
    let mut regs = lock(&shared.regs);
    prune_dead(&mut regs);
    match proc_ {
        NULL => Ok(Some((Vec::new(), "NULL".to_owned()))),
        SET => {
            let b = decode_rpcb(args)?;
            let ok = !b.netid.is_empty()
                && parse_uaddr(&b.addr).is_some()
                && regs.len() < MAX_REGISTRATIONS;
            if ok {
                // Last writer wins, so several ganesha instances can register
                // the same program; each keeps its own entry when the pid is
                // known, so one instance's exit does not unmap the others.
                regs.retain(|r| {
                    !(r.prog == b.prog
                        && r.vers == b.vers
                        && r.netid == b.netid
                        && r.pid == peer.pid)
                });
                regs.push(Registration {
                    prog: b.prog,
                    vers: b.vers,
                    netid: b.netid.clone(),
                    uaddr: b.addr.clone(),
                    owner: b.owner.clone(),
                    pid: peer.pid,
                });
            }
            Ok(Some((xdr_bool(ok), format!("SET {b:?} -> {ok}"))))
        }
        UNSET => {
            let b = decode_rpcb(args)?;
            let before = regs.len();
            regs.retain(|r| {
                !(r.prog == b.prog
                    && r.vers == b.vers
                    && (b.netid.is_empty() || r.netid == b.netid)
                    && (peer.pid.is_none() || r.pid == peer.pid))
            });
            let ok = regs.len() != before;
            Ok(Some((xdr_bool(ok), format!("UNSET {b:?} -> {ok}"))))
        }
        GETADDR | GETVERSADDR if proc_ == GETADDR || vers == RPCBVERS4 => {
            let b = decode_rpcb(args)?;
            // GETADDR may answer any version of the program (RFC 1833
            // section 2.2.1 leaves it to the server); GETVERSADDR may not.
            let exact = lookup(&regs, b.prog, Some(b.vers), &[b.netid.as_str()], peer.local);
            let found = if proc_ == GETADDR {
                exact.or_else(|| lookup(&regs, b.prog, None, &[b.netid.as_str()], peer.local))
            } else {
                exact
            };
            let uaddr = found.map(|r| r.uaddr.clone()).unwrap_or_default();
            let mut out = Vec::new();
            xdr::put_opaque(&mut out, uaddr.as_bytes());
            Ok(Some((out, format!("GETADDR {b:?} -> {uaddr:?}"))))
        }
        DUMP => {
            let mut out = Vec::new();
            for r in regs.iter() {
                xdr::put_u32(&mut out, 1);
                encode_rpcb(r, &mut out);
            }
            xdr::put_u32(&mut out, 0);
            Ok(Some((out, format!("DUMP -> {} entries", regs.len()))))
        }
        GETTIME => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let mut out = Vec::new();
            xdr::put_u32(&mut out, u32::try_from(now).unwrap_or(u32::MAX));
            Ok(Some((out, "GETTIME".to_owned())))
        }
        _ => Ok(None),
    }
}

/// The most recent live registration of `prog` (and `vers` when given) on
/// one of `netids`, preferring one whose address is `local`.
pub(super) fn lookup<'a>(
    regs: &'a [Registration],
    prog: u32,
    vers: Option<u32>,
    netids: &[&str],
    local: Option<IpAddr>,
) -> Option<&'a Registration> {
    let all: Vec<&Registration> = regs
        .iter()
        .rev()
        .filter(|r| {
            r.prog == prog
                && vers.is_none_or(|v| r.vers == v)
                && netids.contains(&r.netid.as_str())
                && r.port().is_some()
        })
        .collect();
    let on_local = local.and_then(|local| {
        all.iter()
            .find(|r| parse_uaddr(&r.uaddr).is_some_and(|(host, _)| same_host(&host, local)))
    });
    on_local.copied().or_else(|| all.first().copied())
}

pub(super) fn same_host(host: &str, ip: IpAddr) -> bool {
    let host = host.strip_prefix("::ffff:").unwrap_or(host);
    host.parse::<IpAddr>().is_ok_and(|h| h == ip)
}
