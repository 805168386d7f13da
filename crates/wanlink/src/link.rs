//! The relay: accepts clients, connects each to the target and runs both
//! directions through the emulated link.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::clock::Transmitter;
use crate::config::{CutMode, Direction, LinkConfig};
use crate::error::{Error, Result};
use crate::pipe::relay_direction;
use crate::state::LinkState;
use crate::timer::{Timer, TimerThread};

/// Pause after a failed `accept` (say, out of file descriptors) before
/// trying again, so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running WAN link emulator: a TCP relay from `local_addr()` to a target
/// that delays, rate-limits and can cut the traffic of every connection.
///
/// Each accepted client gets its own connection to the target. Dropping the
/// `WanLink` stops it as abruptly as [`shutdown`](Self::shutdown), without
/// waiting for its tasks to finish.
#[derive(Debug)]
pub struct WanLink {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// Stops the timer thread when the link goes.
    _timer_thread: Option<TimerThread>,
}

/// What the accept loop and every connection share.
#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    state: watch::Sender<LinkState>,
    timer: Timer,
    upstream_bytes: AtomicU64,
    downstream_bytes: AtomicU64,
    /// One serialisation queue per direction for all connections: they share
    /// the link's bandwidth, as connections across one WAN link do.
    upstream_tx: Mutex<Transmitter>,
    downstream_tx: Mutex<Transmitter>,
    connections_accepted: AtomicU64,
    connections_active: AtomicU64,
    connections_reset: AtomicU64,
}

/// Counters of a [`WanLink`] since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Bytes delivered from clients to the target.
    pub upstream_bytes: u64,
    /// Bytes delivered from the target to clients.
    pub downstream_bytes: u64,
    /// Client connections accepted, including those reset during a cut.
    pub connections_accepted: u64,
    /// Client connections open right now.
    pub connections_active: u64,
    /// Client connections reset by a cut, whether relayed or refused.
    pub connections_reset: u64,
}

impl fmt::Display for LinkStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "up={} down={} accepted={} active={} reset={}",
            self.upstream_bytes,
            self.downstream_bytes,
            self.connections_accepted,
            self.connections_active,
            self.connections_reset
        )
    }
}

impl WanLink {
    /// Binds `listen` and starts relaying every accepted connection to
    /// `target` through a link shaped by `config`. Must be called inside a
    /// tokio runtime.
    pub async fn start(listen: SocketAddr, target: SocketAddr, config: LinkConfig) -> Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Bind {
                addr: listen,
                source,
            })?;
        Self::from_listener(listener, target, config)
    }

    /// Like [`start`](Self::start) with a listener the caller bound.
    pub fn from_listener(
        listener: TcpListener,
        target: SocketAddr,
        config: LinkConfig,
    ) -> Result<Self> {
        let local_addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let connection_limit = Arc::new(Semaphore::new(config.max_connections.max(1)));
        let (state, _) = watch::channel(LinkState::new(config, Instant::now()));
        let (timer_thread, timer) = match TimerThread::start() {
            Ok((thread, timer)) => (Some(thread), Timer::Precise(timer)),
            Err(error) => {
                warn!(%error, "no timer thread: delays will be up to 2 ms long");
                (None, Timer::Tokio)
            }
        };
        let shared = Arc::new(Shared {
            target,
            state,
            timer,
            upstream_bytes: AtomicU64::new(0),
            downstream_bytes: AtomicU64::new(0),
            upstream_tx: Mutex::default(),
            downstream_tx: Mutex::default(),
            connections_accepted: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            connections_reset: AtomicU64::new(0),
        });
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(accept_loop(
            listener,
            Arc::clone(&shared),
            connection_limit,
            cancel.clone(),
            tasks.clone(),
        ));
        Ok(Self {
            local_addr,
            shared,
            cancel,
            tasks,
            _timer_thread: timer_thread,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address every connection is relayed to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// Cuts the link in the configured [`CutMode`].
    pub fn cut(&self) {
        let mode = self.shared.state.borrow().config.cut_mode;
        self.cut_with(mode);
    }

    /// Cuts the link in `mode`, whatever the configuration says.
    ///
    /// [`CutMode::Reset`] resets every relayed connection on both sides and
    /// resets new clients as soon as they are accepted. [`CutMode::Blackhole`]
    /// stops delivering anything (the link's clock stands still) and holds new
    /// clients unrelayed; [`restore`](Self::restore) resumes both.
    pub fn cut_with(&self, mode: CutMode) {
        debug!(?mode, "cutting link");
        self.shared
            .state
            .send_modify(|state| state.cut(mode, Instant::now()));
    }

    /// Ends a cut. Does nothing if the link is up.
    pub fn restore(&self) {
        debug!("restoring link");
        self.shared
            .state
            .send_modify(|state| state.restore(Instant::now()));
    }

    /// The mode of the cut in force, or `None` while the link is up.
    pub fn cut_state(&self) -> Option<CutMode> {
        self.shared.state.borrow().cut
    }

    /// The configuration in force.
    pub fn config(&self) -> LinkConfig {
        self.shared.state.borrow().config.clone()
    }

    /// Replaces the configuration. Delay and rate apply to every chunk read
    /// from now on, including on open connections; bytes already scheduled
    /// keep their delivery time. An open connection keeps the in-flight
    /// budget it started with, and `max_connections` is fixed at start.
    pub fn set_config(&self, config: LinkConfig) {
        self.shared.state.send_modify(|state| state.config = config);
    }

    /// Counters since the link started.
    pub fn stats(&self) -> LinkStats {
        let s = &self.shared;
        LinkStats {
            upstream_bytes: s.upstream_bytes.load(Ordering::Relaxed),
            downstream_bytes: s.downstream_bytes.load(Ordering::Relaxed),
            connections_accepted: s.connections_accepted.load(Ordering::Relaxed),
            connections_active: s.connections_active.load(Ordering::Relaxed),
            connections_reset: s.connections_reset.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, closes every relayed connection on both sides (with a
    /// FIN, dropping bytes still in flight) and waits for all of the link's
    /// tasks to end.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for WanLink {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    connection_limit: Arc<Semaphore>,
    cancel: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let permit = tokio::select! {
            () = cancel.cancelled() => return,
            permit = Arc::clone(&connection_limit).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (client, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "accept failed");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        shared.connections_accepted.fetch_add(1, Ordering::Relaxed);
        let (cut, generation) = {
            let state = shared.state.borrow();
            (state.cut, state.reset_generation)
        };
        if cut == Some(CutMode::Reset) {
            debug!(%peer, "link is cut: resetting new connection");
            shared.connections_reset.fetch_add(1, Ordering::Relaxed);
            abort(client);
            continue;
        }
        let shared = Arc::clone(&shared);
        let cancel = cancel.clone();
        tasks.spawn(async move {
            let _permit = permit;
            shared.connections_active.fetch_add(1, Ordering::Relaxed);
            serve(client, peer, &shared, generation, cancel).await;
            shared.connections_active.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// How a relayed connection ended.
enum Ending {
    /// Both directions delivered their end of stream.
    Finished,
    /// The link is shutting down.
    Shutdown,
    /// A reset cut.
    Cut,
    /// One side failed; the other is reset to pass that on.
    Failed(std::io::Error),
}

/// Relays one client until it finishes, fails, is cut or the link stops.
async fn serve(
    client: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    generation: u64,
    cancel: CancellationToken,
) {
    let reset_cut = reset_cut(shared.state.subscribe(), generation);
    tokio::pin!(reset_cut);

    let target = tokio::select! {
        () = cancel.cancelled() => return,
        () = &mut reset_cut => {
            shared.connections_reset.fetch_add(1, Ordering::Relaxed);
            abort(client);
            return;
        }
        target = connect_target(shared) => match target {
            Ok(target) => target,
            Err(error) => {
                warn!(%peer, %error, "not relaying connection");
                abort(client);
                return;
            }
        },
    };
    for stream in [&client, &target] {
        if let Err(error) = stream.set_nodelay(true) {
            debug!(%error, "cannot set TCP_NODELAY");
        }
    }
    debug!(%peer, "relaying connection");

    let mut client = client;
    let mut target = target;
    let ending = {
        let (client_read, client_write) = client.split();
        let (target_read, target_write) = target.split();
        let upstream = relay_direction(
            client_read,
            target_write,
            Direction::Upstream,
            shared.state.subscribe(),
            &shared.timer,
            &shared.upstream_tx,
            &shared.upstream_bytes,
        );
        let downstream = relay_direction(
            target_read,
            client_write,
            Direction::Downstream,
            shared.state.subscribe(),
            &shared.timer,
            &shared.downstream_tx,
            &shared.downstream_bytes,
        );
        tokio::select! {
            () = cancel.cancelled() => Ending::Shutdown,
            () = &mut reset_cut => Ending::Cut,
            relayed = async { tokio::try_join!(upstream, downstream) } => match relayed {
                Ok(_) => Ending::Finished,
                Err(error) => Ending::Failed(error),
            },
        }
    };
    match ending {
        Ending::Finished | Ending::Shutdown => debug!(%peer, "connection closed"),
        Ending::Cut => {
            debug!(%peer, "link cut: resetting connection");
            shared.connections_reset.fetch_add(1, Ordering::Relaxed);
            abort(client);
            abort(target);
        }
        Ending::Failed(error) => {
            debug!(%peer, %error, "connection failed: resetting both sides");
            abort(client);
            abort(target);
        }
    }
}

/// Waits out a blackhole, then connects to the target within the configured
/// timeout.
async fn connect_target(shared: &Shared) -> Result<TcpStream> {
    let mut state = shared.state.subscribe();
    // The sender lives in `shared`, which outlives this call.
    let _ = state.wait_for(|state| !state.is_blackholed()).await;
    let timeout = state.borrow().config.connect_timeout;
    let target = shared.target;
    match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(source)) => Err(Error::ConnectTarget { target, source }),
        Err(_) => Err(Error::ConnectTimeout { target, timeout }),
    }
}

/// Completes when a reset cut happens after `generation`.
async fn reset_cut(mut state: watch::Receiver<LinkState>, generation: u64) {
    if state
        .wait_for(|state| state.reset_generation != generation)
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}

/// Closes `stream` with a RST instead of a FIN, so its peer sees the
/// connection reset rather than ended.
fn abort(stream: TcpStream) {
    if let Err(error) = stream.set_zero_linger() {
        debug!(%error, "cannot set SO_LINGER to zero; closing with FIN");
    }
    drop(stream);
}
