//! The order a proxy's requests to its upstream leave in: a gate in front
//! of the RPC client that admits them by class ([`Class`]), shares each
//! class fairly among tenants ([`Tenant`]), and keeps the lower classes to
//! about two bandwidth-delay products of the link in flight, so that a
//! demand fetch never queues behind more than that.
//!
//! The rules, applied whenever a request comes, one ends or a ticket is
//! raised:
//!
//! - **Demand** is admitted at once. While several tenants are active (a
//!   request queued or in flight), each has at most
//!   `max(`[`MIN_DEMAND_PER_TENANT`]`, `[`DEMAND_SHARE`]` / active)` demand
//!   calls in flight.
//! - **The lower classes** (profile, background, bulk) go highest class
//!   first. Within a class, tenants take turns by deficit round robin over
//!   estimated wire bytes, with a quantum of one chunk's estimate (or the
//!   request's, if larger), so a tenant queueing four times as many
//!   requests gets no more bytes than the others.
//! - A lower-class request is admitted only if the lower-class bytes in
//!   flight plus its estimate stay within the cap, or if no lower-class
//!   request is in flight at all (so one larger than the cap still goes).
//!   - `estimate = raw × ratio`, where `ratio` is a moving average of
//!     wire/raw bytes over ended requests, starting at [`FIRST_RATIO`];
//!   - `cap = clamp(`[`CAP_GAIN`]` × rate × min_rtt + one chunk's estimate,
//!     `[`MIN_CAP`]`, `[`MAX_CAP`]`)`, from the link the RPC client
//!     measures ([`Link`]). The gain of 2 is BBR's: a full link and room to
//!     measure more; the chunk more lets a rate measured under the cap
//!     grow (the least round trip is a small call's, shorter than a
//!     chunk's).
//! - **While a guest waits or is about to** (a demand or profile call in
//!   flight, or an NFS call a client waits for on the same link,
//!   [`Link::foreground`], or one seen in the last [`URGENT_HOLD`]),
//!   background and bulk requests are admitted only while every class's
//!   bytes in flight stay within one BDP and one part's estimate (or if no
//!   lower-class request is in flight at all), and [`Gate::part`] tells
//!   their callers to ask in parts of about [`PART_TIME`] on the link (at
//!   least [`MIN_PART`]; only across a link of [`PART_MIN_RTT`] or more). Demand and profile then have the link, and a
//!   demand reply or an NFS call queues behind about a part at its
//!   bottleneck, not two BDPs and a chunk (docs/BENCHMARKS.md, "The
//!   neighbour, looked into": a learned lazy clone's faults beside a
//!   neighbour's copy waited about 190 ms each behind the copy's bytes in
//!   flight). The profile keeps the wide cap: its runs are what the guest
//!   faults on next.
//! - While several tenants are active, each has at most
//!   `max(`[`MIN_LOW_PER_TENANT`]`, `[`LOW_SHARE`]` / active)` lower-class
//!   requests in flight. A tenant alone gets everything.
//! - A raised [`Ticket`] moves its queued request to the back of its new
//!   class's queue.
//!
//! The gate holds no request itself: [`Gate::admit`] waits for a turn and
//! returns a [`Permit`], which the caller ends with [`Permit::done`] and the
//! wire bytes of the reply, or drops (an error) to release its estimate.
//! Every queue is bounded by its callers: one entry per waiting
//! [`Gate::admit`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gvfs_nfs::{Class, Tenant};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::proto::CHUNK;

mod link;
mod ticket;

pub use link::{FixedLink, Link};
pub use ticket::Ticket;

/// The least cap on lower-class bytes in flight: about one compressed
/// chunk, whatever the link.
pub const MIN_CAP: u64 = 512 << 10;
/// The most cap on lower-class bytes in flight.
pub const MAX_CAP: u64 = 16 << 20;
/// The cap is this many bandwidth-delay products.
pub const CAP_GAIN: u64 = 2;
/// The wire/raw ratio assumed before any request has ended.
pub const FIRST_RATIO: f64 = 0.5;
/// The weight of each ended request in the ratio's moving average.
const RATIO_WEIGHT: f64 = 1.0 / 8.0;
/// The ratio's bounds: a chunk of repeats sends next to nothing, an
/// incompressible one a little more than its bytes.
const RATIO_BOUNDS: (f64, f64) = (1.0 / 64.0, 1.5);
/// How long after a demand or profile call the tighter cap on background
/// and bulk holds (a guest's faults come in bursts a little apart).
pub const URGENT_HOLD: Duration = Duration::from_secs(1);
/// About how long one part of a background or bulk chunk takes on the
/// link while a guest waits: what a demand reply may queue behind.
pub const PART_TIME: Duration = Duration::from_millis(20);
/// The least part (raw bytes), a multiple of every piece size.
pub const MIN_PART: u32 = 64 << 10;
/// Chunks are asked for in parts only across a link of at least this
/// round trip (a WAN). Across a shorter one a demand reply waits little
/// behind a chunk anyway, the rate measured in its first round trips is
/// not worth cutting by, and whole chunks keep one FETCH each and their
/// frame for the next proxy.
pub const PART_MIN_RTT: Duration = Duration::from_millis(10);
/// Demand calls in flight shared among active tenants...
pub const DEMAND_SHARE: usize = 64;
/// ...but each may have at least this many.
pub const MIN_DEMAND_PER_TENANT: usize = 4;
/// Lower-class calls in flight shared among active tenants...
pub const LOW_SHARE: usize = 96;
/// ...but each may have at least this many.
pub const MIN_LOW_PER_TENANT: usize = 2;

gvfs_nfs::counters! {
    /// What the gate counts for one class.
    pub struct ClassCounters => ClassCounts {
        /// Requests that were not admitted at once.
        waits,
        /// Microseconds requests waited in all.
        wait_micros,
        /// Raw bytes of the requests admitted.
        admitted_bytes,
    }
}

/// The gate's counters (`status.upstream_client.gate`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GateStats {
    /// Bulk requests.
    pub bulk: ClassCounts,
    /// Background requests.
    pub background: ClassCounts,
    /// Profile requests.
    pub profile: ClassCounts,
    /// Demand requests.
    pub demand: ClassCounts,
    /// Estimated wire bytes of lower-class requests in flight now.
    pub low_in_flight_bytes: u64,
    /// The cap on them now (on profile requests; background and bulk
    /// get `urgent_cap_bytes` while a guest waits).
    pub cap_bytes: u64,
    /// The cap on every class's bytes in flight that background and bulk
    /// are admitted within while a guest waits.
    pub urgent_cap_bytes: u64,
    /// The raw bytes a background or bulk request should ask for at most
    /// now ([`Gate::part`]).
    pub part_bytes: u64,
    /// Requests waiting now.
    pub queued: u64,
}

/// What an admitted request holds of the gate.
#[derive(Debug, Clone, Copy)]
struct Charge {
    class: Class,
    tenant: Tenant,
    raw: u32,
    est: u64,
}

/// A request waiting for its turn.
struct Waiter {
    ticket: Arc<Ticket>,
    raw: u32,
    est: u64,
    /// The class whose queue holds it.
    queued_as: Class,
    since: Instant,
    grant: oneshot::Sender<Charge>,
}

/// One tenant's requests of one lower class, and its deficit.
#[derive(Default)]
struct TenantQueue {
    waiting: VecDeque<u64>,
    /// Estimated bytes it may still be admitted this turn.
    deficit: u64,
    /// Whether its turn has begun (the quantum is given once a turn).
    in_turn: bool,
}

/// One lower class: its tenants in turn order, and their queues.
#[derive(Default)]
struct ClassQueue {
    ring: VecDeque<Tenant>,
    queues: HashMap<Tenant, TenantQueue>,
}

/// A tenant's requests queued and in flight; it is active while any is.
#[derive(Debug, Default, Clone, Copy)]
struct Load {
    queued: usize,
    demand: usize,
    low: usize,
}

struct GateState {
    next_id: u64,
    waiters: HashMap<u64, Waiter>,
    demand: VecDeque<u64>,
    /// Bulk, background and profile, by `Class as usize`.
    low: [ClassQueue; 3],
    tenants: HashMap<Tenant, Load>,
    low_bytes: u64,
    low_calls: usize,
    ratio: f64,
    /// Estimated wire bytes of demand calls in flight.
    demand_bytes: u64,
    /// Demand and profile calls in flight, all tenants'.
    urgent_calls: usize,
    /// When the last demand or profile call was admitted or ended.
    urgent_seen: Option<Instant>,
}

struct Shared {
    state: Mutex<GateState>,
    link: Box<dyn Link>,
    counters: [ClassCounters; 4],
}

/// Admits requests to the upstream by class and tenant (see the module
/// doc). Cheap to clone; clones share the gate.
///
/// A fetch asks before its call, with the raw bytes it asks for, and says
/// how many bytes crossed the wire after it:
///
/// ```
/// use std::sync::Arc;
/// use gvfs_ext::gate::{Gate, Ticket};
/// # async fn call(count: u32) -> Result<Vec<u8>, ()> { Ok(vec![0; count as usize / 2]) }
///
/// async fn fetch(gate: &Gate, ticket: &Arc<Ticket>, count: u32) -> Result<Vec<u8>, ()> {
///     // Before the call: wait for a turn, with the raw bytes asked for.
///     let permit = gate.admit(ticket, count).await;
///     // An error drops the permit, which releases its estimate.
///     let reply = call(count).await?;
///     // After it: the bytes that crossed the wire teach the estimate.
///     permit.done(reply.len() as u64);
///     Ok(reply)
/// }
/// ```
///
/// The ticket is the fetch's own (`Ticket::new(class, tenant)`) or one
/// shared with others waiting for the same bytes, who may raise it.
#[derive(Clone)]
pub struct Gate {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("stats", &self.stats())
            .finish()
    }
}

/// An admitted request: end it with [`done`](Self::done), or drop it.
#[must_use = "a permit holds its bytes until it is done or dropped"]
pub struct Permit {
    shared: Arc<Shared>,
    charge: Option<Charge>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("charge", &self.charge)
            .finish()
    }
}

impl Permit {
    /// The class it was admitted as.
    pub fn class(&self) -> Option<Class> {
        self.charge.map(|c| c.class)
    }

    /// The request ended with `wire` bytes on the wire: its bytes leave
    /// the gate, and the wire/raw ratio learns from it.
    pub fn done(mut self, wire: u64) {
        if let Some(c) = self.charge.take() {
            self.shared.release(c, Some(wire));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(c) = self.charge.take() {
            self.shared.release(c, None);
        }
    }
}

/// A waiter's place in the queue, given up if its `admit` is dropped.
struct Queued<'a> {
    shared: &'a Shared,
    id: u64,
    grant: oneshot::Receiver<Charge>,
    settled: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = self.shared.lock();
        if st.unqueue(self.id).is_some() {
            self.shared.dispatch(&mut st);
        } else if let Ok(charge) = self.grant.try_recv() {
            // Admitted, but nobody took the permit.
            drop(st);
            self.shared.release(charge, None);
        }
    }
}

impl Gate {
    /// A gate over `link`.
    pub fn new(link: impl Link) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(GateState {
                    next_id: 0,
                    waiters: HashMap::new(),
                    demand: VecDeque::new(),
                    low: Default::default(),
                    tenants: HashMap::new(),
                    low_bytes: 0,
                    low_calls: 0,
                    ratio: FIRST_RATIO,
                    demand_bytes: 0,
                    urgent_calls: 0,
                    urgent_seen: None,
                }),
                link: Box::new(link),
                counters: Default::default(),
            }),
        }
    }

    /// Waits for the turn of a request of `raw` bytes under `ticket`.
    pub async fn admit(&self, ticket: &Arc<Ticket>, raw: u32) -> Permit {
        let shared = &*self.shared;
        let raised = ticket.raised.notified();
        tokio::pin!(raised);
        // Listening before the class is read: a raise after it wakes us.
        raised.as_mut().enable();
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = shared.lock();
            let class = ticket.class();
            let id = st.enqueue(ticket.clone(), raw, tx);
            shared.dispatch(&mut st);
            if st.waiters.contains_key(&id) {
                shared.counters[class as usize].waits.inc();
            }
            id
        };
        let mut queued = Queued {
            shared,
            id,
            grant: rx,
            settled: false,
        };
        loop {
            tokio::select! {
                got = &mut queued.grant => {
                    queued.settled = true;
                    return Permit {
                        shared: self.shared.clone(),
                        // The gate drops a waiter's sender only when it
                        // grants it; a gate gone admits.
                        charge: got.ok(),
                    };
                }
                () = &mut raised => {
                    raised.set(ticket.raised.notified());
                    raised.as_mut().enable();
                    let mut st = shared.lock();
                    st.requeue(id, ticket.class());
                    shared.dispatch(&mut st);
                }
            }
        }
    }

    /// The cap on lower-class bytes in flight now (profile requests'; see
    /// [`GateStats::urgent_cap_bytes`] for the others').
    pub fn cap(&self) -> u64 {
        self.shared.cap()
    }

    /// The most raw bytes a background or bulk request should ask for
    /// now: a whole chunk, or, while a guest waits (see the module doc) on
    /// a link where a chunk takes longer than [`PART_TIME`], a part that
    /// takes about that long (a multiple of [`MIN_PART`]).
    pub fn part(&self) -> u32 {
        let st = self.shared.lock();
        self.shared.part_at(&st, Instant::now())
    }

    /// The gate's counters and gauges.
    pub fn stats(&self) -> GateStats {
        let c = &self.shared.counters;
        let st = self.shared.lock();
        let now = Instant::now();
        GateStats {
            bulk: c[Class::Bulk as usize].snapshot(),
            background: c[Class::Background as usize].snapshot(),
            profile: c[Class::Profile as usize].snapshot(),
            demand: c[Class::Demand as usize].snapshot(),
            low_in_flight_bytes: st.low_bytes,
            cap_bytes: self.shared.cap_at(st.ratio),
            urgent_cap_bytes: self.shared.urgent_cap_at(&st, now),
            part_bytes: u64::from(self.shared.part_at(&st, now)),
            queued: st.waiters.len() as u64,
        }
    }
}

/// Whether `seen` is within [`URGENT_HOLD`] of `now`.
fn held(seen: Option<Instant>, now: Instant) -> bool {
    seen.is_some_and(|t| now.saturating_duration_since(t) < URGENT_HOLD)
}

/// One chunk's estimated wire bytes at wire/raw ratio `ratio`.
fn chunk_estimate(ratio: f64) -> u64 {
    ((f64::from(CHUNK) * ratio) as u64).max(1)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cap(&self) -> u64 {
        let ratio = self.lock().ratio;
        self.cap_at(ratio)
    }

    /// The cap with wire/raw ratio `ratio`: two BDPs and one chunk's
    /// estimate more. The rate is measured from the traffic the cap lets
    /// through, and a chunk's round trip is longer than the least round
    /// trip (its transfer, the server's time, a cascade's far link); without
    /// that chunk more, a cap of less than two chunks would measure a rate
    /// that keeps it there.
    fn cap_at(&self, ratio: f64) -> u64 {
        let bdp = self.link.estimate().map_or(0, |e| e.bdp());
        bdp.saturating_mul(CAP_GAIN)
            .saturating_add(chunk_estimate(ratio))
            .clamp(MIN_CAP, MAX_CAP)
    }

    /// The cap on all bytes in flight that background and bulk are
    /// admitted within while a guest waits: one BDP (a full link) and one
    /// part's estimate.
    fn urgent_cap_at(&self, st: &GateState, now: Instant) -> u64 {
        let bdp = self.link.estimate().map_or(0, |e| e.bdp());
        let part = st.estimate(self.part_at(st, now));
        bdp.saturating_add(part).clamp(part, MAX_CAP)
    }

    /// Whether a guest waits or is about to: a demand or profile call in
    /// flight, or an NFS call on the link ([`Link::foreground`]), or one
    /// seen within [`URGENT_HOLD`].
    fn urgent(&self, st: &GateState, now: Instant) -> bool {
        let (calls, seen) = self.link.foreground();
        st.urgent(now) || calls > 0 || held(seen, now)
    }

    /// [`Gate::part`] under the lock.
    fn part_at(&self, st: &GateState, now: Instant) -> u32 {
        let Some(link) = self
            .link
            .estimate()
            .filter(|e| e.min_rtt >= PART_MIN_RTT && self.urgent(st, now))
        else {
            return CHUNK;
        };
        let wire = u128::from(link.rate) * PART_TIME.as_micros() / 1_000_000;
        let raw = (wire as f64 / st.ratio) as u64;
        let raw = u32::try_from(raw).unwrap_or(CHUNK);
        (raw / MIN_PART * MIN_PART).clamp(MIN_PART, CHUNK)
    }

    fn release(&self, c: Charge, wire: Option<u64>) {
        let mut st = self.lock();
        if c.class == Class::Demand {
            st.demand_bytes = st.demand_bytes.saturating_sub(c.est);
        }
        if c.class >= Class::Profile {
            st.urgent_calls = st.urgent_calls.saturating_sub(1);
            st.urgent_seen = Some(Instant::now());
        }
        if let Some(load) = st.tenants.get_mut(&c.tenant) {
            if c.class == Class::Demand {
                load.demand = load.demand.saturating_sub(1);
            } else {
                load.low = load.low.saturating_sub(1);
            }
        }
        st.forget_idle(c.tenant);
        if c.class != Class::Demand {
            st.low_bytes = st.low_bytes.saturating_sub(c.est);
            st.low_calls = st.low_calls.saturating_sub(1);
        }
        if let Some(wire) = wire
            && c.raw > 0
        {
            let sample = (wire as f64 / f64::from(c.raw)).clamp(RATIO_BOUNDS.0, RATIO_BOUNDS.1);
            st.ratio += RATIO_WEIGHT * (sample - st.ratio);
        }
        self.dispatch(&mut st);
    }

    /// Admits every request the rules let go now.
    fn dispatch(&self, st: &mut GateState) {
        let active = st.tenants.len();
        let several = active > 1;
        let now = Instant::now();
        let demand_limit = if several {
            MIN_DEMAND_PER_TENANT.max(DEMAND_SHARE / active)
        } else {
            usize::MAX
        };
        let mut i = 0;
        while let Some(&id) = st.demand.get(i) {
            let tenant = st.waiters[&id].ticket.tenant();
            if st.tenants.get(&tenant).map_or(0, |l| l.demand) < demand_limit {
                st.demand.remove(i);
                self.grant(st, id, Class::Demand, now);
            } else {
                i += 1;
            }
        }
        let low_limit = if several {
            MIN_LOW_PER_TENANT.max(LOW_SHARE / active)
        } else {
            usize::MAX
        };
        let wide = self.cap_at(st.ratio);
        // While a guest waits, background and bulk fill only what demand
        // and profile leave of one BDP and a part.
        let narrow = self
            .urgent(st, now)
            .then(|| self.urgent_cap_at(st, now).min(wide));
        let quantum = chunk_estimate(st.ratio);
        for class in [Class::Profile, Class::Background, Class::Bulk] {
            let (cap, demand) = match narrow {
                Some(narrow) if class != Class::Profile => (narrow, st.demand_bytes),
                _ => (wide, 0),
            };
            // Tenants passed over in a row because of their own limit.
            let mut passed = 0;
            loop {
                let q = &mut st.low[class as usize];
                let Some(&tenant) = q.ring.front() else {
                    break;
                };
                if passed >= q.ring.len() {
                    break;
                }
                if st.tenants.get(&tenant).map_or(0, |l| l.low) >= low_limit {
                    q.ring.rotate_left(1);
                    passed += 1;
                    continue;
                }
                let Some(tq) = q.queues.get_mut(&tenant) else {
                    q.ring.pop_front();
                    continue;
                };
                let Some(&id) = tq.waiting.front() else {
                    q.queues.remove(&tenant);
                    q.ring.pop_front();
                    continue;
                };
                let est = st.waiters[&id].est;
                if !tq.in_turn {
                    tq.in_turn = true;
                    tq.deficit += quantum.max(est);
                }
                if est > tq.deficit {
                    // Its turn is over.
                    tq.in_turn = false;
                    q.ring.rotate_left(1);
                    passed = 0;
                    continue;
                }
                if st.low_calls > 0 && st.low_bytes + demand + est > cap {
                    // Full: nothing of this class or below goes.
                    return;
                }
                tq.waiting.pop_front();
                tq.deficit -= est;
                if tq.waiting.is_empty() {
                    q.queues.remove(&tenant);
                    q.ring.pop_front();
                }
                passed = 0;
                self.grant(st, id, class, now);
            }
        }
    }

    /// Admits waiter `id` as `class` (already out of its queue).
    fn grant(&self, st: &mut GateState, id: u64, class: Class, now: Instant) {
        let Some(w) = st.waiters.remove(&id) else {
            return;
        };
        let tenant = w.ticket.tenant();
        let load = st.tenants.entry(tenant).or_default();
        load.queued = load.queued.saturating_sub(1);
        if class == Class::Demand {
            load.demand += 1;
            st.demand_bytes += w.est;
        } else {
            load.low += 1;
            st.low_bytes += w.est;
            st.low_calls += 1;
        }
        if class >= Class::Profile {
            st.urgent_calls += 1;
            st.urgent_seen = Some(now);
        }
        let counters = &self.counters[class as usize];
        counters.admitted_bytes.add(u64::from(w.raw));
        let waited = now.saturating_duration_since(w.since);
        counters
            .wait_micros
            .add(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
        w.ticket.admitted.store(true, Ordering::Release);
        let charge = Charge {
            class,
            tenant,
            raw: w.raw,
            est: w.est,
        };
        if let Err(charge) = w.grant.send(charge) {
            // Its admit was dropped between our lock and its own.
            let load = st.tenants.entry(tenant).or_default();
            if class == Class::Demand {
                load.demand -= 1;
                st.demand_bytes -= charge.est;
            } else {
                load.low -= 1;
                st.low_bytes -= charge.est;
                st.low_calls -= 1;
            }
            if class >= Class::Profile {
                st.urgent_calls -= 1;
            }
            st.forget_idle(tenant);
        }
    }
}

impl GateState {
    fn estimate(&self, raw: u32) -> u64 {
        ((f64::from(raw) * self.ratio).ceil() as u64).max(1)
    }

    /// Whether a demand or profile call is in flight or was seen within
    /// [`URGENT_HOLD`].
    fn urgent(&self, now: Instant) -> bool {
        self.urgent_calls > 0 || held(self.urgent_seen, now)
    }

    /// Queues a request; returns its id.
    fn enqueue(&mut self, ticket: Arc<Ticket>, raw: u32, grant: oneshot::Sender<Charge>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let class = ticket.class();
        let tenant = ticket.tenant();
        self.tenants.entry(tenant).or_default().queued += 1;
        let est = self.estimate(raw);
        self.waiters.insert(
            id,
            Waiter {
                ticket,
                raw,
                est,
                queued_as: class,
                since: Instant::now(),
                grant,
            },
        );
        self.push(id, class, tenant);
        id
    }

    fn push(&mut self, id: u64, class: Class, tenant: Tenant) {
        if class == Class::Demand {
            self.demand.push_back(id);
            return;
        }
        let q = &mut self.low[class as usize];
        let tq = q.queues.entry(tenant).or_insert_with(|| {
            q.ring.push_back(tenant);
            TenantQueue::default()
        });
        tq.waiting.push_back(id);
    }

    /// Takes waiter `id` out of its class's queue (it stays a waiter).
    fn take_out(&mut self, id: u64) -> Option<(Class, Tenant)> {
        let w = self.waiters.get(&id)?;
        let (class, tenant) = (w.queued_as, w.ticket.tenant());
        if class == Class::Demand {
            self.demand.retain(|&d| d != id);
        } else {
            let q = &mut self.low[class as usize];
            if let Some(tq) = q.queues.get_mut(&tenant) {
                tq.waiting.retain(|&d| d != id);
                if tq.waiting.is_empty() {
                    q.queues.remove(&tenant);
                    q.ring.retain(|&t| t != tenant);
                }
            }
        }
        Some((class, tenant))
    }

    /// Moves waiter `id` to `class`'s queue, if that is higher.
    fn requeue(&mut self, id: u64, class: Class) {
        if self.waiters.get(&id).is_none_or(|w| w.queued_as >= class) {
            return;
        }
        if let Some((_, tenant)) = self.take_out(id) {
            if let Some(w) = self.waiters.get_mut(&id) {
                w.queued_as = class;
            }
            self.push(id, class, tenant);
        }
    }

    /// Drops waiter `id` (its admit was dropped); `None` if it is not
    /// waiting (admitted already).
    fn unqueue(&mut self, id: u64) -> Option<()> {
        let (_, tenant) = self.take_out(id)?;
        self.waiters.remove(&id);
        if let Some(load) = self.tenants.get_mut(&tenant) {
            load.queued = load.queued.saturating_sub(1);
        }
        self.forget_idle(tenant);
        Some(())
    }

    /// Forgets `tenant` if it has nothing queued or in flight.
    fn forget_idle(&mut self, tenant: Tenant) {
        if let Some(l) = self.tenants.get(&tenant)
            && l.queued == 0
            && l.demand == 0
            && l.low == 0
        {
            self.tenants.remove(&tenant);
        }
    }
}

#[cfg(test)]
#[path = "gate/tests.rs"]
mod tests;
