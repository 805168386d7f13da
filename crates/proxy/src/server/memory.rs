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
//! Before reading its next call a connection needs room: its own charge
//! below its share (a quarter of the budget, at least two of the largest
//! calls) and the total below the budget. A connection that holds nothing
//! may always read one call, so every client is served even while others
//! fill the budget; the total can thus pass the budget by at most one call
//! per connection. That is the backpressure: a client that does not read
//! its replies leaves them unwritten and its charge up, so its connection
//! is not read from, and its calls wait in its own socket, until it reads.
//!
//! A record still coming in is not charged: a connection has at most one,
//! capped at the record size ([`gvfs_nfs::record::RecordLimits`]) and timed
//! by the record timeout, and connections are bounded in number.
//!
//! Everything here is atomics (and a [`Notify`] per connection, and one
//! shared only by connections waiting for room): nothing locks per call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How often a connection waiting for room in the shared budget looks
/// again, besides being woken when memory is given back.
const RECHECK: Duration = Duration::from_millis(50);

/// The budget all connections share.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    share: u64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Times a connection stopped reading for want of room.
    throttled: gvfs_nfs::layer::Counter,
    /// Connections waiting for the total to fall.
    waiting: AtomicUsize,
    freed: Notify,
}

impl MemoryBudget {
    /// A budget of `limit` bytes; one connection may hold a quarter of it,
    /// and at least `2 * largest_call`.
    pub fn new(limit: u64, largest_call: u64) -> Self {
        Self {
            limit,
            share: (limit / 4).max(2 * largest_call),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            throttled: gvfs_nfs::layer::Counter::default(),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
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
}

/// One connection's part of the budget.
#[derive(Debug)]
pub(crate) struct ConnMemory {
    budget: Arc<MemoryBudget>,
    used: AtomicU64,
    freed: Notify,
}

impl ConnMemory {
    pub(crate) fn new(budget: Arc<MemoryBudget>) -> Self {
        Self {
            budget,
            used: AtomicU64::new(0),
            freed: Notify::new(),
        }
    }

    /// Whether anything is charged to this connection: calls running or
    /// replies unwritten.
    pub(crate) fn busy(&self) -> bool {
        self.used.load(Ordering::Acquire) > 0
    }

    /// Charges `bytes`, given back when the charge drops.
    pub(crate) fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        let total = self.budget.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if total > self.budget.peak.load(Ordering::Relaxed) {
            self.budget.peak.fetch_max(total, Ordering::Relaxed);
        }
        Charge {
            mem: self.clone(),
            bytes,
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.budget.used.fetch_sub(bytes, Ordering::AcqRel);
        // An atomic store unless the reader waits on it.
        self.freed.notify_one();
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.freed.notify_waiters();
        }
    }

    /// `None` when the connection may read another call; else whether it
    /// waits for the shared budget (true) or for its own share (false).
    fn blocked(&self) -> Option<bool> {
        let mine = self.used.load(Ordering::Acquire);
        if mine == 0 {
            return None;
        }
        if mine >= self.budget.share {
            return Some(false);
        }
        (self.budget.used.load(Ordering::SeqCst) >= self.budget.limit).then_some(true)
    }

    /// Waits until the connection may read another call.
    pub(crate) async fn room(&self) {
        if self.blocked().is_none() {
            return;
        }
        self.budget.throttled.inc();
        loop {
            let mine = self.freed.notified();
            let all = self.budget.freed.notified();
            tokio::pin!(mine, all);
            mine.as_mut().enable();
            all.as_mut().enable();
            let Some(shared) = self.blocked() else {
                return;
            };
            if shared {
                self.budget.waiting.fetch_add(1, Ordering::SeqCst);
                // Looked at again after announcing the wait, so a release
                // in between is not missed.
                if self.blocked() == Some(true) {
                    tokio::select! {
                        () = &mut mine => {}
                        () = &mut all => {}
                        () = tokio::time::sleep(RECHECK) => {}
                    }
                }
                self.budget.waiting.fetch_sub(1, Ordering::SeqCst);
            } else {
                mine.await;
            }
        }
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

    #[tokio::test(start_paused = true)]
    async fn a_connection_stops_at_its_share_and_goes_on_when_given_back() {
        let budget = Arc::new(MemoryBudget::new(64 * MIB, MIB));
        let conn = Arc::new(ConnMemory::new(budget.clone()));
        let mut held: Vec<Charge> = (0..16).map(|_| conn.charge(MIB)).collect();
        assert_eq!(budget.used(), 16 * MIB);
        let c = conn.clone();
        let waiter = tokio::spawn(async move { c.room().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "read beyond its share");
        assert_eq!(budget.throttled(), 1);
        held.pop();
        waiter.await.unwrap();
        drop(held);
        assert_eq!((budget.used(), budget.peak()), (0, 16 * MIB));
        assert!(!conn.busy());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_stops_busy_connections_but_serves_an_idle_one() {
        let budget = Arc::new(MemoryBudget::new(8 * MIB, MIB));
        let hogs: Vec<Arc<ConnMemory>> = (0..4)
            .map(|_| Arc::new(ConnMemory::new(budget.clone())))
            .collect();
        // Each at its share (2 MiB), and together at the budget.
        let held: Vec<Charge> = hogs.iter().map(|h| h.charge(2 * MIB)).collect();
        // One under its share still waits: the budget is full.
        let polite = Arc::new(ConnMemory::new(budget.clone()));
        let one = polite.charge(MIB / 2);
        let p = polite.clone();
        let waiter = tokio::spawn(async move { p.room().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "read with the budget full");
        // A connection holding nothing is served anyway.
        let idle = ConnMemory::new(budget.clone());
        tokio::time::timeout(Duration::from_millis(1), idle.room())
            .await
            .expect("an idle connection waited");
        // Memory given back by another connection wakes the waiter.
        drop(held);
        waiter.await.unwrap();
        drop(one);
        assert_eq!(budget.used(), 0);
    }
}
