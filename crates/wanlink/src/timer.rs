//! Sub-millisecond sleeps.
//!
//! tokio's timer wheel ticks in whole milliseconds and rounds every deadline
//! up, so a `sleep_until` overshoots by about 1 ms (p90 1.6 ms measured on a
//! two-core machine). On a link that sleeps once per direction that adds
//! 2-3 ms to every round trip. [`PreciseTimer`] instead keeps its deadlines
//! in a heap on one dedicated thread that waits on a condition variable
//! (overshoot under 0.2 ms) and wakes each waiting task through a oneshot
//! channel.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How a relayed direction waits for a chunk's delivery time.
#[derive(Debug, Clone)]
pub(crate) enum Timer {
    /// tokio's own timer: millisecond resolution, but it follows
    /// `tokio::time::pause()`, which the deterministic tests need. Also the
    /// fallback if the timer thread cannot be started.
    Tokio,
    /// The dedicated timer thread.
    Precise(PreciseTimer),
}

impl Timer {
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        match self {
            Self::Tokio => tokio::time::sleep_until(deadline).await,
            Self::Precise(timer) => timer.sleep_until(deadline).await,
        }
    }
}

/// A handle to the timer thread. The thread stops when the
/// [`TimerThread`] that started it is dropped; sleeps still pending then
/// end at once.
#[derive(Debug, Clone)]
pub(crate) struct PreciseTimer {
    shared: Arc<Shared>,
}

/// Owns the timer thread and stops it on drop.
#[derive(Debug)]
pub(crate) struct TimerThread {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Queue {
    /// Earliest deadline first; the sequence number keeps equal deadlines
    /// apart without comparing senders.
    deadlines: BinaryHeap<Reverse<(std::time::Instant, u64)>>,
    wakers: std::collections::HashMap<u64, oneshot::Sender<()>>,
    next_seq: u64,
    stopped: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue stays consistent even if a holder panicked.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TimerThread {
    /// Starts the thread and returns it with a handle for sleeping.
    pub(crate) fn start() -> io::Result<(Self, PreciseTimer)> {
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("wanlink-timer".to_owned())
            .spawn(move || run(&worker))?;
        let timer = PreciseTimer {
            shared: Arc::clone(&shared),
        };
        Ok((Self { shared }, timer))
    }
}

impl Drop for TimerThread {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.stopped = true;
        queue.wakers.clear();
        drop(queue);
        self.shared.changed.notify_one();
    }
}

impl PreciseTimer {
    /// Completes at `deadline`, give or take a tenth of a millisecond, or at
    /// once when the timer thread has stopped.
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        let deadline = deadline.into_std();
        if deadline <= std::time::Instant::now() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut queue = self.shared.lock();
            if queue.stopped {
                return;
            }
            let seq = queue.next_seq;
            queue.next_seq += 1;
            let earliest = queue
                .deadlines
                .peek()
                .is_none_or(|Reverse((first, _))| deadline < *first);
            queue.deadlines.push(Reverse((deadline, seq)));
            queue.wakers.insert(seq, tx);
            if earliest {
                self.shared.changed.notify_one();
            }
        }
        // An error means the thread stopped and dropped our sender.
        let _ = rx.await;
    }
}

fn run(shared: &Shared) {
    let mut queue = shared.lock();
    loop {
        if queue.stopped {
            return;
        }
        let now = std::time::Instant::now();
        match queue.deadlines.peek().copied() {
            None => {
                queue = shared
                    .changed
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            Some(Reverse((deadline, seq))) if deadline <= now => {
                queue.deadlines.pop();
                if let Some(waker) = queue.wakers.remove(&seq) {
                    // The sleeper may have given up; nothing to do then.
                    let _ = waker.send(());
                }
            }
            Some(Reverse((deadline, _))) => {
                queue = shared
                    .changed
                    .wait_timeout(queue, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn sleeps_end_at_their_deadlines_in_order() -> io::Result<()> {
        let (_thread, timer) = TimerThread::start()?;
        let start = Instant::now();
        let (a, b, c) = tokio::join!(
            async {
                timer.sleep_until(start + Duration::from_millis(30)).await;
                Instant::now()
            },
            async {
                timer.sleep_until(start + Duration::from_millis(10)).await;
                Instant::now()
            },
            async {
                timer.sleep_until(start).await;
                Instant::now()
            },
        );
        assert!(c <= b && b <= a);
        assert!(b >= start + Duration::from_millis(10));
        assert!(a >= start + Duration::from_millis(30));
        Ok(())
    }

    #[tokio::test]
    async fn stopping_the_thread_ends_pending_sleeps() -> io::Result<()> {
        let (thread, timer) = TimerThread::start()?;
        let far = Instant::now() + Duration::from_secs(3600);
        let sleeper = tokio::spawn(async move { timer.sleep_until(far).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(thread);
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        Ok(())
    }
}
