//! What the portmapper holds: its registrations and its call log, shared by
//! the serving threads (`portmap.rs`) and the answers (`protocol.rs`).

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Mutex, MutexGuard};

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

#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) regs: Mutex<Vec<Registration>>,
    pub(super) log: Mutex<VecDeque<LoggedCall>>,
    pub(super) calls: AtomicU64,
    pub(super) connections: AtomicUsize,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub(super) fn prune_dead(regs: &mut Vec<Registration>) {
    regs.retain(|r| r.pid.is_none_or(pid_alive));
}

pub(super) struct Peer {
    pub(super) transport: &'static str,
    pub(super) pid: Option<u32>,
    /// The local address a TCP/UDP query arrived on.
    pub(super) local: Option<IpAddr>,
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
