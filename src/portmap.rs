//! A tiny loopback-only portmapper for tests.
//!
//! nfs-ganesha will not start unless it can register its programs with a
//! portmapper, and Debian's `rpcbind` listens on every address (`rpcbind -h
//! 127.0.0.1` crashes). This one runs in background threads of the test
//! process and answers:
//!
//! - PORTMAP v2 (RFC 1833 section 3): NULL, SET, UNSET, GETPORT, DUMP;
//! - rpcbind v3 and v4 (RFC 1833 section 2, same program number 100000):
//!   NULL, SET, UNSET, GETADDR, DUMP, GETTIME and v4 GETVERSADDR; every other
//!   procedure gets PROC_UNAVAIL.
//!
//! It listens on TCP and UDP `127.0.0.1:111` and on the unix socket
//! [`UNIX_SOCKET`] (`/var/run/rpcbind.sock`).
//!
//! # What the peers do (logged on this machine)
//!
//! nfs-ganesha (5.9 here, through libntirpc) registers with **rpcbind v3
//! over the unix socket** `/var/run/rpcbind.sock` (owner string `"0"`). Only
//! when that socket is missing does it fall back to TCP on `[::1]:111` (IPv6
//! loopback, not 127.0.0.1), which this portmapper does not serve (it stays
//! on 127.0.0.0/8): the unix socket is what lets ganesha start. At start it
//! first UNSETs every (program, version) it may serve, once per netid `udp`,
//! `tcp`, `udp6`, `tcp6`, then SETs NFS v3 and MOUNT v1 and v3 with netid
//! `tcp` and uaddr `0.0.0.0.P1.P2` (the wildcard, despite `Bind_addr`) and
//! netid `tcp6` with uaddr `::ffff:127.0.0.1.P1.P2`; on SIGTERM it UNSETs
//! them again the same way. Neither UDP nor PORTMAP v2 is used.
//!
//! Clients that are given no ports (QEMU's `nfs://` driver, libnfs without
//! `nfsport`/`mountport`) connect over TCP to HOST:111 and send PORTMAP v2
//! NULL then GETPORT (prot TCP), once for MOUNT v3 and once for NFS v3.

//! Set `GVFS_PORTMAP_LOG=1` to have every call printed on stderr;
//! [`Portmapper::calls`] keeps the last 512 either way.
//!
//! # Several servers at once
//!
//! Registrations arriving on the unix socket are tagged with the caller's pid
//! (`SO_PEERCRED`): an UNSET only removes that process's entries, and entries
//! of processes that no longer exist are dropped, so after one of several
//! ganesha instances stops the mappings of the others are still answered. A
//! lookup answers with the most recent live registration whose address is
//! the one the query arrived on, else the most recent live one.
//!
//! # Several test processes at once
//!
//! [`Portmapper::ensure`] starts the portmapper once per process. When
//! `127.0.0.1:111` is already bound (another test process runs one, or a real
//! rpcbind does) it answers a NULL call there and is then used as is; a later
//! `ensure` takes over if that one has gone away in the meantime.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use gvfs_nfs::portmap::{self as pm, Mapping};
use gvfs_nfs::record::{RecordLimits, RecordReader};
use gvfs_nfs::rpc::{self, CallError, Credentials, ReplyStatus};
use gvfs_nfs::xdr::{self, XdrError, XdrReader};

use crate::rpc_client;

/// The unix socket libtirpc/libntirpc try first to reach the local rpcbind.
///
/// It is a file: a process that exits leaves it behind, and the next
/// [`Portmapper::ensure`] that finds nobody answering there replaces it.
pub const UNIX_SOCKET: &str = "/var/run/rpcbind.sock";
/// The well-known portmapper port.
pub const PORT: u16 = 111;
/// rpcbind protocol version 3 (RFC 1833 section 2.2).
pub const RPCBVERS3: u32 = 3;
/// rpcbind protocol version 4 (RFC 1833 section 2.2).
pub const RPCBVERS4: u32 = 4;

/// Largest record or datagram accepted.
const MAX_RECORD: u32 = 64 * 1024;
/// Largest netid, universal address or owner string accepted.
const MAX_STRING: usize = 255;
/// Most registrations kept; SETs beyond this are refused.
const MAX_REGISTRATIONS: usize = 1024;
/// Most calls kept in the call log.
const MAX_LOGGED_CALLS: usize = 512;
/// Most stream connections served at once.
const MAX_CONNECTIONS: usize = 64;
/// Pause after a failed accept or receive.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// An idle stream connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// One registration as the portmapper keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Transport: `tcp`, `udp`, `tcp6`, `udp6`, ...
    pub netid: String,
    /// Universal address, e.g. `127.0.0.1.8.1` for port 2049.
    pub uaddr: String,
    /// Owner string sent by the registrant (v2 SETs record `"portmap-v2"`).
    pub owner: String,
    /// Pid of the registrant when it called over the unix socket.
    pub pid: Option<u32>,
}

impl Registration {
    /// The port in [`uaddr`](Self::uaddr), if it parses.
    pub fn port(&self) -> Option<u16> {
        parse_uaddr(&self.uaddr).map(|(_, port)| port)
    }
}

/// A call the portmapper answered, kept for diagnostics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedCall {
    /// Position in the sequence of all calls answered (from 1).
    pub seq: u64,
    /// `tcp`, `udp` or `unix`.
    pub transport: &'static str,
    /// Program version called (2, 3 or 4).
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// Pid of the caller (unix socket only).
    pub pid: Option<u32>,
    /// A short rendering of the arguments and the answer.
    pub summary: String,
}

/// Handle to the process's portmapper (owned or borrowed).
#[derive(Debug)]
pub struct Portmapper {
    /// The state when this process serves it; `None` when another process
    /// (or a real rpcbind) does.
    shared: Option<Arc<Shared>>,
}

/// The portmapper this process serves, once started.
static OWNED: OnceLock<Portmapper> = OnceLock::new();
/// The handle for a portmapper served by another process.
static FOREIGN: Portmapper = Portmapper { shared: None };
/// Serialises [`Portmapper::ensure`].
static ENSURE: Mutex<()> = Mutex::new(());

impl Portmapper {
    /// Starts the portmapper once per process, or finds the one another
    /// process runs on `127.0.0.1:111` (checked with a NULL call each time,
    /// and taken over when it has gone away).
    pub fn ensure() -> Result<&'static Portmapper> {
        let _serial = lock(&ENSURE);
        if let Some(pm) = OWNED.get() {
            return Ok(pm);
        }
        match Self::start()? {
            None => Ok(&FOREIGN),
            Some(pm) => Ok(OWNED.get_or_init(|| pm)),
        }
    }

    /// Binds and serves, or returns `None` when another process serves
    /// `127.0.0.1:111` and answers there.
    fn start() -> Result<Option<Self>> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
        let tcp = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                null_call(addr).with_context(|| {
                    format!("{addr} is bound by another process but does not answer PORTMAP NULL")
                })?;
                return Ok(None);
            }
            Err(e) => return Err(e).with_context(|| format!("binding portmapper on tcp {addr}")),
        };
        let udp =
            UdpSocket::bind(addr).with_context(|| format!("binding portmapper on udp {addr}"))?;
        let unix = bind_unix(Path::new(UNIX_SOCKET))?;
        let shared = Arc::new(Shared::default());
        spawn_thread("portmap-tcp", {
            let shared = Arc::clone(&shared);
            move || serve_tcp(tcp, shared)
        })?;
        spawn_thread("portmap-udp", {
            let shared = Arc::clone(&shared);
            move || serve_udp(udp, shared)
        })?;
        if let Some(unix) = unix {
            spawn_thread("portmap-unix", {
                let shared = Arc::clone(&shared);
                move || serve_unix(unix, shared)
            })?;
        }
        Ok(Some(Self {
            shared: Some(shared),
        }))
    }

    /// True when this process serves the portmapper.
    pub fn is_owned(&self) -> bool {
        self.shared.is_some()
    }

    /// Where it listens for TCP and UDP: `127.0.0.1:111`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, PORT))
    }

    /// The live registrations, oldest first (`None` when another process
    /// serves the portmapper).
    pub fn registrations(&self) -> Option<Vec<Registration>> {
        let shared = self.shared.as_ref()?;
        let mut regs = lock(&shared.regs);
        prune_dead(&mut regs);
        Some(regs.clone())
    }

    /// The most recent calls answered, oldest first (`None` when another
    /// process serves the portmapper).
    pub fn calls(&self) -> Option<Vec<LoggedCall>> {
        let shared = self.shared.as_ref()?;
        Some(lock(&shared.log).iter().cloned().collect())
    }

    /// Asks this portmapper (PORTMAP v2 GETPORT over TCP) for the port of
    /// `(prog, vers)` over TCP, as QEMU and libnfs do; 0 when unregistered.
    pub fn tcp_port_of(&self, prog: u32, vers: u32) -> Result<u16> {
        getport(self.addr(), prog, vers, pm::IPPROTO_TCP)
    }
}

#[derive(Debug, Default)]
struct Shared {
    regs: Mutex<Vec<Registration>>,
    log: Mutex<VecDeque<LoggedCall>>,
    calls: AtomicU64,
    connections: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .with_context(|| format!("spawning thread {name}"))?;
    Ok(())
}

/// Binds the unix socket, replacing a stale one. Returns `None` when a live
/// server already answers there (left alone: it is not ours to replace).
fn bind_unix(path: &Path) -> Result<Option<UnixListener>> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Ok(None);
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    Ok(Some(listener))
}

fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            thread::sleep(ERROR_BACKOFF); // e.g. out of fds: do not spin
            continue;
        };
        let local = stream.local_addr().map(|a| a.ip()).ok();
        let Some(guard) = ConnectionSlot::take(&shared) else {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        };
        let shared = Arc::clone(&shared);
        let _ = spawn_thread("portmap-tcp-conn", move || {
            let _guard = guard;
            serve_stream(stream, &shared, "tcp", None, local);
        });
    }
}

fn serve_unix(listener: UnixListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            thread::sleep(ERROR_BACKOFF); // e.g. out of fds: do not spin
            continue;
        };
        let pid = peer_pid(&stream);
        let Some(guard) = ConnectionSlot::take(&shared) else {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        };
        let shared = Arc::clone(&shared);
        let _ = spawn_thread("portmap-unix-conn", move || {
            let _guard = guard;
            serve_stream(stream, &shared, "unix", pid, None);
        });
    }
}

fn serve_udp(socket: UdpSocket, shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_RECORD as usize];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            thread::sleep(ERROR_BACKOFF);
            continue;
        };
        let local = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let peer = Peer {
            transport: "udp",
            pid: None,
            local,
        };
        if let Some(record) = handle(&shared, &buf[..n], &peer) {
            // Datagrams carry no record-marking header.
            let _ = socket.send_to(&record[4..], from);
        }
    }
}

/// Counts a stream connection against [`MAX_CONNECTIONS`] until dropped.
struct ConnectionSlot(Arc<Shared>);

impl ConnectionSlot {
    fn take(shared: &Arc<Shared>) -> Option<Self> {
        let prev = shared.connections.fetch_add(1, Ordering::SeqCst);
        let slot = Self(Arc::clone(shared));
        (prev < MAX_CONNECTIONS).then_some(slot)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

trait Stream: Read + Write {
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
}

impl Stream for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Stream for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

fn serve_stream(
    mut stream: impl Stream,
    shared: &Shared,
    transport: &'static str,
    pid: Option<u32>,
    local: Option<IpAddr>,
) {
    if stream.set_timeouts(IDLE_TIMEOUT).is_err() {
        return;
    }
    let peer = Peer {
        transport,
        pid,
        local,
    };
    let mut reader = RecordReader::new(RecordLimits {
        max_fragment: MAX_RECORD,
        max_record: MAX_RECORD,
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let Ok(used) = reader.feed(input) else {
                return; // oversized record: drop the connection
            };
            input = &input[used..];
            if let Some(msg) = reader.take_record()
                && let Some(reply) = handle(shared, &msg, &peer)
                && stream.write_all(&reply).is_err()
            {
                return;
            }
        }
    }
}

/// The pid of the process at the other end of a unix socket.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and
    // the fd is open for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn prune_dead(regs: &mut Vec<Registration>) {
    regs.retain(|r| r.pid.is_none_or(pid_alive));
}

struct Peer {
    transport: &'static str,
    pid: Option<u32>,
    /// The local address a TCP/UDP query arrived on.
    local: Option<IpAddr>,
}

/// Answers one call; `None` when the message deserves no answer.
fn handle(shared: &Shared, msg: &[u8], peer: &Peer) -> Option<Vec<u8>> {
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

type Outcome = Result<Option<(Vec<u8>, String)>, XdrError>;

fn log_call(shared: &Shared, peer: &Peer, vers: u32, proc_: u32, summary: String) {
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

fn xdr_bool(v: bool) -> Vec<u8> {
    let mut out = Vec::new();
    xdr::put_u32(&mut out, u32::from(v));
    out
}

fn netids_for(prot: u32) -> &'static [&'static str] {
    match prot {
        pm::IPPROTO_TCP => &["tcp", "tcp6"],
        pm::IPPROTO_UDP => &["udp", "udp6"],
        _ => &[],
    }
}

fn prot_of(netid: &str) -> Option<u32> {
    match netid {
        "tcp" | "tcp6" => Some(pm::IPPROTO_TCP),
        "udp" | "udp6" => Some(pm::IPPROTO_UDP),
        _ => None,
    }
}

/// PORTMAP v2 (RFC 1833 section 3.2).
fn portmap_v2(shared: &Shared, proc_: u32, args: &[u8], peer: &Peer) -> Outcome {
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
struct Rpcb {
    prog: u32,
    vers: u32,
    netid: String,
    addr: String,
    owner: String,
}

fn decode_rpcb(args: &[u8]) -> Result<Rpcb, XdrError> {
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

fn encode_rpcb(r: &Registration, out: &mut Vec<u8>) {
    xdr::put_u32(out, r.prog);
    xdr::put_u32(out, r.vers);
    xdr::put_opaque(out, r.netid.as_bytes());
    xdr::put_opaque(out, r.uaddr.as_bytes());
    xdr::put_opaque(out, r.owner.as_bytes());
}

/// rpcbind v3 and v4 (RFC 1833 section 2.2).
fn rpcbind(shared: &Shared, vers: u32, proc_: u32, args: &[u8], peer: &Peer) -> Outcome {
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
fn lookup<'a>(
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

fn same_host(host: &str, ip: IpAddr) -> bool {
    let host = host.strip_prefix("::ffff:").unwrap_or(host);
    host.parse::<IpAddr>().is_ok_and(|h| h == ip)
}

/// Splits a universal address (`h1.h2.h3.h4.p1.p2`, or an IPv6 host
/// followed by `.p1.p2`) into its host part and port.
pub fn parse_uaddr(uaddr: &str) -> Option<(String, u16)> {
    let (rest, lo) = uaddr.rsplit_once('.')?;
    let (host, hi) = rest.rsplit_once('.')?;
    let hi: u8 = hi.parse().ok()?;
    let lo: u8 = lo.parse().ok()?;
    Some((host.to_owned(), u16::from(hi) << 8 | u16::from(lo)))
}

/// The universal address of `ip:port`.
pub fn format_uaddr(ip: IpAddr, port: u16) -> String {
    format!("{ip}.{}.{}", port >> 8, port & 0xff)
}

/// Makes one PORTMAP v2 call over TCP and returns the results.
fn call_v2(addr: SocketAddr, proc_: u32, args: &[u8]) -> Result<Vec<u8>> {
    rpc_client::call(
        addr,
        pm::PROGRAM,
        pm::VERSION,
        proc_,
        &Credentials::None,
        args,
    )
}

/// Pings the portmapper at `addr` with PORTMAP v2 NULL over TCP.
pub fn null_call(addr: SocketAddr) -> Result<()> {
    call_v2(addr, pm::procs::NULL, &[]).map(|_| ())
}

/// Asks the portmapper at `addr` (PORTMAP v2 GETPORT over TCP) for the port
/// of `(prog, vers)` on protocol `prot`; 0 when it is not registered.
pub fn getport(addr: SocketAddr, prog: u32, vers: u32, prot: u32) -> Result<u16> {
    let mut args = Vec::new();
    Mapping {
        prog,
        vers,
        prot,
        port: 0,
    }
    .encode(&mut args);
    let results = call_v2(addr, pm::procs::GETPORT, &args)?;
    let port = pm::decode_port(&results).map_err(|e| anyhow!("GETPORT reply: {e}"))?;
    u16::try_from(port).map_err(|_| anyhow!("GETPORT answered port {port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uaddr_round_trip() {
        let ip: IpAddr = "127.0.0.1"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(format_uaddr(ip, 2049), "127.0.0.1.8.1");
        assert_eq!(
            parse_uaddr("127.0.0.1.8.1"),
            Some(("127.0.0.1".to_owned(), 2049))
        );
        assert_eq!(
            parse_uaddr("::ffff:127.0.0.1.80.10"),
            Some(("::ffff:127.0.0.1".to_owned(), 20490))
        );
        assert_eq!(parse_uaddr("::.0.111"), Some(("::".to_owned(), 111)));
        assert_eq!(parse_uaddr("1.2.3.4.256.1"), None);
        assert_eq!(parse_uaddr("nonsense"), None);
    }

    fn reg(netid: &str, uaddr: &str) -> Registration {
        Registration {
            prog: 100_003,
            vers: 3,
            netid: netid.to_owned(),
            uaddr: uaddr.to_owned(),
            owner: String::new(),
            pid: None,
        }
    }

    #[test]
    fn lookup_prefers_the_local_address_then_the_latest() {
        let regs = vec![
            reg("tcp", "127.0.0.2.0.2"),
            reg("tcp", "127.0.0.1.0.1"),
            reg("tcp6", "::ffff:127.0.0.3.0.3"),
            reg("udp", "127.0.0.1.0.4"),
        ];
        let tcp = ["tcp", "tcp6"];
        let at = |ip: &str| ip.parse::<IpAddr>().ok();
        assert_eq!(
            lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.2")).and_then(Registration::port),
            Some(2)
        );
        assert_eq!(
            lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.3")).and_then(Registration::port),
            Some(3)
        );
        assert_eq!(
            lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.9")).and_then(Registration::port),
            Some(3)
        );
        assert_eq!(
            lookup(&regs, 100_003, Some(3), &["udp"], None).and_then(Registration::port),
            Some(4)
        );
        assert!(lookup(&regs, 100_005, Some(3), &tcp, None).is_none());
    }

    fn call(shared: &Shared, vers: u32, proc_: u32, args: &[u8], pid: Option<u32>) -> Vec<u8> {
        let mut rec = rpc::call_record(1, pm::PROGRAM, vers, proc_, &Credentials::unix(0, 0));
        rec.extend_from_slice(args);
        let rec = rpc::seal(rec);
        let peer = Peer {
            transport: "unix",
            pid,
            local: None,
        };
        let reply = handle(shared, &rec[4..], &peer).unwrap_or_default();
        rpc::parse_reply(&reply[4..])
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn rpcb_args(netid: &str, addr: &str) -> Vec<u8> {
        let mut out = Vec::new();
        encode_rpcb(&reg(netid, addr), &mut out);
        out
    }

    #[test]
    fn set_getport_unset_per_pid() {
        let shared = Shared::default();
        let me = std::process::id();
        // Two registrants (this process, and one without a pid).
        assert_eq!(
            call(
                &shared,
                3,
                rpcb_procs::SET,
                &rpcb_args("tcp", "127.0.0.1.0.7"),
                None
            ),
            xdr_bool(true)
        );
        assert_eq!(
            call(
                &shared,
                3,
                rpcb_procs::SET,
                &rpcb_args("tcp", "127.0.0.1.0.9"),
                Some(me)
            ),
            xdr_bool(true)
        );
        let mut q = Vec::new();
        Mapping {
            prog: 100_003,
            vers: 3,
            prot: pm::IPPROTO_TCP,
            port: 0,
        }
        .encode(&mut q);
        assert_eq!(
            call(&shared, 2, pm::procs::GETPORT, &q, None),
            9u32.to_be_bytes()
        );
        let mut addr = Vec::new();
        xdr::put_opaque(&mut addr, b"127.0.0.1.0.9");
        assert_eq!(
            call(&shared, 4, rpcb_procs::GETADDR, &rpcb_args("tcp", ""), None),
            addr
        );
        // UNSET with an empty netid from `me` removes only `me`'s entry.
        assert_eq!(
            call(&shared, 3, rpcb_procs::UNSET, &rpcb_args("", ""), Some(me)),
            xdr_bool(true)
        );
        assert_eq!(
            call(&shared, 2, pm::procs::GETPORT, &q, None),
            7u32.to_be_bytes()
        );
        // Unknown procedures are PROC_UNAVAIL; a bad rpcb is GARBAGE_ARGS.
        let mut rec = rpc::call_record(5, pm::PROGRAM, 3, 8, &Credentials::None);
        rec = rpc::seal(rec);
        let peer = Peer {
            transport: "tcp",
            pid: None,
            local: None,
        };
        let reply = handle(&shared, &rec[4..], &peer).unwrap_or_default();
        assert!(matches!(
            rpc::parse_reply(&reply[4..]),
            Err(rpc::ReplyError::Accepted(ReplyStatus::ProcUnavail))
        ));
        let mut rec = rpc::call_record(6, pm::PROGRAM, 3, rpcb_procs::SET, &Credentials::None);
        xdr::put_u32(&mut rec, 1);
        rec = rpc::seal(rec);
        let reply = handle(&shared, &rec[4..], &peer).unwrap_or_default();
        assert!(matches!(
            rpc::parse_reply(&reply[4..]),
            Err(rpc::ReplyError::Accepted(ReplyStatus::GarbageArgs))
        ));
    }
}
