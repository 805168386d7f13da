//! ONC RPC v2 call and reply headers (RFC 5531 sections 8-9) and the
//! AUTH_NONE / AUTH_UNIX credentials they carry (RFC 5531 appendix A).
//!
//! Sans-IO: plain functions over byte slices, shared by the server front end
//! and the client. Outgoing messages are built with room for the
//! record-marking header in front, so they go to the socket without a copy.

use std::borrow::Cow;

use crate::record;
use crate::xdr::{self, XdrError, XdrReader};

/// RPC protocol version implemented.
pub const RPC_VERSION: u32 = 2;
/// Largest credential or verifier body (RFC 5531 section 8.2).
pub const MAX_AUTH_BYTES: usize = 400;
/// Largest AUTH_UNIX machine name.
pub const MAX_MACHINE_NAME: usize = 255;
/// Largest AUTH_UNIX supplementary group list.
pub const MAX_GIDS: usize = 16;

/// Authentication flavors (RFC 5531 section 8.2, RFC 9289 section 4.1).
pub mod flavor {
    /// AUTH_NONE.
    pub const NONE: u32 = 0;
    /// AUTH_SYS / AUTH_UNIX.
    pub const UNIX: u32 = 1;
    /// AUTH_TLS, the RPC-with-TLS probe (RFC 9289).
    pub const TLS: u32 = 7;
}

/// Who is calling, as the call's credential says. Every layer receives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// AUTH_NONE.
    #[default]
    None,
    /// AUTH_UNIX (AUTH_SYS).
    Unix(AuthUnix),
}

/// An AUTH_UNIX credential body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthUnix {
    /// Arbitrary stamp chosen by the caller.
    pub stamp: u32,
    /// The caller's host name (at most 255 bytes).
    pub machine: Vec<u8>,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups (at most 16).
    pub gids: Vec<u32>,
}

impl Credentials {
    /// AUTH_UNIX credentials for `uid`/`gid` with no supplementary groups.
    pub fn unix(uid: u32, gid: u32) -> Self {
        Self::Unix(AuthUnix {
            stamp: 0,
            machine: b"gvfs".to_vec(),
            uid,
            gid,
            gids: Vec::new(),
        })
    }

    /// The caller's uid, or `None` for AUTH_NONE.
    pub fn uid(&self) -> Option<u32> {
        match self {
            Self::None => None,
            Self::Unix(u) => Some(u.uid),
        }
    }

    /// The caller as far as permissions go (uid, gid, groups; AUTH_NONE
    /// as one value no AUTH_SYS caller has), to key what is remembered per
    /// caller.
    pub fn key(&self) -> Vec<u32> {
        match self {
            Self::None => vec![u32::MAX],
            Self::Unix(u) => {
                let mut k = vec![u.uid, u.gid];
                k.extend(&u.gids);
                k
            }
        }
    }

    /// Whether a file's mode lets this caller write it, by the POSIX
    /// classes (owner, group, other), the way a server would decide without
    /// ACLs. Root is let through (whether the server squashes it is the
    /// server's to say), and so is the owner whatever the mode bits (a
    /// server lets the creator of a read-only file write it). A caching
    /// layer that keeps writes asks this first; `false` means "ask the
    /// server" (an ACL may still allow it), not "refused".
    pub fn may_write_by_mode(&self, owner: u32, group: u32, mode: u32) -> bool {
        match self {
            Self::None => mode & 0o002 != 0,
            Self::Unix(u) if u.uid == 0 || u.uid == owner => true,
            Self::Unix(u) if u.gid == group || u.gids.contains(&group) => mode & 0o020 != 0,
            Self::Unix(_) => mode & 0o002 != 0,
        }
    }

    fn decode(flavor: u32, body: &[u8]) -> Result<Self, CredError> {
        match flavor {
            flavor::NONE => Ok(Self::None),
            flavor::UNIX => {
                let mut r = XdrReader::new(body);
                let stamp = r.u32()?;
                let machine = r.opaque(MAX_MACHINE_NAME)?.to_vec();
                let uid = r.u32()?;
                let gid = r.u32()?;
                let n = r.u32()? as usize;
                if n > MAX_GIDS {
                    return Err(CredError::Bad);
                }
                let mut gids = Vec::with_capacity(n);
                for _ in 0..n {
                    gids.push(r.u32()?);
                }
                if !r.rest().is_empty() {
                    return Err(CredError::Bad);
                }
                Ok(Self::Unix(AuthUnix {
                    stamp,
                    machine,
                    uid,
                    gid,
                    gids,
                }))
            }
            other => Err(CredError::Unsupported(other)),
        }
    }

    /// Reads a credential (flavor and body) as [`encode`](Self::encode)
    /// writes it; `None` unless it is one whole, valid credential.
    pub fn decode_xdr(bytes: &[u8]) -> Option<Self> {
        let mut r = XdrReader::new(bytes);
        let flavor = r.u32().ok()?;
        let body = r.opaque(MAX_AUTH_BYTES).ok()?;
        if !r.rest().is_empty() {
            return None;
        }
        Self::decode(flavor, body).ok()
    }

    /// Appends the credential (flavor and body) in XDR.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::None => {
                xdr::put_u32(out, flavor::NONE);
                xdr::put_u32(out, 0);
            }
            Self::Unix(u) => {
                let mut body = Vec::with_capacity(32 + u.machine.len() + 4 * u.gids.len());
                xdr::put_u32(&mut body, u.stamp);
                let machine = &u.machine[..u.machine.len().min(MAX_MACHINE_NAME)];
                xdr::put_opaque(&mut body, machine);
                xdr::put_u32(&mut body, u.uid);
                xdr::put_u32(&mut body, u.gid);
                let gids = &u.gids[..u.gids.len().min(MAX_GIDS)];
                xdr::put_u32(&mut body, gids.len() as u32);
                for g in gids {
                    xdr::put_u32(&mut body, *g);
                }
                xdr::put_u32(out, flavor::UNIX);
                xdr::put_opaque(out, &body);
            }
        }
    }
}

#[derive(Debug)]
enum CredError {
    Bad,
    Unsupported(u32),
}

impl From<XdrError> for CredError {
    fn from(_: XdrError) -> Self {
        Self::Bad
    }
}

/// The header of an RPC call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader {
    /// Transaction id chosen by the caller.
    pub xid: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// The caller's credentials.
    pub cred: Credentials,
    /// The credential flavor as sent (AUTH_TLS probes keep theirs here).
    pub cred_flavor: u32,
}

/// Why an incoming message is not a call we can run, and how to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// Too short to carry even an xid and message type: drop it.
    #[error("message too short for an RPC header")]
    Unreadable,
    /// A REPLY where a CALL was expected: drop it.
    #[error("message {xid:#x} is not a call")]
    NotACall {
        /// Transaction id.
        xid: u32,
    },
    /// RPC version other than 2: answer `MSG_DENIED / RPC_MISMATCH`.
    #[error("call {xid:#x} uses RPC version {vers}")]
    RpcMismatch {
        /// Transaction id.
        xid: u32,
        /// Version sent.
        vers: u32,
    },
    /// Malformed header or credential: answer `AUTH_ERROR / AUTH_BADCRED`.
    #[error("call {xid:#x} has a malformed header or credential")]
    BadCredential {
        /// Transaction id.
        xid: u32,
    },
    /// Flavor we do not accept: answer `AUTH_ERROR / AUTH_TOOWEAK`.
    #[error("call {xid:#x} uses unsupported auth flavor {flavor}")]
    UnsupportedFlavor {
        /// Transaction id.
        xid: u32,
        /// Flavor sent.
        flavor: u32,
        /// The rest of the header, for callers that handle this flavor
        /// themselves (the RFC 9289 AUTH_TLS probe).
        header: Option<(u32, u32, u32)>,
    },
}

/// Parses an RPC call header; returns it and the offset of the arguments.
pub fn parse_call(msg: &[u8]) -> Result<(CallHeader, usize), CallError> {
    let mut r = XdrReader::new(msg);
    let xid = r.u32().map_err(|_| CallError::Unreadable)?;
    let mtype = r.u32().map_err(|_| CallError::Unreadable)?;
    if mtype != 0 {
        return Err(CallError::NotACall { xid });
    }
    let bad = |_| CallError::BadCredential { xid };
    let rpcvers = r.u32().map_err(bad)?;
    if rpcvers != RPC_VERSION {
        return Err(CallError::RpcMismatch { xid, vers: rpcvers });
    }
    let prog = r.u32().map_err(bad)?;
    let vers = r.u32().map_err(bad)?;
    let proc_ = r.u32().map_err(bad)?;
    let cred_flavor = r.u32().map_err(bad)?;
    let cred_body = r.opaque(MAX_AUTH_BYTES).map_err(bad)?;
    let _verf_flavor = r.u32().map_err(bad)?;
    let _verf_body = r.opaque(MAX_AUTH_BYTES).map_err(bad)?;
    let cred = match Credentials::decode(cred_flavor, cred_body) {
        Ok(c) => c,
        Err(CredError::Bad) => return Err(CallError::BadCredential { xid }),
        Err(CredError::Unsupported(flavor)) => {
            return Err(CallError::UnsupportedFlavor {
                xid,
                flavor,
                header: Some((prog, vers, proc_)),
            });
        }
    };
    Ok((
        CallHeader {
            xid,
            prog,
            vers,
            proc_,
            cred,
            cred_flavor,
        },
        r.position(),
    ))
}

/// How a call was answered (RFC 5531 section 9: accept_stat, reject_stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    /// Accepted and executed; results follow.
    Success,
    /// Program not served here.
    ProgUnavail,
    /// Program served, but not this version.
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// Procedure not in the program.
    ProcUnavail,
    /// Arguments could not be decoded.
    GarbageArgs,
    /// Server-side failure (memory, upstream, ...).
    SystemErr,
    /// Denied: RPC version not 2.
    RpcMismatch,
    /// Denied: authentication error with this `auth_stat`.
    AuthError(u32),
}

/// `auth_stat` values (RFC 5531 section 9).
pub mod auth_stat {
    /// Bad credential (seal broken).
    pub const BADCRED: u32 = 1;
    /// Rejected for security reasons.
    pub const TOOWEAK: u32 = 5;
}

/// Builds a complete reply record (record-marking header included) with
/// `results` appended after the header when the status is `Success`.
pub fn reply_record(xid: u32, status: ReplyStatus, results: &[u8]) -> Vec<u8> {
    let mut out = reply_start(xid, status, results.len());
    if status == ReplyStatus::Success {
        out.extend_from_slice(results);
    }
    seal(out)
}

/// Starts a reply record: header space and the reply header for `status`.
/// For `Success`, append the XDR results, then pass it to [`seal`];
/// `capacity` is a hint for the results' size.
pub fn reply_start(xid: u32, status: ReplyStatus, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 24 + capacity);
    out.extend_from_slice(&[0; 4]);
    xdr::put_u32(&mut out, xid);
    xdr::put_u32(&mut out, 1); // REPLY
    match status {
        ReplyStatus::RpcMismatch => {
            xdr::put_u32(&mut out, 1); // MSG_DENIED
            xdr::put_u32(&mut out, 0); // RPC_MISMATCH
            xdr::put_u32(&mut out, RPC_VERSION);
            xdr::put_u32(&mut out, RPC_VERSION);
        }
        ReplyStatus::AuthError(stat) => {
            xdr::put_u32(&mut out, 1); // MSG_DENIED
            xdr::put_u32(&mut out, 1); // AUTH_ERROR
            xdr::put_u32(&mut out, stat);
        }
        accepted => {
            xdr::put_u32(&mut out, 0); // MSG_ACCEPTED
            xdr::put_u32(&mut out, flavor::NONE); // verifier
            xdr::put_u32(&mut out, 0);
            match accepted {
                ReplyStatus::Success => xdr::put_u32(&mut out, 0),
                ReplyStatus::ProgUnavail => xdr::put_u32(&mut out, 1),
                ReplyStatus::ProgMismatch { low, high } => {
                    xdr::put_u32(&mut out, 2);
                    xdr::put_u32(&mut out, low);
                    xdr::put_u32(&mut out, high);
                }
                ReplyStatus::ProcUnavail => xdr::put_u32(&mut out, 3),
                ReplyStatus::GarbageArgs => xdr::put_u32(&mut out, 4),
                _ => xdr::put_u32(&mut out, 5), // SYSTEM_ERR
            }
        }
    }
    out
}

/// The verifier body of the reply to an RFC 9289 AUTH_TLS probe.
pub const STARTTLS: &[u8; 8] = b"STARTTLS";

/// The reply record to an RFC 9289 AUTH_TLS NULL probe (section 4.1): an
/// accepted, successful reply whose AUTH_NONE verifier carries "STARTTLS",
/// telling the client to start a TLS handshake on the same connection.
pub fn starttls_reply(xid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    out.extend_from_slice(&[0; 4]);
    xdr::put_u32(&mut out, xid);
    xdr::put_u32(&mut out, 1); // REPLY
    xdr::put_u32(&mut out, 0); // MSG_ACCEPTED
    xdr::put_u32(&mut out, flavor::NONE);
    xdr::put_opaque(&mut out, STARTTLS);
    xdr::put_u32(&mut out, 0); // SUCCESS
    seal(out)
}

/// Whether `msg` is an RFC 9289 probe: a NULL call with AUTH_TLS.
pub fn is_tls_probe(msg: &[u8]) -> Option<u32> {
    match parse_call(msg) {
        Err(CallError::UnsupportedFlavor {
            xid,
            flavor: flavor::TLS,
            header: Some((_, _, 0)),
        }) => Some(xid),
        _ => None,
    }
}

/// A reply record in two parts, so that a large payload (a READ's data,
/// or results received from an upstream) goes to the socket as it is, with
/// a vectored write, instead of being copied in behind the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyRecord {
    /// Record mark, reply header and the results before the payload.
    head: Vec<u8>,
    /// Holds the payload at `payload_at..` (borrowed when it is static,
    /// such as a run of zeros).
    payload: Cow<'static, [u8]>,
    payload_at: usize,
}

/// XDR padding (RFC 4506 section 4.10).
const PAD: [u8; 3] = [0; 3];

impl ReplyRecord {
    /// Seals a record started by [`reply_start`] (results appended, up to
    /// the payload) that goes on with `payload[payload_at..]`, then zero
    /// padding to a multiple of 4 bytes.
    pub fn new(head: Vec<u8>, payload: impl Into<Cow<'static, [u8]>>, payload_at: usize) -> Self {
        let payload = payload.into();
        let payload_at = payload_at.min(payload.len());
        let mut rec = Self {
            head,
            payload,
            payload_at,
        };
        let len = rec.len().saturating_sub(4);
        if let Some(mark) = rec.head.get_mut(..4) {
            mark.copy_from_slice(&record::frame(len));
        }
        rec
    }

    /// The bytes to send, in order.
    pub fn parts(&self) -> [&[u8]; 3] {
        let payload = &self.payload[self.payload_at..];
        [
            self.head.as_slice(),
            payload,
            &PAD[..(4 - payload.len() % 4) % 4],
        ]
    }

    /// The record's length in bytes, record mark included.
    pub fn len(&self) -> usize {
        self.parts().iter().map(|p| p.len()).sum()
    }

    /// Whether the record is empty (never, once sealed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record in one buffer (a copy when there is a payload).
    pub fn into_vec(self) -> Vec<u8> {
        if self.payload_at == self.payload.len() {
            return self.head;
        }
        self.parts().concat()
    }
}

impl From<Vec<u8>> for ReplyRecord {
    /// A record already sealed whole (by [`seal`] or [`reply_record`]).
    fn from(record: Vec<u8>) -> Self {
        Self {
            head: record,
            payload: Cow::Borrowed(&[]),
            payload_at: 0,
        }
    }
}

/// Starts an outgoing call record: header space, xid and call header with
/// `cred`. Append the XDR arguments, then pass it to [`seal`].
pub fn call_record(xid: u32, prog: u32, vers: u32, proc_: u32, cred: &Credentials) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&[0; 4]);
    for v in [xid, 0, RPC_VERSION, prog, vers, proc_] {
        xdr::put_u32(&mut out, v);
    }
    cred.encode(&mut out);
    xdr::put_u32(&mut out, flavor::NONE);
    xdr::put_u32(&mut out, 0);
    out
}

/// Fills in the record-marking header of a record started by
/// [`call_record`] or [`reply_record`].
pub fn seal(mut record: Vec<u8>) -> Vec<u8> {
    let header = record::frame(record.len() - 4);
    record[..4].copy_from_slice(&header);
    record
}

/// The results of a successful call: the XDR bytes after the reply header,
/// kept inside the received record so they are never copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    record: Vec<u8>,
    results_at: usize,
}

impl Reply {
    /// The results at `results_at..` of the received `record`.
    pub fn new(record: Vec<u8>, results_at: usize) -> Reply {
        Reply { record, results_at }
    }

    /// The record received and where the results start in it, to pass
    /// them on without a copy ([`ReplyRecord::new`](ReplyRecord::new)).
    pub fn into_record(self) -> (Vec<u8>, usize) {
        (self.record, self.results_at)
    }
}

impl std::ops::Deref for Reply {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.record[self.results_at..]
    }
}

/// How a reply said the call went, when it was not a plain success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// The reply could not be parsed.
    #[error("malformed RPC reply: {0}")]
    Malformed(#[from] XdrError),
    /// Accepted, with a non-success `accept_stat`.
    #[error("RPC call not executed: {0:?}")]
    Accepted(ReplyStatus),
    /// Denied: RPC version mismatch or an auth error.
    #[error("RPC call denied: {0:?}")]
    Denied(ReplyStatus),
}

/// The xid of a reply message, if it is one.
pub fn reply_xid(msg: &[u8]) -> Option<u32> {
    let mut r = XdrReader::new(msg);
    let xid = r.u32().ok()?;
    (r.u32().ok()? == 1).then_some(xid)
}

/// Parses a reply and returns its results (the bytes after the header).
pub fn parse_reply(msg: &[u8]) -> Result<&[u8], ReplyError> {
    let mut r = XdrReader::new(msg);
    let _xid = r.u32()?;
    if r.u32()? != 1 {
        return Err(XdrError::InvalidValue(0).into());
    }
    match r.u32()? {
        0 => {
            let _flavor = r.u32()?;
            let _verf = r.opaque(MAX_AUTH_BYTES)?;
            let status = match r.u32()? {
                0 => return Ok(r.rest()),
                1 => ReplyStatus::ProgUnavail,
                2 => ReplyStatus::ProgMismatch {
                    low: r.u32()?,
                    high: r.u32()?,
                },
                3 => ReplyStatus::ProcUnavail,
                4 => ReplyStatus::GarbageArgs,
                5 => ReplyStatus::SystemErr,
                v => return Err(XdrError::InvalidValue(v).into()),
            };
            Err(ReplyError::Accepted(status))
        }
        1 => match r.u32()? {
            0 => Err(ReplyError::Denied(ReplyStatus::RpcMismatch)),
            1 => Err(ReplyError::Denied(ReplyStatus::AuthError(r.u32()?))),
            v => Err(XdrError::InvalidValue(v).into()),
        },
        v => Err(XdrError::InvalidValue(v).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writing_by_mode_follows_the_posix_classes() {
        let (owner, group) = (1000, 100);
        let user = |uid, gid| Credentials::unix(uid, gid);
        // Read-only for everyone: the owner and root still may.
        assert!(user(1000, 1).may_write_by_mode(owner, group, 0o444));
        assert!(user(0, 0).may_write_by_mode(owner, group, 0o444));
        assert!(!user(2000, 100).may_write_by_mode(owner, group, 0o444));
        // Group-writable: members (by gid or a supplementary gid) may.
        assert!(user(2000, 100).may_write_by_mode(owner, group, 0o664));
        let mut member = user(2000, 7);
        if let Credentials::Unix(u) = &mut member {
            u.gids.push(100);
        }
        assert!(member.may_write_by_mode(owner, group, 0o664));
        assert!(!user(2000, 7).may_write_by_mode(owner, group, 0o664));
        // Other: only with the other write bit; AUTH_NONE is other.
        assert!(user(2000, 7).may_write_by_mode(owner, group, 0o666));
        assert!(!Credentials::None.may_write_by_mode(owner, group, 0o664));
    }
    use proptest::prelude::*;

    fn arb_cred() -> impl Strategy<Value = Credentials> {
        prop_oneof![
            Just(Credentials::None),
            (
                any::<u32>(),
                prop::collection::vec(any::<u8>(), 0..=255),
                any::<u32>(),
                any::<u32>(),
                prop::collection::vec(any::<u32>(), 0..=16)
            )
                .prop_map(|(stamp, machine, uid, gid, gids)| Credentials::Unix(
                    AuthUnix {
                        stamp,
                        machine,
                        uid,
                        gid,
                        gids
                    }
                )),
        ]
    }

    proptest! {
        #[test]
        fn call_header_round_trip(xid: u32, prog: u32, vers: u32, p: u32, cred in arb_cred(),
                                  args in prop::collection::vec(any::<u8>(), 0..64)) {
            let mut rec = call_record(xid, prog, vers, p, &cred);
            rec.extend_from_slice(&args);
            let rec = seal(rec);
            let (h, off) = parse_call(&rec[4..]).unwrap();
            prop_assert_eq!(h.xid, xid);
            prop_assert_eq!((h.prog, h.vers, h.proc_), (prog, vers, p));
            prop_assert_eq!(h.cred, cred);
            prop_assert_eq!(&rec[4 + off..], &args[..]);
        }

        #[test]
        fn parse_call_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_call(&bytes);
            let _ = parse_reply(&bytes);
        }

        #[test]
        fn reply_round_trip(xid: u32, results in prop::collection::vec(any::<u8>(), 0..64)) {
            let rec = reply_record(xid, ReplyStatus::Success, &results);
            prop_assert_eq!(reply_xid(&rec[4..]), Some(xid));
            prop_assert_eq!(parse_reply(&rec[4..]).unwrap(), &results[..]);
        }
    }

    #[test]
    fn a_record_in_parts_is_the_record_in_one() {
        for n in [0usize, 1, 3, 4, 5, 1000] {
            let payload: Vec<u8> = (0..n + 7).map(|i| i as u8).collect();
            let mut results = payload[7..].to_vec();
            results.resize(n.next_multiple_of(4), 0);
            let whole = reply_record(9, ReplyStatus::Success, &results);
            let parts = ReplyRecord::new(reply_start(9, ReplyStatus::Success, 0), payload, 7);
            assert_eq!(parts.len(), whole.len());
            assert_eq!(parts.clone().into_vec(), whole);
            assert_eq!(parse_reply(&parts.into_vec()[4..]), Ok(&results[..]));
        }
        // A payload start past the end is an empty payload, not a panic.
        let rec = ReplyRecord::new(reply_start(1, ReplyStatus::Success, 0), vec![1], 5);
        assert_eq!(rec.into_vec(), reply_record(1, ReplyStatus::Success, &[]));
        let whole = reply_record(2, ReplyStatus::ProcUnavail, &[]);
        assert_eq!(ReplyRecord::from(whole.clone()).into_vec(), whole);
    }

    #[test]
    fn error_replies_parse_back() {
        for st in [
            ReplyStatus::ProgUnavail,
            ReplyStatus::ProgMismatch { low: 3, high: 3 },
            ReplyStatus::ProcUnavail,
            ReplyStatus::GarbageArgs,
            ReplyStatus::SystemErr,
        ] {
            let rec = reply_record(7, st, &[]);
            assert_eq!(parse_reply(&rec[4..]), Err(ReplyError::Accepted(st)));
        }
        let rec = reply_record(7, ReplyStatus::RpcMismatch, &[]);
        assert_eq!(
            parse_reply(&rec[4..]),
            Err(ReplyError::Denied(ReplyStatus::RpcMismatch))
        );
        let rec = reply_record(7, ReplyStatus::AuthError(auth_stat::BADCRED), &[]);
        assert_eq!(
            parse_reply(&rec[4..]),
            Err(ReplyError::Denied(ReplyStatus::AuthError(
                auth_stat::BADCRED
            )))
        );
    }

    #[test]
    fn oversized_gid_list_is_a_bad_credential() {
        let mut body = Vec::new();
        for v in [0u32, 0, 0, 0, 17] {
            xdr::put_u32(&mut body, v);
        }
        let mut msg = Vec::new();
        for v in [9u32, 0, 2, 100003, 3, 0, flavor::UNIX] {
            xdr::put_u32(&mut msg, v);
        }
        xdr::put_opaque(&mut msg, &body);
        xdr::put_u32(&mut msg, 0);
        xdr::put_u32(&mut msg, 0);
        assert_eq!(parse_call(&msg), Err(CallError::BadCredential { xid: 9 }));
    }
}
