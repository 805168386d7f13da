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

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use gvfs_nfs::portmap::{self as pm, Mapping};
use gvfs_nfs::record::{RecordLimits, RecordReader};
use gvfs_nfs::rpc::Credentials;

use crate::rpc_client;

mod protocol;
mod state;

use protocol::handle;
pub use protocol::{RPCBVERS3, RPCBVERS4, rpcb_procs};
pub use state::{LoggedCall, Registration, format_uaddr, parse_uaddr};
use state::{Peer, Shared, lock, prune_dead};

/// The unix socket libtirpc/libntirpc try first to reach the local rpcbind.
///
/// It is a file: a process that exits leaves it behind, and the next
/// [`Portmapper::ensure`] that finds nobody answering there replaces it.
pub const UNIX_SOCKET: &str = "/var/run/rpcbind.sock";
/// The well-known portmapper port.
pub const PORT: u16 = 111;

/// Largest record or datagram accepted.
const MAX_RECORD: u32 = 64 * 1024;
/// Most stream connections served at once.
const MAX_CONNECTIONS: usize = 64;
/// Pause after a failed accept or receive.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// An idle stream connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

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
mod tests;
