//! An async ONC RPC client over one stream connection, with many calls in
//! flight matched by XID (RFC 5531 section 9: the xid pairs a reply with its
//! call), reconnection and retransmission.
//!
//! A call is encoded once. If its connection drops, it is sent again, with
//! the same xid, on the next connection, so a server's duplicate-request
//! cache can recognise a retransmitted non-idempotent call. A call that gets
//! no reply within `retransmit_after` is sent again on the same connection.
//! A call that cannot complete within `give_up_after` fails with
//! [`ClientError::Unavailable`]; `None` waits like a hard mount.
//!
//! A connection the server has gone quiet on is left for a new one, as a
//! kernel client does after a major timeout: when a call's reply is
//! `retransmit_after` late and nothing at all has come from the server for
//! as long, or a call record cannot be handed to the socket for as long
//! (the server stopped reading). Every call on it is then resent on the
//! next connection. A connection that dies before the server has answered
//! anything on it is redialled only after a growing pause, so a server
//! that hangs up at once is not called in a tight loop.
//!
//! A server that refuses us for good (a TLS alert: it rejected our
//! certificate; or a certificate we reject) is no outage: the connector
//! says so ([`Connector::refusal`]), and every call waiting on that
//! connection fails at once with [`ClientError::Refused`] and the reason.
//!
//! Every call answered on its first send is a sample of the link's round
//! trip and delivery rate ([`RpcClient::link`], `estimate.rs`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::net::estimate::LinkHandle;
use crate::net::stream::{RecordStream, StreamError};
use crate::proc::CallName;
use crate::record::RecordLimits;
use crate::rpc::{self, Credentials, Reply, ReplyError};
use crate::service::BoxFuture;

/// A bidirectional byte stream the client can run over (TCP, TLS, ...).
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A boxed [`Stream`].
pub type BoxStream = Box<dyn Stream>;

/// Opens connections to one server; asked again after every drop.
pub trait Connector: Send + Sync + 'static {
    /// Opens a new connection.
    fn connect(&self) -> BoxFuture<'_, io::Result<BoxStream>>;
    /// Where this connects, for messages.
    fn describe(&self) -> String;
    /// Whether `e`, from [`connect`](Self::connect) or from reading a
    /// connection it opened, means the server refused us for good (retrying
    /// cannot help), and why. By default: an error carrying a [`Refusal`].
    fn refusal(&self, e: &io::Error) -> Option<String> {
        refusal_of(e)
    }
}

/// The error a [`Connector`] returns (inside an `io::Error`) when the
/// server refused us for good, such as a TLS handshake that failed on a
/// certificate: calls fail at once with [`ClientError::Refused`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl From<Refusal> for io::Error {
    fn from(r: Refusal) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, r)
    }
}

/// The reason of a [`Refusal`] carried by `e`, if it carries one.
pub fn refusal_of(e: &io::Error) -> Option<String> {
    e.get_ref()?.downcast_ref::<Refusal>().map(|r| r.0.clone())
}

/// Connects over plain TCP to a fixed address.
#[derive(Debug, Clone)]
pub struct TcpConnector {
    /// The server's address.
    pub addr: std::net::SocketAddr,
}

impl Connector for TcpConnector {
    fn connect(&self) -> BoxFuture<'_, io::Result<BoxStream>> {
        Box::pin(async move {
            let s = tokio::net::TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as BoxStream)
        })
    }

    fn describe(&self) -> String {
        self.addr.to_string()
    }
}

/// Timeouts and limits of an [`RpcClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for one connection attempt.
    pub connect_timeout: Duration,
    /// Resend a call that has had no reply for this long.
    pub retransmit_after: Duration,
    /// Fail a call that has not completed after this long; `None` retries
    /// forever (hard-mount behaviour).
    pub give_up_after: Option<Duration>,
    /// Most calls in flight at once; more wait their turn.
    pub max_in_flight: usize,
    /// Caps on incoming reply records.
    pub limits: RecordLimits,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            retransmit_after: Duration::from_secs(30),
            give_up_after: Some(Duration::from_secs(60)),
            max_in_flight: 128,
            limits: RecordLimits::for_payload(crate::proc::MAX_DATA),
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server could not be reached, or did not answer, in time.
    #[error("{server} unavailable after {waited:?}: {last_error}")]
    Unavailable {
        /// Where the client connects.
        server: String,
        /// How long the call waited.
        waited: Duration,
        /// The last connection or I/O error seen.
        last_error: String,
    },
    /// The server refused us for good (see [`Connector::refusal`]): a
    /// certificate rejected on either side, a TLS alert.
    #[error("{server}: {reason}")]
    Refused {
        /// Where the client connects.
        server: String,
        /// Why, as the connector said.
        reason: String,
    },
    /// The server answered with an RPC-level error.
    #[error("{server}: {error}")]
    Rpc {
        /// Where the client connects.
        server: String,
        /// The RPC error.
        error: ReplyError,
    },
}

crate::counters! {
    /// Counters of an [`RpcClient`].
    pub struct ClientStats => ClientCounts {
        /// Calls started.
        calls,
        /// Calls sent again after a timeout or a dropped connection.
        retransmits,
        /// Connections opened.
        connects,
    }
}

/// A multiplexing RPC client. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Arc<dyn Connector>,
    cfg: ClientConfig,
    next_xid: AtomicU32,
    in_flight: Semaphore,
    conn: tokio::sync::Mutex<Slot>,
    stats: ClientStats,
    link: LinkHandle,
}

/// The connection, and the pause before dialling again after one that
/// died before the server answered anything on it.
#[derive(Default)]
struct Slot {
    conn: Option<Arc<Conn>>,
    redial: Duration,
}

/// The first and the longest pause between connection attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

type Pending = Mutex<HashMap<u32, oneshot::Sender<Vec<u8>>>>;

/// A call's entry in [`Pending`], removed when dropped.
struct PendingSlot<'a> {
    pending: &'a Pending,
    xid: u32,
}

impl<'a> PendingSlot<'a> {
    fn new(pending: &'a Pending, xid: u32, tx: oneshot::Sender<Vec<u8>>) -> Self {
        lock(pending).insert(xid, tx);
        Self { pending, xid }
    }
}

impl Drop for PendingSlot<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.xid);
    }
}

struct Conn {
    out: mpsc::Sender<Arc<Vec<u8>>>,
    pending: Arc<Pending>,
    dead: Arc<AtomicBool>,
    /// Why the server refused us on it, if it did: set before the calls
    /// waiting on it are woken.
    refused: Arc<Mutex<Option<String>>>,
    /// When it was opened, and when a record last came in on it
    /// (milliseconds after `opened`, plus one; 0: never).
    opened: Instant,
    heard: Arc<AtomicU64>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("server", &self.inner.connector.describe())
            .finish()
    }
}

impl RpcClient {
    /// A client that connects through `connector` on first use.
    pub fn new(connector: impl Connector, cfg: ClientConfig) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
            .unwrap_or(1);
        Self {
            inner: Arc::new(Inner {
                connector: Arc::new(connector),
                in_flight: Semaphore::new(cfg.max_in_flight.max(1)),
                cfg,
                next_xid: AtomicU32::new(seed ^ std::process::id()),
                conn: tokio::sync::Mutex::new(Slot::default()),
                stats: ClientStats::default(),
                link: LinkHandle::new(),
            }),
        }
    }

    /// Where this client connects.
    pub fn server(&self) -> String {
        self.inner.connector.describe()
    }

    /// The client's counters.
    pub fn stats(&self) -> &ClientStats {
        &self.inner.stats
    }

    /// The link to the server as its calls measure it (every answered
    /// call that was sent once is a sample).
    pub fn link(&self) -> LinkHandle {
        self.inner.link.clone()
    }

    /// Connects now (if not connected) and reports failure, to check an
    /// upstream at start-up.
    pub async fn connect(&self) -> Result<(), ClientError> {
        let start = Instant::now();
        self.inner
            .connection(Some(start + self.inner.cfg.connect_timeout), start)
            .await
            .map(|_| ())
    }

    /// Calls `prog`/`vers`/`proc_` with XDR-encoded `args` and returns the
    /// XDR-encoded results of a successful reply.
    pub async fn call(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Reply, ClientError> {
        self.call_with(prog, vers, proc_, cred, |out| out.extend_from_slice(args))
            .await
    }

    /// Like [`call`](Self::call), with the arguments written by `encode`
    /// straight into the call record (no intermediate buffer).
    pub async fn call_with(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        cred: &Credentials,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Reply, ClientError> {
        let inner = &self.inner;
        let _permit = inner
            .in_flight
            .acquire()
            .await
            .map_err(|_| ClientError::Unavailable {
                server: inner.connector.describe(),
                waited: Duration::ZERO,
                last_error: "client closed".into(),
            })?;
        inner.stats.calls.inc();
        let xid = inner.next_xid.fetch_add(1, Ordering::Relaxed);
        let mut record = rpc::call_record(xid, prog, vers, proc_, cred);
        encode(&mut record);
        let record = Arc::new(rpc::seal(record));
        let start = Instant::now();
        let deadline = inner.cfg.give_up_after.map(|d| start + d);
        let mut attempt = 0u32;
        loop {
            if attempt > 0 {
                inner.stats.retransmits.inc();
            }
            attempt += 1;
            let conn = inner.connection(deadline, start).await?;
            let (tx, rx) = oneshot::channel();
            // Gone with this attempt, however it ends (a caller that gives
            // up on the call drops it too).
            let _slot = PendingSlot::new(&conn.pending, xid, tx);
            let wait = inner.wait(deadline);
            match tokio::time::timeout(wait, conn.out.send(record.clone())).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    if let Some(why) = conn.refusal() {
                        return Err(inner.refused(why));
                    }
                    conn.dead.store(true, Ordering::Release);
                    continue;
                }
                Err(_) => {
                    // The writer has not taken a record for `wait`: the
                    // server is not reading.
                    conn.abandon("the server stopped reading");
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(inner.unavailable(start, "server not reading".into()));
                    }
                    continue;
                }
            }
            let sent = (attempt == 1).then(|| inner.link.sent());
            match tokio::time::timeout(inner.wait(deadline), rx).await {
                Ok(Ok(reply)) => {
                    if let Some(sent) = sent {
                        inner.link.replied(sent, reply.len() as u64);
                    }
                    tracing::trace!(
                        server = %inner.connector.describe(),
                        call = %CallName(prog, proc_),
                        xid,
                        attempt,
                        ms = start.elapsed().as_secs_f64() * 1e3,
                        "upstream reply"
                    );
                    return self.finish(reply);
                }
                // The connection died and dropped our slot: resend on a new
                // one, unless the server refused us.
                Ok(Err(_)) => {
                    if let Some(why) = conn.refusal() {
                        return Err(inner.refused(why));
                    }
                }
                Err(_) => {
                    if conn.silent_for(inner.cfg.retransmit_after) {
                        conn.abandon("nothing heard from the server");
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(inner.unavailable(start, "no reply".into()));
                    }
                }
            }
        }
    }

    fn finish(&self, record: Vec<u8>) -> Result<Reply, ClientError> {
        let results_at = match rpc::parse_reply(&record) {
            Ok(results) => record.len() - results.len(),
            Err(error) => {
                return Err(ClientError::Rpc {
                    server: self.inner.connector.describe(),
                    error,
                });
            }
        };
        Ok(Reply::new(record, results_at))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    /// How long to wait for one step of a call: until a retransmission is
    /// due, or the call's deadline if sooner.
    fn wait(&self, deadline: Option<Instant>) -> Duration {
        match deadline {
            Some(d) => self
                .cfg
                .retransmit_after
                .min(d.saturating_duration_since(Instant::now())),
            None => self.cfg.retransmit_after,
        }
    }

    fn refused(&self, reason: String) -> ClientError {
        ClientError::Refused {
            server: self.connector.describe(),
            reason,
        }
    }

    fn unavailable(&self, start: Instant, last_error: String) -> ClientError {
        ClientError::Unavailable {
            server: self.connector.describe(),
            waited: start.elapsed(),
            last_error,
        }
    }

    /// The live connection, opening one (with backoff) if there is none.
    async fn connection(
        &self,
        deadline: Option<Instant>,
        start: Instant,
    ) -> Result<Arc<Conn>, ClientError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.conn.as_ref()
            && !c.dead.load(Ordering::Acquire)
        {
            return Ok(c.clone());
        }
        if let Some(c) = slot.conn.take() {
            // Its reader may have seen the refusal after the call that
            // found it dead moved on (its writer failed first).
            if let Some(why) = c.refusal() {
                return Err(self.refused(why));
            }
            if c.heard.load(Ordering::Acquire) == 0 {
                // It died before the server said anything on it: pause
                // before the next, longer each time it happens again.
                slot.redial = (slot.redial * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
                let pause = match deadline {
                    Some(d) => slot.redial.min(d.saturating_duration_since(Instant::now())),
                    None => slot.redial,
                };
                tokio::time::sleep(pause).await;
            } else {
                slot.redial = Duration::ZERO;
            }
        }
        let mut backoff = FIRST_BACKOFF;
        let mut last_err: Option<String> = None;
        loop {
            let budget = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // The last attempt's error says why, not the clock.
                        let why = last_err.unwrap_or_else(|| "deadline passed".into());
                        return Err(self.unavailable(start, why));
                    }
                    left.min(self.cfg.connect_timeout)
                }
                None => self.cfg.connect_timeout,
            };
            let err = match tokio::time::timeout(budget, self.connector.connect()).await {
                Ok(Ok(stream)) => {
                    self.stats.connects.inc();
                    let conn = Arc::new(Conn::start(stream, &self.cfg, self.connector.clone()));
                    slot.conn = Some(conn.clone());
                    return Ok(conn);
                }
                Ok(Err(e)) => {
                    if let Some(why) = self.connector.refusal(&e) {
                        return Err(self.refused(why));
                    }
                    e.to_string()
                }
                Err(_) => format!("connect timed out after {budget:?}"),
            };
            tracing::debug!(server = %self.connector.describe(), error = %err, "connect failed");
            let sleep = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.unavailable(start, err));
                    }
                    backoff.min(left)
                }
                None => backoff,
            };
            last_err = Some(err);
            tokio::time::sleep(sleep).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

impl Conn {
    fn start(stream: BoxStream, cfg: &ClientConfig, connector: Arc<dyn Connector>) -> Self {
        let (rd, mut wr) = tokio::io::split(stream);
        let pending: Arc<Pending> = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let refused: Arc<Mutex<Option<String>>> = Arc::default();
        let (out, mut out_rx) = mpsc::channel::<Arc<Vec<u8>>>(64);
        let (opened, heard) = (Instant::now(), Arc::new(AtomicU64::new(0)));
        let (limits, stall) = (cfg.limits, cfg.retransmit_after);
        let writer = {
            let (dead, pending_w) = (dead.clone(), pending.clone());
            tokio::spawn(async move {
                while let Some(rec) = out_rx.recv().await {
                    // A server that takes no bytes for this long is not
                    // reading: give the connection up.
                    match tokio::time::timeout(stall, wr.write_all(&rec)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => {
                            tracing::warn!(
                                "dropping connection to server: it took no bytes for {stall:?}"
                            );
                            break;
                        }
                    }
                }
                dead.store(true, Ordering::Release);
                lock(&pending_w).clear();
                let _ = wr.shutdown().await;
            })
        };
        let reader = {
            let (pending, dead, heard) = (pending.clone(), dead.clone(), heard.clone());
            let refused = refused.clone();
            tokio::spawn(async move {
                let mut records = RecordStream::new(rd, limits);
                loop {
                    match records.next().await {
                        Ok(Some(rec)) => {
                            heard.store(millis_since(opened) + 1, Ordering::Release);
                            let Some(xid) = rpc::reply_xid(&rec) else {
                                continue;
                            };
                            if let Some(tx) = lock(&pending).remove(&xid) {
                                let _ = tx.send(rec);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let why = match &e {
                                StreamError::Io(io) => connector.refusal(io),
                                _ => None,
                            };
                            match why {
                                Some(why) => {
                                    tracing::warn!(server = %connector.describe(), "{why}");
                                    *lock(&refused) = Some(why);
                                }
                                None => {
                                    tracing::warn!(error = %e, "dropping connection to server")
                                }
                            }
                            break;
                        }
                    }
                }
                dead.store(true, Ordering::Release);
                // Dropping the senders wakes every waiting call to resend.
                lock(&pending).clear();
            })
        };
        Self {
            out,
            pending,
            dead,
            refused,
            opened,
            heard,
            reader,
            writer,
        }
    }

    /// Why the server refused us on it, if it did.
    fn refusal(&self) -> Option<String> {
        lock(&self.refused).clone()
    }

    /// Whether nothing has come in on it for `quiet`.
    fn silent_for(&self, quiet: Duration) -> bool {
        let last = match self.heard.load(Ordering::Acquire) {
            0 => 0,
            n => n - 1,
        };
        millis_since(self.opened).saturating_sub(last) >= quiet.as_millis() as u64
    }

    /// Gives it up: the next call opens another, and every call waiting
    /// on it is woken to resend there.
    fn abandon(&self, why: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            tracing::warn!("leaving a connection to the server: {why}");
        }
        lock(&self.pending).clear();
    }
}

fn millis_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod link_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_given_up_by_its_caller_leaves_nothing_pending() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // Accept and hold, answering nothing.
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let client = RpcClient::new(TcpConnector { addr }, ClientConfig::default());
        let c = client.clone();
        let call = tokio::spawn(async move { c.call(1, 1, 1, &Credentials::None, &[]).await });
        let conn = loop {
            if let Some(conn) = client.inner.conn.lock().await.conn.clone()
                && !lock(&conn.pending).is_empty()
            {
                break conn;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        call.abort();
        let _ = call.await;
        assert!(lock(&conn.pending).is_empty());
        server.abort();
    }

    /// Refuses every connection, as a TLS connector does when we reject
    /// the server's certificate.
    struct Refusing(AtomicU32);

    impl Connector for Refusing {
        fn connect(&self) -> BoxFuture<'_, io::Result<BoxStream>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Err(Refusal("we rejected the server's certificate".into()).into()) })
        }

        fn describe(&self) -> String {
            "refusing".into()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_fails_the_call_at_once_even_with_no_deadline() {
        let connector = Refusing(AtomicU32::new(0));
        let cfg = ClientConfig {
            give_up_after: None,
            ..ClientConfig::default()
        };
        let client = RpcClient::new(connector, cfg);
        let call = client.call(1, 1, 1, &Credentials::None, &[]);
        // Paused time runs ahead through any retrying: an hour passes at
        // once if the call does not end by itself.
        let got = tokio::time::timeout(Duration::from_secs(3600), call)
            .await
            .expect("the call kept retrying");
        assert_eq!(
            got,
            Err(ClientError::Refused {
                server: "refusing".into(),
                reason: "we rejected the server's certificate".into(),
            })
        );
    }
}
