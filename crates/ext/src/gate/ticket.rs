//! Who a request is for and how much it matters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use gvfs_nfs::{Class, Tenant};
use tokio::sync::Notify;

/// Who a request is for and how much it matters, shared by everyone who
/// waits for the same fetch: a waiter that matters more raises it, and
/// its request, still queued, moves up.
#[derive(Debug)]
pub struct Ticket {
    class: AtomicU8,
    tenant: Tenant,
    pub(super) admitted: AtomicBool,
    pub(super) raised: Notify,
}

impl Ticket {
    /// A ticket of `class`, billed to `tenant`.
    pub fn new(class: Class, tenant: Tenant) -> Arc<Self> {
        Arc::new(Self {
            class: AtomicU8::new(class as u8),
            tenant,
            admitted: AtomicBool::new(false),
            raised: Notify::new(),
        })
    }

    /// Its class now.
    pub fn class(&self) -> Class {
        let n = self.class.load(Ordering::Acquire);
        Class::ALL[usize::from(n).min(Class::ALL.len() - 1)]
    }

    /// Whom it is billed to.
    pub fn tenant(&self) -> Tenant {
        self.tenant
    }

    /// Whether a request of it has been admitted.
    pub fn admitted(&self) -> bool {
        self.admitted.load(Ordering::Acquire)
    }

    /// Raises it to `class` (never lowers it); a request of it still
    /// queued moves to that class's queue.
    pub fn raise(&self, class: Class) {
        let before = self.class.fetch_max(class as u8, Ordering::AcqRel);
        if before < class as u8 {
            self.raised.notify_waiters();
        }
    }
}
