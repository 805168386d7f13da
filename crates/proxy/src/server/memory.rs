//! One memory budget for what the server edge holds for its clients, across
//! all connections of all listeners: call records read and not yet done
//! with, and replies not yet written.
//!
//! A call is charged when its record has been read: the record and the
//! largest reply it may get (a READ's count, a READDIR's; see
//! [`crate::front::FrontEnd::reply_size_hint`]); once its reply exists, the reply's
//! real size instead; all of it is given back when the reply has been
//! written (or dropped).
//!
//! The budget is shared by tenants ([`gvfs_nfs::Tenant`]: a TLS peer's
//! certificate name, else the connection), not by connections, so opening
//! more connections earns a client nothing. Before reading its next call a
//! connection needs room: its tenant's charge below the tenant's share and
//! the total below the budget. A tenant's share is the budget divided among
//! the busy tenants (those holding bytes, and the one asking), and at least
//! two of the largest calls: a tenant alone may use the whole budget, two
//! busy tenants half each. A connection that holds nothing may always read
//! one call, so every client is served even while others fill the budget;
//! the total can thus pass the budget by at most one call per connection.
//! That is the backpressure: a client that does not read its replies leaves
//! them unwritten and its charge up, so its connections are not read from,
//! and its calls wait in its own sockets, until it reads.
//!
//! A record still coming in is not charged: a connection has at most one,
//! capped at the record size ([`gvfs_nfs::record::RecordLimits`]) and timed
//! by the record timeout, and connections are bounded in number.
//!
//! Charges are atomics (and a [`Notify`] per connection and per tenant, and
//! one shared by connections waiting for room): nothing locks per call. The
//! table of tenants is locked when a connection is served and when a
//! tenant's last connection closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use gvfs_nfs::Tenant;
use tokio::sync::Notify;

/// How often a connection waiting for room looks again, besides being
/// woken when memory is given back.
const RECHECK: Duration = Duration::from_millis(50);

/// The budget all connections share.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    /// The least share of a tenant: two of the largest calls.
    least_share: u64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Tenants holding bytes now.
    busy: AtomicUsize,
    /// Times a connection stopped reading for want of room.
    throttled: gvfs_nfs::layer::Counter,
    /// Connections waiting for room.
    waiting: AtomicUsize,
    freed: Notify,
    /// The tenants with a connection served now.
    tenants: Mutex<HashMap<Tenant, Weak<TenantMemory>>>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes; one tenant may hold all of it while
    /// alone, a fair part of it when not, and at least `2 * largest_call`.
    pub fn new(limit: u64, largest_call: u64) -> Self {
        Self {
            limit,
            least_share: 2 * largest_call,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            throttled: gvfs_nfs::layer::Counter::default(),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// The budget, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes held at once so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Times a connection stopped reading because it (or all of them) held
    /// too much.
    pub fn throttled(&self) -> u64 {
        self.throttled.get()
    }

    /// Tenants holding bytes now.
    pub fn busy_tenants(&self) -> u64 {
        self.busy.load(Ordering::Relaxed) as u64
    }

    /// The most bytes one tenant holds now.
    pub fn largest_tenant(&self) -> u64 {
        let live: Vec<Arc<TenantMemory>> = {
            let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
            tenants.values().filter_map(Weak::upgrade).collect()
        };
        // Dropped after the lock: the last reference to a tenant whose
        // connection just closed takes the lock to leave the table.
        live.iter()
            .map(|t| t.used.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// The memory of `tenant`, shared by all its connections.
    pub(crate) fn tenant(self: &Arc<Self>, tenant: Tenant) -> Arc<TenantMemory> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = tenants.get(&tenant).and_then(Weak::upgrade) {
            return t;
        }
        let t = Arc::new(TenantMemory {
            budget: self.clone(),
            tenant,
            used: AtomicU64::new(0),
            freed: Notify::new(),
        });
        tenants.insert(tenant, Arc::downgrade(&t));
        t
    }

    /// The share of a tenant holding `held` bytes now.
    fn share(&self, held: u64) -> u64 {
        let busy = self.busy.load(Ordering::Acquire) + usize::from(held == 0);
        (self.limit / busy.max(1) as u64).max(self.least_share)
    }

    fn charge(&self, bytes: u64) {
        let total = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if total > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(total, Ordering::Relaxed);
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// One tenant's part of the budget, shared by its connections; leaves the
/// table when its last connection closes.
#[derive(Debug)]
pub(crate) struct TenantMemory {
    budget: Arc<MemoryBudget>,
    tenant: Tenant,
    used: AtomicU64,
    freed: Notify,
}

impl TenantMemory {
    fn charge(&self, bytes: u64) {
        if bytes > 0 && self.used.fetch_add(bytes, Ordering::AcqRel) == 0 {
            self.budget.busy.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn release(&self, bytes: u64) {
        if bytes > 0 && self.used.fetch_sub(bytes, Ordering::AcqRel) == bytes {
            self.budget.busy.fetch_sub(1, Ordering::AcqRel);
        }
        self.freed.notify_waiters();
    }

    /// Whether the tenant holds its share or more.
    fn over_share(&self) -> bool {
        let held = self.used.load(Ordering::Acquire);
        held > 0 && held >= self.budget.share(held)
    }
}

impl Drop for TenantMemory {
    fn drop(&mut self) {
        let mut tenants = self
            .budget
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A new connection of the same tenant may have put a fresh entry
        // in its place already.
        if tenants
            .get(&self.tenant)
            .is_some_and(|w| w.strong_count() == 0)
        {
            tenants.remove(&self.tenant);
        }
    }
}

/// One connection's part of the budget.
#[derive(Debug)]
pub(crate) struct ConnMemory {
    budget: Arc<MemoryBudget>,
    /// Its tenant, known once the connection is served (after a TLS
    /// handshake names the peer).
    tenant: OnceLock<Arc<TenantMemory>>,
    used: AtomicU64,
    freed: Notify,
}

impl ConnMemory {
    pub(crate) fn new(budget: Arc<MemoryBudget>) -> Self {
        Self {
            budget,
            tenant: OnceLock::new(),
            used: AtomicU64::new(0),
            freed: Notify::new(),
        }
    }

    /// Bills the connection's calls to `tenant` from now on (once: the
    /// first tenant stays).
    pub(crate) fn attach(&self, tenant: Tenant) {
        let _ = self.tenant.get_or_init(|| self.budget.tenant(tenant));
    }

    /// Whether anything is charged to this connection: calls running or
    /// replies unwritten.
    pub(crate) fn busy(&self) -> bool {
        self.used.load(Ordering::Acquire) > 0
    }

    /// Charges `bytes`, given back when the charge drops.
    pub(crate) fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        if let Some(t) = self.tenant.get() {
            t.charge(bytes);
        }
        self.budget.charge(bytes);
        Charge {
            mem: self.clone(),
            bytes,
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(t) = self.tenant.get() {
            t.release(bytes);
        }
        self.budget.release(bytes);
        // An atomic store unless the reader waits on it.
        self.freed.notify_one();
    }

    /// Whether the connection must wait before reading another call.
    fn blocked(&self) -> bool {
        if self.used.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.tenant.get().is_some_and(|t| t.over_share())
            || self.budget.used.load(Ordering::SeqCst) >= self.budget.limit
    }

    /// Waits until the connection may read another call: woken when it,
    /// its tenant or any connection gives memory back (a tenant going idle
    /// grows the others' shares).
    pub(crate) async fn room(&self) {
        if !self.blocked() {
            return;
        }
        self.budget.throttled.inc();
        // Counted while this waits, however the wait ends (a closing
        // connection drops it mid-way).
        let _waiting = Waiting::new(&self.budget.waiting);
        loop {
            let mine = self.freed.notified();
            let all = self.budget.freed.notified();
            let tenant = self.tenant.get().map(|t| t.freed.notified());
            tokio::pin!(mine, all);
            mine.as_mut().enable();
            all.as_mut().enable();
            let mut tenant = tenant.map(Box::pin);
            if let Some(t) = tenant.as_mut() {
                t.as_mut().enable();
            }
            // Looked at after announcing the wait, so a release in between
            // is not missed.
            if !self.blocked() {
                break;
            }
            let of_tenant = async {
                match tenant {
                    Some(t) => t.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut mine => {}
                () = &mut all => {}
                () = of_tenant => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

/// One count in a waiters' counter while alive.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes charged to a connection until dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    mem: Arc<ConnMemory>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.mem.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn conn(budget: &Arc<MemoryBudget>, tenant: u64) -> Arc<ConnMemory> {
        let c = Arc::new(ConnMemory::new(budget.clone()));
        c.attach(Tenant(tenant));
        c
    }

    /// Whether `c` may read a call within a second (paused time).
    async fn may_read(c: &ConnMemory) -> bool {
        tokio::time::timeout(Duration::from_secs(1), c.room())
            .await
            .is_ok()
    }

    /// Charges `c` a MiB at a time while it may read; returns the charges.
    async fn fill(c: &Arc<ConnMemory>) -> Vec<Charge> {
        let mut held = Vec::new();
        while may_read(c).await {
            held.push(c.charge(MIB));
            assert!(held.len() < 1000, "never stopped");
        }
        held
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_alone_gets_the_whole_budget_and_goes_on_when_given_back() {
        let budget = Arc::new(MemoryBudget::new(64 * MIB, MIB));
        let c = conn(&budget, 1);
        let mut held = fill(&c).await;
        assert_eq!(held.len(), 64, "a tenant alone stopped short of the budget");
        assert_eq!(budget.throttled(), 1);
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.room().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "read beyond the budget");
        held.pop();
        waiter.await.unwrap();
        drop(held);
        assert_eq!((budget.used(), budget.peak()), (0, 64 * MIB));
        assert_eq!((budget.busy_tenants(), budget.largest_tenant()), (0, 0));
        assert!(!c.busy());
    }

    #[tokio::test(start_paused = true)]
    async fn two_busy_tenants_get_half_each_and_more_connections_earn_nothing() {
        let budget = Arc::new(MemoryBudget::new(64 * MIB, MIB));
        let a = conn(&budget, 1);
        let first = a.charge(MIB);
        // Tenant 2 has four connections; tenant 1 asks for room as well.
        let b: Vec<_> = (0..4).map(|_| conn(&budget, 2)).collect();
        let mut held_b = Vec::new();
        for c in b.iter().cycle().take(400) {
            if !may_read(c).await {
                continue;
            }
            held_b.push(c.charge(MIB));
        }
        assert_eq!(budget.busy_tenants(), 2);
        assert_eq!(
            held_b.len(),
            32,
            "a second tenant's share is half the budget"
        );
        let held_a = fill(&a).await;
        assert_eq!(held_a.len() + 1, 32, "the first tenant's share");
        assert_eq!(budget.largest_tenant(), 32 * MIB);
        // Once tenant 2 is idle, tenant 1 may have the rest.
        drop(held_b);
        let more = fill(&a).await;
        assert_eq!(held_a.len() + more.len() + 1, 64);
        drop((first, held_a, more));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_stops_busy_connections_but_serves_an_empty_one() {
        let budget = Arc::new(MemoryBudget::new(8 * MIB, MIB));
        let hogs: Vec<Arc<ConnMemory>> = (0..4).map(|t| conn(&budget, t)).collect();
        // Each at its share (2 MiB), and together at the budget.
        let held: Vec<Charge> = hogs.iter().map(|h| h.charge(2 * MIB)).collect();
        assert!(!may_read(&hogs[0]).await, "a hog read past its share");
        // A fifth tenant under its share still waits: the budget is full.
        let polite = conn(&budget, 9);
        let one = polite.charge(MIB / 2);
        let p = polite.clone();
        let waiter = tokio::spawn(async move { p.room().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "read with the budget full");
        // A connection holding nothing is served anyway, of any tenant.
        for t in [0, 10] {
            let idle = conn(&budget, t);
            tokio::time::timeout(Duration::from_millis(1), idle.room())
                .await
                .expect("an empty connection waited");
        }
        // Memory given back by another tenant wakes the waiter.
        drop(held);
        waiter.await.unwrap();
        drop(one);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_tenant_leaves_the_table_with_its_last_connection() {
        let budget = Arc::new(MemoryBudget::new(8 * MIB, MIB));
        let (a, b) = (conn(&budget, 5), conn(&budget, 5));
        assert_eq!(budget.tenants.lock().unwrap().len(), 1);
        drop(a);
        assert_eq!(budget.tenants.lock().unwrap().len(), 1);
        drop(b);
        assert!(budget.tenants.lock().unwrap().is_empty());
    }
}
