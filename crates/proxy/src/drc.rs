//! The duplicate-request cache: a retransmitted non-idempotent call (CREATE,
//! REMOVE, RENAME, ...) is answered from memory instead of being run twice.
//!
//! Clients resend a call with the same xid when a reply is slow or the
//! connection drops; running a REMOVE twice would turn success into
//! NFS3ERR_NOENT. Entries are keyed by the caller's identity (the name in
//! its TLS certificate, else its address without the port, which changes on
//! reconnect), xid, procedure, its credentials and a checksum of the
//! arguments, and the cache never holds more than its capacity.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gvfs_nfs::rpc::Credentials;

/// Who sent a call, as far as retransmission matching cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerId {
    /// Not over a socket (tests, internal calls).
    Unknown,
    /// A plain connection: the caller's IP address.
    Addr(IpAddr),
    /// A TLS peer with a verified certificate: a hash of its name, so a
    /// tunnel that reconnects from another address still matches.
    Cert(u64),
}

impl PeerId {
    /// The identity of a certificate name.
    pub fn cert(name: &str) -> PeerId {
        PeerId::Cert(checksum(name.as_bytes()))
    }
}

/// Identifies one call for retransmission matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrcKey {
    /// The caller.
    pub peer: PeerId,
    /// The call's xid.
    pub xid: u32,
    /// Program and procedure.
    pub prog_proc: (u32, u32),
    /// Checksum of the argument bytes, so a reused xid with other
    /// arguments is not mistaken for a retransmission.
    pub args_sum: u64,
    /// Checksum of the credentials: a retransmission carries the same
    /// ones, so two clients on one address (every local process is
    /// 127.0.0.1) whose xids collide are told apart unless they are the
    /// same user with the same stamp.
    pub cred_sum: u64,
}

impl DrcKey {
    /// Builds a key, checksumming `args` and `cred`.
    pub fn new(
        peer: PeerId,
        xid: u32,
        prog: u32,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Self {
        let cred_sum = match cred {
            Credentials::None => 0,
            Credentials::Unix(u) => {
                let mut b = Vec::with_capacity(16 + u.machine.len() + 4 * u.gids.len());
                for v in [u.stamp, u.uid, u.gid] {
                    b.extend_from_slice(&v.to_be_bytes());
                }
                b.extend_from_slice(&u.machine);
                for g in &u.gids {
                    b.extend_from_slice(&g.to_be_bytes());
                }
                checksum(&b)
            }
        };
        Self {
            peer,
            xid,
            prog_proc: (prog, proc_),
            args_sum: checksum(args),
            cred_sum,
        }
    }
}

/// How many leading argument bytes the checksum covers: enough for the
/// handles and names that tell calls apart, without hashing a 1 MiB WRITE
/// payload on every call.
const CHECKSUM_PREFIX: usize = 512;

/// FNV-1a over the first [`CHECKSUM_PREFIX`] bytes, with the length mixed in.
fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    for b in &bytes[..bytes.len().min(CHECKSUM_PREFIX)] {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug)]
enum Entry {
    InProgress,
    Done(std::sync::Arc<Vec<u8>>),
}

/// What the cache says about an incoming call.
#[derive(Debug)]
pub enum Lookup {
    /// First time seen: run it, then [`Drc::finish`].
    New,
    /// The same call is still running: drop this copy, the reply is coming.
    InProgress,
    /// Already answered: send this reply record again.
    Replay(std::sync::Arc<Vec<u8>>),
}

/// A bounded cache of recent non-idempotent calls and their replies.
#[derive(Debug)]
pub struct Drc {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<DrcKey, (Entry, Instant)>,
    order: VecDeque<(DrcKey, Instant)>,
    hits: u64,
}

impl Drc {
    /// A cache of at most `capacity` calls, each kept for at most `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            inner: Mutex::default(),
            capacity: capacity.max(1),
            ttl,
        }
    }

    /// Looks `key` up, and marks it in progress when it is new.
    pub fn begin(&self, key: DrcKey) -> Lookup {
        let mut g = self.lock();
        let now = Instant::now();
        g.expire(now, self.ttl);
        match g.map.get(&key) {
            Some((Entry::InProgress, _)) => {
                g.hits += 1;
                Lookup::InProgress
            }
            Some((Entry::Done(reply), _)) => {
                let reply = reply.clone();
                g.hits += 1;
                Lookup::Replay(reply)
            }
            None => {
                while g.map.len() >= self.capacity {
                    if !g.evict_oldest() {
                        break;
                    }
                }
                g.map.insert(key, (Entry::InProgress, now));
                g.order.push_back((key, now));
                Lookup::New
            }
        }
    }

    /// Stores the reply of a call begun with [`begin`](Self::begin); `None`
    /// forgets the call (it produced no reply, so a retransmission must run).
    pub fn finish(&self, key: DrcKey, reply: Option<std::sync::Arc<Vec<u8>>>) {
        let mut g = self.lock();
        match reply {
            Some(r) => {
                if let Some(e) = g.map.get_mut(&key) {
                    e.0 = Entry::Done(r);
                }
            }
            None => {
                g.map.remove(&key);
            }
        }
    }

    /// Retransmissions answered or dropped so far.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }

    /// Calls currently remembered.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Inner {
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((_, t)) = self.order.front() {
            if now.duration_since(*t) < ttl {
                break;
            }
            self.evict_oldest();
        }
    }

    /// Drops the oldest entry; false when there is none. An entry whose
    /// call is still running is dropped too: the cache stays bounded, and the
    /// worst case is a retransmission run twice, as with no cache.
    fn evict_oldest(&mut self) -> bool {
        let Some((key, t)) = self.order.pop_front() else {
            return false;
        };
        if self.map.get(&key).is_some_and(|(_, at)| *at == t) {
            self.map.remove(&key);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(xid: u32, args: &[u8]) -> DrcKey {
        DrcKey::new(
            PeerId::Addr([127, 0, 0, 1].into()),
            xid,
            100_003,
            12,
            &Credentials::unix(1, 1),
            args,
        )
    }

    #[test]
    fn retransmission_is_replayed_not_rerun() {
        let drc = Drc::new(16, Duration::from_secs(60));
        assert!(matches!(drc.begin(key(1, b"a")), Lookup::New));
        assert!(matches!(drc.begin(key(1, b"a")), Lookup::InProgress));
        drc.finish(key(1, b"a"), Some(Arc::new(vec![9])));
        match drc.begin(key(1, b"a")) {
            Lookup::Replay(r) => assert_eq!(*r, vec![9]),
            other => panic!("{other:?}"),
        }
        // Same xid, other arguments: a new call.
        assert!(matches!(drc.begin(key(1, b"b")), Lookup::New));
        assert_eq!(drc.hits(), 2);
    }

    #[test]
    fn stays_bounded() {
        let drc = Drc::new(8, Duration::from_secs(60));
        for xid in 0..100 {
            let _ = drc.begin(key(xid, b"x"));
            drc.finish(key(xid, b"x"), Some(Arc::new(vec![])));
        }
        assert_eq!(drc.len(), 8);
        assert!(matches!(drc.begin(key(0, b"x")), Lookup::New));
    }

    #[test]
    fn expires() {
        let drc = Drc::new(8, Duration::ZERO);
        let _ = drc.begin(key(1, b"x"));
        drc.finish(key(1, b"x"), Some(Arc::new(vec![])));
        assert!(matches!(drc.begin(key(1, b"x")), Lookup::New));
    }

    #[test]
    fn failed_call_is_forgotten() {
        let drc = Drc::new(8, Duration::from_secs(60));
        let _ = drc.begin(key(1, b"x"));
        drc.finish(key(1, b"x"), None);
        assert!(drc.is_empty());
    }
}
