//! The replies of one connection waiting to be written, highest class
//! first ([`gvfs_nfs::Class`]): a FETCH a reader waits for leaves before
//! the background chunks queued ahead of it; within a class, replies leave
//! in the order they were finished.
//!
//! The connection's calls push their replies, its writer pops them. The
//! queue is bounded by what its entries carry: each holds its call's
//! in-flight permit until written, so a connection has at most twice
//! `max_in_flight` calls running, waiting and queued together. Reordering
//! happens only while replies wait here, not once in the socket's buffer.
//! (`TCP_NOTSENT_LOWAT` on TLS sockets, to keep that buffer small, stalled
//! TLS connections for the RPC client's 30 s retransmit: taken out.)

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use gvfs_nfs::Class;
use tokio::sync::Notify;

struct Queues<T> {
    /// By class, lowest first.
    by_class: [VecDeque<T>; Class::ALL.len()],
    /// Handles that may still push.
    senders: usize,
    /// The writer is gone: nothing more is taken.
    closed: bool,
}

struct Shared<T> {
    queues: Mutex<Queues<T>>,
    /// Wakes the writer: a reply was pushed, or the last sender left.
    ready: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Queues<T>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Pushes replies (one handle per call, and one for the reader).
pub(crate) struct ReplySender<T> {
    shared: Arc<Shared<T>>,
}

/// Pops replies, highest class first; the connection's writer.
pub(crate) struct ReplyReceiver<T> {
    shared: Arc<Shared<T>>,
}

/// A queue of replies for one connection.
pub(crate) fn reply_queue<T>() -> (ReplySender<T>, ReplyReceiver<T>) {
    let shared = Arc::new(Shared {
        queues: Mutex::new(Queues {
            by_class: Default::default(),
            senders: 1,
            closed: false,
        }),
        ready: Notify::new(),
    });
    (
        ReplySender {
            shared: shared.clone(),
        },
        ReplyReceiver { shared },
    )
}

impl<T> ReplySender<T> {
    /// Queues `reply` in `class`; gives it back if the writer is gone.
    pub(crate) fn push(&self, class: Class, reply: T) -> Result<(), T> {
        let mut q = self.shared.lock();
        if q.closed {
            return Err(reply);
        }
        q.by_class[class as usize].push_back(reply);
        drop(q);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Whether the writer is gone (it gave up on a write).
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }
}

impl<T> Clone for ReplySender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for ReplySender<T> {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.senders -= 1;
        let last = q.senders == 0;
        drop(q);
        if last {
            self.shared.ready.notify_one();
        }
    }
}

impl<T> ReplyReceiver<T> {
    /// The next reply, highest class first; `None` once every sender is
    /// gone and the queue is empty.
    pub(crate) async fn pop(&mut self) -> Option<T> {
        loop {
            // Enabled before looking, so a push in between is not missed.
            let ready = self.shared.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut q = self.shared.lock();
                if let Some(r) = q.by_class.iter_mut().rev().find_map(VecDeque::pop_front) {
                    return Some(r);
                }
                if q.senders == 0 {
                    return None;
                }
            }
            ready.await;
        }
    }
}

impl<T> Drop for ReplyReceiver<T> {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.closed = true;
        // Dropped outside the lock: an entry gives back its permit and its
        // memory charge.
        let left = std::mem::take(&mut q.by_class);
        drop(q);
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_leave_highest_class_first_in_order_within_a_class() {
        let (tx, mut rx) = reply_queue();
        let pushed = [
            (Class::Background, 1),
            (Class::Bulk, 2),
            (Class::Demand, 3),
            (Class::Background, 4),
            (Class::Profile, 5),
            (Class::Demand, 6),
        ];
        for (class, n) in pushed {
            tx.push(class, n).unwrap();
        }
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(rx.pop().await.unwrap());
        }
        // A demand reply finished later still overtakes those waiting.
        tx.push(Class::Demand, 7).unwrap();
        let late = tx.clone();
        drop(tx);
        late.push(Class::Bulk, 8).unwrap();
        drop(late);
        while let Some(n) = rx.pop().await {
            out.push(n);
        }
        assert_eq!(out, [3, 6, 5, 7, 1, 4, 2, 8]);
    }

    #[tokio::test]
    async fn the_writer_waits_for_a_reply_and_ends_with_the_last_sender() {
        let (tx, mut rx) = reply_queue::<u32>();
        let call = tx.clone();
        let writer = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(n) = rx.pop().await {
                got.push(n);
            }
            got
        });
        tokio::task::yield_now().await;
        call.push(Class::Demand, 1).unwrap();
        drop(call);
        tokio::task::yield_now().await;
        assert!(!writer.is_finished(), "ended while a sender was left");
        drop(tx);
        assert_eq!(writer.await.unwrap(), [1]);
    }

    #[test]
    fn a_gone_writer_refuses_replies_and_drops_those_queued() {
        let (tx, rx) = reply_queue();
        let held = Arc::new(());
        tx.push(Class::Bulk, held.clone()).unwrap();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(Arc::strong_count(&held), 1, "a queued reply was kept");
        assert!(tx.push(Class::Demand, held.clone()).is_err());
    }
}
