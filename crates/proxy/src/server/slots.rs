//! The connections of one listener: who holds a slot, which connection
//! gives way when a pool is full, and the log line that says so.
//!
//! A new connection is *pending* until it has sent its first complete call
//! (a plain port) or finished its TLS handshake (a TLS port, or STARTTLS);
//! then it is *served*. The two pools have budgets of their own:
//!
//! - At most `max_pending` pending connections. One more closes the oldest
//!   pending one, so sockets that connect and send nothing, half a record,
//!   or never finish a handshake cannot keep a new client out, and never
//!   take a served connection's place. (Each is closed anyway when its
//!   first-call or handshake timeout runs out.)
//! - At most `max_served` served connections. A connection ready to be
//!   served when the pool is full closes the served connection idle longest
//!   (no call running, no reply waiting to be written; longest since its
//!   last complete call). If every one is busy, it waits for a free slot.
//!
//! Evictions are counted in [`ServerStats`] and logged at WARN, at most one
//! line per kind every [`LOG_EVERY`] (with the number left out since).
//!
//! The table is locked when a connection opens, moves to the served pool or
//! closes: never per call. A call touches only its own connection's
//! [`ConnState`] atomics.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::memory::{Charge, ConnMemory, MemoryBudget};
use super::stats::ServerStats;

/// At most one log line of each kind this often.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);
/// How often a connection waiting for a served slot looks again for an
/// idle one to close (a slot freed wakes it at once).
const RECHECK: Duration = Duration::from_millis(100);

/// What the table and the connection's own tasks share about it.
#[derive(Debug)]
pub(crate) struct ConnState {
    addr: SocketAddr,
    /// Its id at this listener, in order of arrival.
    id: u64,
    epoch: Instant,
    opened: Instant,
    /// What its calls and replies hold of the memory budget: more than
    /// nothing while a call runs or a reply waits to be written.
    memory: Arc<ConnMemory>,
    /// When it was last active (served, or a complete call came in), in
    /// milliseconds after `epoch`.
    active: AtomicU64,
    /// Whether a complete call has come in.
    called: AtomicBool,
    /// Cancelled to close the connection: evicted, or shutdown (a child of
    /// the shutdown token).
    close: CancellationToken,
}

impl ConnState {
    fn new(
        addr: SocketAddr,
        id: u64,
        epoch: Instant,
        budget: &Arc<MemoryBudget>,
        shutdown: &CancellationToken,
    ) -> Self {
        Self {
            addr,
            id,
            epoch,
            opened: Instant::now(),
            memory: Arc::new(ConnMemory::new(budget.clone())),
            active: AtomicU64::new(0),
            called: AtomicBool::new(false),
            close: shutdown.child_token(),
        }
    }

    /// The peer's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its id at this listener.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Cancelled when the connection must close (evicted or shutdown).
    pub(crate) fn close(&self) -> &CancellationToken {
        &self.close
    }

    /// Its part of the memory budget.
    pub(crate) fn memory(&self) -> &Arc<ConnMemory> {
        &self.memory
    }

    /// A complete call came in, holding `bytes` (its record and the
    /// largest reply it may get) until the charge drops.
    pub(crate) fn call_started(&self, bytes: u64) -> Charge {
        self.touch();
        if !self.called.load(Ordering::Relaxed) {
            self.called.store(true, Ordering::Relaxed);
        }
        self.memory.charge(bytes)
    }

    /// Whether a complete call has come in on it.
    pub(crate) fn has_called(&self) -> bool {
        self.called.load(Ordering::Relaxed)
    }

    /// Whether calls are running or replies waiting to be written.
    pub(crate) fn busy(&self) -> bool {
        self.memory.busy()
    }

    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.active.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self, now: Instant) -> Duration {
        let since = now.saturating_duration_since(self.epoch);
        since.saturating_sub(Duration::from_millis(self.active.load(Ordering::Relaxed)))
    }
}

/// Rate limit of one kind of log line.
#[derive(Debug, Default)]
struct LogGate {
    last: Option<Instant>,
    held: u64,
}

impl LogGate {
    /// `Some(lines held back since the last one)` when a line may go out.
    fn pass(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < LOG_EVERY => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

/// The next connection id, across listeners: one per connection in the
/// process, from 1 (0 is [`Tenant::LOCAL`](gvfs_nfs::Tenant::LOCAL), the
/// tenant a plain connection's id stands for).
static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Default)]
struct Table {
    /// By id, which is by age: the first is the oldest.
    pending: BTreeMap<u64, Arc<ConnState>>,
    served: HashMap<u64, Arc<ConnState>>,
    pending_log: LogGate,
    idle_log: LogGate,
    wait_log: LogGate,
}

/// The connection table of one listener (see the module docs).
#[derive(Debug)]
pub(crate) struct Slots {
    max_served: usize,
    max_pending: usize,
    epoch: Instant,
    table: Mutex<Table>,
    /// Woken when a served slot frees.
    freed: Notify,
    stats: Arc<ServerStats>,
    budget: Arc<MemoryBudget>,
}

/// What [`Slots::try_serve`] found.
enum Promotion {
    Served,
    Full,
    /// The connection was closed meanwhile (evicted from pending).
    Gone,
}

impl Slots {
    pub(crate) fn new(
        max_served: usize,
        max_pending: usize,
        stats: Arc<ServerStats>,
        budget: Arc<MemoryBudget>,
    ) -> Self {
        Self {
            budget,
            max_served: max_served.max(1),
            max_pending: max_pending.max(1),
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
            freed: Notify::new(),
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new connection from `addr` as pending, closing the oldest
    /// pending one if there are `max_pending` already. Never waits.
    pub(crate) fn admit(self: &Arc<Self>, addr: SocketAddr, shutdown: &CancellationToken) -> Slot {
        let mut t = self.lock();
        let id = NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState::new(addr, id, self.epoch, &self.budget, shutdown));
        if t.pending.len() >= self.max_pending
            && let Some((_, oldest)) = t.pending.pop_first()
        {
            oldest.close.cancel();
            self.stats.counts.evicted_pending.inc();
            let now = Instant::now();
            if let Some(more) = t.pending_log.pass(now) {
                tracing::warn!(
                    limit = self.max_pending,
                    closed = %oldest.addr,
                    age_ms = now.saturating_duration_since(oldest.opened).as_millis() as u64,
                    more,
                    "too many connections not yet through their first call or TLS handshake: \
                     closed the oldest to admit a new one"
                );
            }
        }
        t.pending.insert(id, state.clone());
        self.stats
            .pending
            .store(t.pending.len() as u64, Ordering::Relaxed);
        drop(t);
        Slot {
            slots: self.clone(),
            id,
            state,
        }
    }

    fn try_serve(&self, id: u64) -> Promotion {
        let mut t = self.lock();
        let Some(state) = t.pending.get(&id).cloned() else {
            return Promotion::Gone;
        };
        if t.served.len() >= self.max_served {
            let now = Instant::now();
            let victim = t
                .served
                .iter()
                .filter(|(_, c)| !c.busy())
                .max_by_key(|(id, c)| (c.idle_for(now), std::cmp::Reverse(**id)))
                .map(|(id, _)| *id);
            let Some(victim) = victim.and_then(|v| t.served.remove(&v)) else {
                return Promotion::Full;
            };
            victim.close.cancel();
            self.stats.counts.evicted_idle.inc();
            if let Some(more) = t.idle_log.pass(now) {
                tracing::warn!(
                    limit = self.max_served,
                    closed = %victim.addr,
                    idle_secs = victim.idle_for(now).as_secs(),
                    for_peer = %state.addr,
                    more,
                    "connection limit reached: closed the connection idle longest to serve a new one"
                );
            }
        }
        t.pending.remove(&id);
        state.touch();
        t.served.insert(id, state);
        self.stats
            .pending
            .store(t.pending.len() as u64, Ordering::Relaxed);
        Promotion::Served
    }
}

/// A connection's place in the table; gives it up when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    state: Arc<ConnState>,
}

impl Slot {
    /// The connection's shared state.
    pub(crate) fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// Moves the connection to the served pool, closing the one idle
    /// longest if the pool is full, else waiting for a slot. False if the
    /// connection was closed meanwhile (evicted from pending, or shutdown).
    pub(crate) async fn serve(&self) -> bool {
        let mut waited = false;
        loop {
            let freed = self.slots.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.slots.try_serve(self.id) {
                Promotion::Served => return true,
                Promotion::Gone => return false,
                Promotion::Full => {}
            }
            if !waited {
                waited = true;
                self.slots.stats.counts.slot_waits.inc();
                let pass = self.slots.lock().wait_log.pass(Instant::now());
                if let Some(more) = pass {
                    tracing::warn!(
                        limit = self.slots.max_served,
                        peer = %self.state.addr,
                        more,
                        "connection limit reached and every connection is busy: a new one waits for a free slot"
                    );
                }
            }
            tokio::select! {
                () = self.state.close.cancelled() => return false,
                () = freed => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.slots.lock();
        let freed = t.served.remove(&self.id).is_some();
        if t.pending.remove(&self.id).is_some() {
            self.slots
                .stats
                .pending
                .store(t.pending.len() as u64, Ordering::Relaxed);
        }
        drop(t);
        if freed {
            self.slots.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], n))
    }

    fn slots(served: usize, pending: usize) -> (Arc<Slots>, Arc<ServerStats>) {
        let stats = Arc::new(ServerStats::default());
        let budget = Arc::new(MemoryBudget::new(1 << 30, 1 << 20));
        (
            Arc::new(Slots::new(served, pending, stats.clone(), budget)),
            stats,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pending_pool_closes_its_oldest_member() {
        let (slots, stats) = slots(4, 2);
        let stop = CancellationToken::new();
        let a = slots.admit(addr(1), &stop);
        let b = slots.admit(addr(2), &stop);
        let c = slots.admit(addr(3), &stop);
        assert!(a.state().close().is_cancelled());
        assert!(!b.state().close().is_cancelled() && !c.state().close().is_cancelled());
        assert_eq!(stats.counts.evicted_pending.get(), 1);
        assert_eq!(stats.pending.load(Ordering::Relaxed), 2);
        // The evicted one cannot be served; the others can.
        assert!(!a.serve().await);
        assert!(c.serve().await);
        assert_eq!(stats.pending.load(Ordering::Relaxed), 1);
        drop((a, b));
        assert_eq!(stats.pending.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_served_pool_closes_the_connection_idle_longest_never_a_busy_one() {
        let (slots, stats) = slots(3, 8);
        let stop = CancellationToken::new();
        let mut served = Vec::new();
        for n in 0..3 {
            let s = slots.admit(addr(n), &stop);
            assert!(s.serve().await);
            served.push(s);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // 0 is busy (its call still runs); 1 called most recently of the
        // idle ones... after 2 is made active again, 1 is idle longest.
        let _running = served[0].state().call_started(1);
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(served[2].state().call_started(1));
        let d = slots.admit(addr(9), &stop);
        assert!(d.serve().await);
        assert!(
            !served[0].state().close().is_cancelled(),
            "closed a busy one"
        );
        assert!(
            served[1].state().close().is_cancelled(),
            "not the idle-longest"
        );
        assert!(!served[2].state().close().is_cancelled());
        assert_eq!(stats.counts.evicted_idle.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_served_connection_busy_a_new_one_waits_for_a_free_slot() {
        let (slots, stats) = slots(1, 8);
        let stop = CancellationToken::new();
        let a = slots.admit(addr(1), &stop);
        assert!(a.serve().await);
        let call = a.state().call_started(1);
        let b = slots.admit(addr(2), &stop);
        let waiting = tokio::spawn(async move {
            let ok = b.serve().await;
            (ok, b)
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "served beyond the limit");
        assert_eq!(stats.counts.slot_waits.get(), 1);
        // The call ends: `a` is idle now, and gives way.
        drop(call);
        let (ok, b) = waiting.await.unwrap();
        assert!(ok && a.state().close().is_cancelled());
        // A slot freed by a close wakes a waiter too.
        let _call = b.state().call_started(1);
        let c = slots.admit(addr(3), &stop);
        let waiting = tokio::spawn(async move { c.serve().await });
        tokio::task::yield_now().await;
        drop((a, b));
        assert!(waiting.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn log_lines_are_rate_limited() {
        let mut gate = LogGate::default();
        let t = Instant::now();
        assert_eq!(gate.pass(t), Some(0));
        assert_eq!(gate.pass(t + Duration::from_secs(1)), None);
        assert_eq!(gate.pass(t + Duration::from_secs(2)), None);
        assert_eq!(gate.pass(t + LOG_EVERY), Some(2));
    }
}
