//! The tokio edge of the front end: accepts connections, reads records,
//! runs calls concurrently and writes replies.
//!
//! Bounded everywhere: one memory budget for the call records and replies
//! held for all connections, with backpressure ([`memory`]); at most
//! `max_connections` served connections and
//! `max_pending` more that have not yet sent a first call or finished a TLS
//! handshake, each pool making room by closing its oldest or idlest member
//! ([`slots`]); at most twice `max_in_flight` calls per connection read
//! and not yet answered (the reader stops reading while that many are),
//! of which at most `max_in_flight` below [`Class::Demand`] run at once,
//! a bounded reply queue, and record caps enforced before allocation.
//! Lower-class calls past the limit wait for a turn without stopping the
//! reader, so a call a reader waits for is read and run even while a
//! peer's profile and background fetches fill the limit (a node's FETCH
//! for a fault behind 96 profile runs). Every wait for a peer has a timeout: a
//! first call within `first_call_timeout`, a record once begun within
//! `record_timeout`, the next call within `idle_timeout` while nothing is
//! running. On shutdown the listener stops, readers stop taking new calls,
//! calls in flight finish and their replies are written, within the drain
//! deadline.
//!
//! Security per listener ([`Security`]): plain RPC (optionally upgraded by
//! the RFC 9289 STARTTLS probe), or TLS 1.3 from the first byte with a
//! client certificate required (`--listen-tls`, between proxies). A TLS
//! handshake on a plain port, plain RPC on a TLS port, and any refused
//! certificate end the connection with one log line at WARN; nothing is
//! served. A connection that sends nothing (a health check that connects
//! and closes, a silent socket) is no refused peer: it is logged at DEBUG
//! only. Connections not yet through their handshake are pending
//! ([`slots`]): they cannot take an authenticated peer's place.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use gvfs_nfs::Class;
use gvfs_nfs::net::stream::{RecordStream, StreamError};
use gvfs_nfs::record::RecordLimits;
use gvfs_nfs::rpc::ReplyRecord;
use gvfs_tunnel::{IdentityMap, TlsIdentity};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::front::{CredMap, FrontEnd, Peer};

mod memory;
mod replies;
mod slots;
mod stats;

use memory::Charge;
pub use memory::MemoryBudget;
use replies::reply_queue;
use slots::{ConnState, Slot, Slots};
pub use stats::{ConnCounters, ConnCounts, ServerStats};

/// Limits of the server edge.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections served at once (through their first call or TLS
    /// handshake); when full, the one idle longest makes room.
    pub max_connections: usize,
    /// Connections not yet through their first call or TLS handshake; when
    /// full, the oldest makes room.
    pub max_pending: usize,
    /// Calls below [`Class::Demand`] running at once per connection; a
    /// connection has at most twice this many read and not yet answered,
    /// and demand calls run at once within that.
    pub max_in_flight: usize,
    /// Caps on incoming records.
    pub records: RecordLimits,
    /// A connection with nothing running and no call for this long is
    /// closed.
    pub idle_timeout: Duration,
    /// A new connection must send a complete first call within this.
    pub first_call_timeout: Duration,
    /// A record must be complete this long after its first byte.
    pub record_timeout: Duration,
    /// Longest wait for one reply write before the connection is dropped.
    pub write_timeout: Duration,
    /// Most bytes of call records and replies held at once, all
    /// connections together (see [`MemoryBudget`]).
    pub buffer_memory: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_pending: 64,
            max_in_flight: 64,
            records: RecordLimits::for_payload(gvfs_nfs::proc::MAX_DATA),
            idle_timeout: Duration::from_secs(600),
            first_call_timeout: Duration::from_secs(10),
            record_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            buffer_memory: 256 << 20,
        }
    }
}

/// TLS settings of a listener.
pub struct TlsSide {
    /// Our certificate, key and CA.
    pub identity: TlsIdentity,
    /// How authenticated peers' credentials are mapped.
    pub map: Arc<IdentityMap>,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
}

impl TlsSide {
    /// The peer of a TLS connection from `addr` whose certificate named
    /// `name`; `map_always` maps even without a certificate (unknown peer).
    fn peer(&self, addr: SocketAddr, name: Option<String>, map_always: bool) -> Peer {
        let map: Option<CredMap> = (map_always || name.is_some()).then(|| {
            let (map, name) = (self.map.clone(), name.clone());
            Arc::new(move |c: &gvfs_nfs::Credentials| map.map(name.as_deref(), c)) as CredMap
        });
        Peer {
            addr: Some(addr),
            name: name.map(Arc::from),
            map,
            conn: 0,
        }
    }
}

/// How a listener's connections are secured.
#[derive(Clone)]
pub enum Security {
    /// Plain RPC; with `starttls`, a client may switch to TLS with the RFC
    /// 9289 probe (a client certificate is then optional: without one the
    /// client is treated as a plain one).
    Plain {
        /// TLS settings for STARTTLS, when the proxy has a certificate.
        starttls: Option<Arc<TlsSide>>,
    },
    /// TLS from the first byte, client certificate required.
    Tls(Arc<TlsSide>),
}

/// What the listeners of one proxy share.
#[derive(Clone)]
pub struct Shared {
    /// The front end calls go to.
    pub front: Arc<FrontEnd>,
    /// Connection counters.
    pub stats: Arc<ServerStats>,
    /// The memory budget of all connections.
    pub budget: Arc<MemoryBudget>,
    /// Cancelled on shutdown.
    pub shutdown: CancellationToken,
    /// Tracks calls in flight, for draining.
    pub tasks: TaskTracker,
}

/// Serves `shared.front` on `listener` until `shared.shutdown` is
/// cancelled, then drains in-flight calls (tracked by `shared.tasks`) and
/// returns.
pub async fn serve(
    listener: TcpListener,
    security: Security,
    limits: ServerLimits,
    shared: Shared,
) {
    let Shared {
        front,
        stats,
        budget,
        shutdown,
        tasks,
    } = shared;
    let slots = Arc::new(Slots::new(
        limits.max_connections,
        limits.max_pending,
        stats.clone(),
        budget,
    ));
    while let Some((stream, peer)) = accept_until(|| listener.accept(), "nfs", &shutdown).await {
        let _ = stream.set_nodelay(true);
        // Never waits: a full pool of new connections makes room.
        let slot = slots.admit(peer, &shutdown);
        let (front, stats, shutdown) = (front.clone(), stats.clone(), shutdown.clone());
        let conn = Conn {
            front,
            limits,
            shutdown,
            tasks: tasks.clone(),
        };
        let security = security.clone();
        tasks.spawn(async move {
            stats.counts.accepted.inc();
            stats.open.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "connection opened");
            open_connection(stream, &slot, &security, conn, &stats).await;
            stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(%peer, "connection closed");
            drop(slot);
        });
    }
}

/// What serving one connection needs besides the stream.
#[derive(Clone)]
struct Conn {
    front: Arc<FrontEnd>,
    limits: ServerLimits,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// Runs `step` unless the connection is closed first (evicted from the
/// pending pool, or shutdown); `None` then.
async fn unless_closed<T>(state: &ConnState, step: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        () = state.close().cancelled() => None,
        v = step => Some(v),
    }
}

/// Secures a new connection as its listener says, then serves it.
async fn open_connection(
    mut stream: TcpStream,
    slot: &Slot,
    security: &Security,
    conn: Conn,
    stats: &ServerStats,
) {
    let state = slot.state();
    let addr = state.addr();
    let refused = |what: &str, e: &dyn std::fmt::Display| {
        stats.counts.tls_refused.inc();
        tracing::warn!(peer = %addr, "refused a connection: {what}: {e}");
    };
    let starttls = match security {
        Security::Tls(tls) => {
            let start = tokio::time::Instant::now();
            // A health check connects and closes without a byte; a silent
            // socket sends nothing: neither is a peer refused.
            let mut b = [0u8; 1];
            let peek = tokio::time::timeout(tls.handshake_timeout, stream.peek(&mut b));
            match unless_closed(state, peek).await {
                None => return,
                Some(Ok(Ok(1))) => {}
                Some(Ok(_)) => {
                    tracing::debug!(peer = %addr, "closed before sending anything");
                    return;
                }
                Some(Err(_)) => {
                    stats.counts.timed_out.inc();
                    tracing::debug!(peer = %addr, "closing a new connection: no TLS handshake in time");
                    return;
                }
            }
            let left = tls.handshake_timeout.saturating_sub(start.elapsed());
            let handshake = gvfs_tunnel::accept(stream, tls.identity.server_config(), left);
            match unless_closed(state, handshake).await {
                Some(Ok((s, name))) => {
                    stats.counts.tls_accepted.inc();
                    tracing::info!(peer = %addr, name = name.as_deref().unwrap_or("?"), "TLS peer connected");
                    let peer = tls.peer(addr, name, true);
                    if slot.serve().await {
                        serve_connection(s, peer, conn, stats, state.clone()).await;
                    }
                }
                Some(Err(e @ gvfs_tunnel::AcceptError::Timeout(_))) => {
                    stats.counts.timed_out.inc();
                    tracing::debug!(peer = %addr, "closing a new connection: {e}");
                }
                Some(Err(e)) => refused("TLS listener", &e),
                None => {}
            }
            return;
        }
        Security::Plain { starttls } => starttls,
    };
    let first = match unless_closed(state, sniff(&mut stream, conn.limits)).await {
        None => return,
        Some(Ok(f)) => f,
        Some(Err(Sniffed::TlsHello)) => {
            refused(
                "plain port",
                &"a TLS handshake arrived; connect to the --listen-tls port, or send the RFC 9289 STARTTLS probe first",
            );
            return;
        }
        Some(Err(Sniffed::Oversized(e))) => {
            stats.counts.closed_oversized.inc();
            tracing::warn!(peer = %addr, error = %e, "closing connection");
            return;
        }
        Some(Err(Sniffed::TimedOut)) => {
            stats.counts.timed_out.inc();
            tracing::debug!(peer = %addr, "closing a new connection: no complete call in time");
            return;
        }
        Some(Err(Sniffed::Closed)) => return,
    };
    // RFC 9289: a NULL call with AUTH_TLS as the first call asks to switch.
    if let (Some(tls), Some(xid)) = (starttls, gvfs_nfs::rpc::is_tls_probe(&first.record))
        && first.rest.is_empty()
    {
        let reply = gvfs_nfs::rpc::starttls_reply(xid);
        match tokio::time::timeout(conn.limits.write_timeout, stream.write_all(&reply)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let handshake = gvfs_tunnel::accept(
            stream,
            tls.identity.starttls_config(),
            tls.handshake_timeout,
        );
        match unless_closed(state, handshake).await {
            Some(Ok((s, name))) => {
                stats.counts.starttls.inc();
                stats.counts.tls_accepted.inc();
                tracing::info!(peer = %addr, name = name.as_deref().unwrap_or("-"), "client switched to TLS (RFC 9289)");
                let peer = tls.peer(addr, name, false);
                if slot.serve().await {
                    serve_connection(s, peer, conn, stats, state.clone()).await;
                }
            }
            Some(Err(e)) => refused("STARTTLS", &e),
            None => {}
        }
        return;
    }
    let mut replay = gvfs_nfs::record::frame(first.record.len()).to_vec();
    replay.extend_from_slice(&first.record);
    replay.extend_from_slice(&first.rest);
    let stream = Prefixed {
        prefix: replay,
        at: 0,
        inner: stream,
    };
    if slot.serve().await {
        serve_connection(stream, Peer::plain(Some(addr)), conn, stats, state.clone()).await;
    }
}

/// The first record of a plain connection and what was read after it.
struct First {
    record: Vec<u8>,
    rest: Vec<u8>,
}

/// Why a plain connection ended before its first record.
enum Sniffed {
    /// The first byte starts a TLS record (a ClientHello).
    TlsHello,
    /// A record cap was exceeded.
    Oversized(gvfs_nfs::record::RecordError),
    /// No complete first call within the first-call timeout (nothing, or
    /// part of a record), or a record begun and not finished in time.
    TimedOut,
    /// EOF or an error.
    Closed,
}

/// TLS records start with content type 22 (handshake); a record mark
/// starting with that byte would announce a fragment of more than 350 MiB,
/// beyond any cap, so the two cannot be confused.
const TLS_HANDSHAKE: u8 = 0x16;

/// Reads the first record of a plain connection, noticing a TLS handshake.
async fn sniff(stream: &mut TcpStream, limits: ServerLimits) -> Result<First, Sniffed> {
    let deadline = tokio::time::Instant::now() + limits.first_call_timeout;
    let mut b = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut b)).await {
        Ok(Ok(1)) if b[0] == TLS_HANDSHAKE => return Err(Sniffed::TlsHello),
        Ok(Ok(1)) => {}
        Ok(_) => return Err(Sniffed::Closed),
        Err(_) => return Err(Sniffed::TimedOut),
    }
    let mut records = RecordStream::new(&mut *stream, limits.records);
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    match records.next_within(wait, limits.record_timeout).await {
        Ok(Some(record)) => Ok(First {
            rest: records.buffered().to_vec(),
            record,
        }),
        Err(StreamError::Record(e)) => Err(Sniffed::Oversized(e)),
        Err(StreamError::TimedOut { .. }) => Err(Sniffed::TimedOut),
        _ => Err(Sniffed::Closed),
    }
}

/// A stream that first yields `prefix` (bytes already read from `inner`).
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Serves one connection until EOF, an error, a timeout, eviction or
/// shutdown.
async fn serve_connection<S>(
    stream: S,
    peer: Peer,
    conn: Conn,
    stats: &ServerStats,
    state: Arc<ConnState>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let Conn {
        front,
        limits,
        shutdown,
        tasks,
    } = conn;
    let mut peer = peer;
    peer.conn = state.id();
    state.memory().attach(peer.tenant());
    let peer = Arc::new(peer);
    let (rd, mut wr) = tokio::io::split(stream);
    let limit = limits.max_in_flight.max(1);
    let in_flight = Arc::new(Semaphore::new(2 * limit));
    let running = Arc::new(Semaphore::new(limit));
    let (reply_tx, mut reply_rx) = reply_queue::<Queued>();
    let write_timeout = limits.write_timeout;
    let writer = tokio::spawn(async move {
        while let Some(q) = reply_rx.pop().await {
            match tokio::time::timeout(write_timeout, write_record(&mut wr, q.reply)).await {
                Ok(Ok(())) => drop((q.held, q.permit)),
                _ => return,
            }
        }
        // Closing (a TLS close_notify included) is bounded too.
        let _ = tokio::time::timeout(write_timeout, wr.shutdown()).await;
    });

    let mut records = RecordStream::new(rd, limits.records);
    // One wait for the close signal (eviction or shutdown) for the whole
    // connection, not one per call.
    let closed = state.close().cancelled();
    tokio::pin!(closed);
    loop {
        if reply_tx.is_closed() {
            // The writer gave up (a reply unwritten for the write timeout).
            break;
        }
        // Backpressure: no more calls while this connection holds its share
        // of the memory budget (its client is not reading replies), or all
        // connections together hold the budget.
        tokio::select! {
            biased;
            () = &mut closed => break,
            () = state.memory().room() => {}
        }
        let wait = if state.has_called() {
            limits.idle_timeout
        } else {
            limits.first_call_timeout
        };
        let rec = tokio::select! {
            biased;
            () = &mut closed => {
                if !shutdown.is_cancelled() {
                    tracing::debug!(peer = ?peer.addr, "closed to make room for a new connection");
                }
                break;
            }
            r = records.next_within(wait, limits.record_timeout) => match r {
                Ok(Some(rec)) => rec,
                Ok(None) => break,
                Err(StreamError::Record(e)) => {
                    stats.counts.closed_oversized.inc();
                    tracing::warn!(peer = ?peer.addr, error = %e, "closing connection");
                    break;
                }
                // Nothing lost: calls are running, so it is not idle.
                Err(StreamError::TimedOut { begun: false }) if state.busy() => continue,
                Err(StreamError::TimedOut { begun }) => {
                    stats.counts.timed_out.inc();
                    let what = if begun {
                        "part of a call came, then nothing"
                    } else {
                        "idle"
                    };
                    tracing::debug!(peer = ?peer.addr, "closing connection: {what}");
                    break;
                }
                Err(e) => {
                    tracing::debug!(peer = ?peer.addr, error = %e, "connection ended");
                    break;
                }
            },
        };
        let call = state.call_started((rec.len() + front.reply_size_hint(&rec)) as u64);
        let class = front.call_class(&rec);
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (front, tx, peer) = (front.clone(), reply_tx.clone(), peer.clone());
        let memory = state.memory().clone();
        let running = (class < Class::Demand).then(|| running.clone());
        tasks.spawn(async move {
            // A lower-class call waits for its turn here, not in the
            // reader: the calls behind it are still read.
            let turn = match running {
                Some(running) => match running.acquire_owned().await {
                    Ok(turn) => Some(turn),
                    Err(_) => return,
                },
                None => None,
            };
            let reply = front.handle(&rec, &peer).await;
            drop(turn);
            drop(rec);
            if let Some(reply) = reply {
                // The reply as it is, instead of the most it could be.
                let held = memory.charge(reply.len() as u64);
                drop(call);
                // Refused only when the writer gave up: dropped, then.
                let _ = tx.push(
                    class,
                    Queued {
                        reply,
                        held,
                        permit,
                    },
                );
            }
        });
    }
    // Let calls in flight finish and queue their replies, then close.
    drop(reply_tx);
    let _ = writer.await;
}

/// A reply waiting to be written, with what its call holds until then:
/// its memory charge and its in-flight permit (which bounds the queue).
struct Queued {
    reply: ReplyRecord,
    held: Charge,
    permit: OwnedSemaphorePermit,
}

/// Writes one reply record with as few system calls as the stream allows
/// (one `writev` for a TCP socket), without first joining its parts.
async fn write_record<W: AsyncWrite + Unpin>(wr: &mut W, rec: ReplyRecord) -> std::io::Result<()> {
    if !wr.is_write_vectored() {
        return wr.write_all(&rec.into_vec()).await;
    }
    let parts = rec.parts();
    let (total, mut done) = (rec.len(), 0);
    while done < total {
        let mut skip = done;
        let mut bufs = [IoSlice::new(&[]); 3];
        let mut n = 0;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            bufs[n] = IoSlice::new(&p[skip..]);
            skip = 0;
            n += 1;
        }
        match wr.write_vectored(&bufs[..n]).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            w => done += w,
        }
    }
    Ok(())
}

/// The next connection `accept` gives, or `None` once `shutdown` is
/// cancelled. A failed accept (out of file descriptors, say) is logged and
/// retried after a pause, so a run of failures neither spins nor ends the
/// listener.
pub(crate) async fn accept_until<T, F, Fut>(
    mut accept: F,
    listener: &str,
    shutdown: &CancellationToken,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = accept() => match r {
                Ok(v) => return Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, listener, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
