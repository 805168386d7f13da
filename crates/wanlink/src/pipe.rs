//! One direction of one relayed connection.
//!
//! A transmitter reads chunks from the sending side, stamps each with the
//! link time at which it may be delivered ([`Transmitter::schedule`]) and
//! queues it; a deliverer waits for that time and writes the chunk to the
//! receiving side. Bytes read but not yet written count against an in-flight
//! budget, so a sender that outruns the link stalls in its own socket buffer
//! instead of in our memory.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::clock::Transmitter;
use crate::config::{Direction, MAX_CHUNK};
use crate::state::LinkState;
use crate::timer::Timer;

/// Most chunks queued per direction. The byte budget is the real bound; this
/// only caps the bookkeeping when a sender trickles tiny writes.
const QUEUE_SLOTS: usize = 4096;

/// A chunk on its way across the link. An empty chunk stands for the
/// sender's end of stream.
struct Segment {
    data: Vec<u8>,
    deliver_at: Duration,
    /// Returns the chunk's bytes to the in-flight budget once delivered.
    _budget: Option<OwnedSemaphorePermit>,
}

/// Relays `reader` to `writer` as `direction` of the link, each chunk
/// queued for serialisation in `transmitter` (shared by every connection of
/// the link), until the reader's end of stream has been delivered (then
/// `writer` is shut down) or either side fails. Delivered bytes are added to `delivered`; `timer` waits for
/// each chunk's delivery time.
pub(crate) async fn relay_direction<R, W>(
    reader: R,
    writer: W,
    direction: Direction,
    state: watch::Receiver<LinkState>,
    timer: &Timer,
    transmitter: &Mutex<Transmitter>,
    delivered: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let budget_bytes = state
        .borrow()
        .config
        .direction(direction)
        .in_flight_budget();
    let budget = Arc::new(Semaphore::new(budget_bytes));
    let (queue_tx, queue_rx) = mpsc::channel(QUEUE_SLOTS);
    let transmit = transmit(
        reader,
        queue_tx,
        direction,
        state.clone(),
        transmitter,
        budget,
        budget_bytes,
    );
    let deliver = deliver(writer, queue_rx, state, timer, delivered);
    tokio::try_join!(transmit, deliver).map(|((), ())| ())
}

async fn transmit<R>(
    mut reader: R,
    queue: mpsc::Sender<Segment>,
    direction: Direction,
    state: watch::Receiver<LinkState>,
    transmitter: &Mutex<Transmitter>,
    budget: Arc<Semaphore>,
    budget_bytes: usize,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
{
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        let chunk_size = state
            .borrow()
            .config
            .direction(direction)
            .read_chunk_size()
            .min(budget_bytes);
        let n = reader.read(&mut buf[..chunk_size]).await?;
        let permit = if n == 0 {
            None
        } else {
            let permits = u32::try_from(n).map_err(io::Error::other)?;
            let permit = Arc::clone(&budget)
                .acquire_many_owned(permits)
                .await
                .map_err(io::Error::other)?;
            Some(permit)
        };
        let deliver_at = {
            let state = state.borrow();
            let arrival = state.clock.link_time(Instant::now());
            transmitter
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .schedule(arrival, n, state.config.direction(direction))
        };
        let segment = Segment {
            data: buf[..n].to_vec(),
            deliver_at,
            _budget: permit,
        };
        // A closed queue means the deliverer failed; `try_join!` reports that.
        if queue.send(segment).await.is_err() || n == 0 {
            return Ok(());
        }
    }
}

async fn deliver<W>(
    mut writer: W,
    mut queue: mpsc::Receiver<Segment>,
    mut state: watch::Receiver<LinkState>,
    timer: &Timer,
    delivered: &AtomicU64,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    while let Some(segment) = queue.recv().await {
        wait_for_link_time(&mut state, timer, segment.deliver_at).await;
        if segment.data.is_empty() {
            writer.shutdown().await?;
            return Ok(());
        }
        writer.write_all(&segment.data).await?;
        delivered.fetch_add(segment.data.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Waits until link time reaches `at`. While the link is blackholed the clock
/// is frozen and this waits for a restore.
async fn wait_for_link_time(state: &mut watch::Receiver<LinkState>, timer: &Timer, at: Duration) {
    loop {
        let deadline = state.borrow_and_update().clock.wall_deadline(at);
        match deadline {
            Some(deadline) if deadline <= Instant::now() => return,
            Some(deadline) => {
                tokio::select! {
                    () = timer.sleep_until(deadline) => {}
                    changed = state.changed() => {
                        if changed.is_err() {
                            // The link is gone; nothing will move the clock again.
                            timer.sleep_until(deadline).await;
                            return;
                        }
                    }
                }
            }
            None => {
                if state.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::*;
    use crate::config::{CutMode, DirectionConfig, LinkConfig};

    const MS: Duration = Duration::from_millis(1);

    /// A direction from `sender` to `receiver` through a relay task, with
    /// virtual time.
    struct Harness {
        sender: DuplexStream,
        receiver: DuplexStream,
        state: watch::Sender<LinkState>,
        delivered: Arc<AtomicU64>,
        relay: tokio::task::JoinHandle<io::Result<()>>,
    }

    fn harness(upstream: DirectionConfig, socket_buffer: usize) -> Harness {
        let config = LinkConfig {
            upstream,
            ..LinkConfig::default()
        };
        let (state, state_rx) = watch::channel(LinkState::new(config, Instant::now()));
        let (sender, relay_in) = duplex(socket_buffer);
        let (relay_out, receiver) = duplex(socket_buffer);
        let delivered = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&delivered);
        let relay = tokio::spawn(async move {
            let timer = Timer::Tokio;
            let transmitter = Mutex::default();
            relay_direction(
                relay_in,
                relay_out,
                Direction::Upstream,
                state_rx,
                &timer,
                &transmitter,
                &counter,
            )
            .await
        });
        Harness {
            sender,
            receiver,
            state,
            delivered,
            relay,
        }
    }

    /// Reads exactly `n` bytes and returns how long after `start` the last
    /// one arrived.
    async fn read_exactly(receiver: &mut DuplexStream, n: usize, start: Instant) -> Duration {
        let mut buf = vec![0u8; n];
        receiver.read_exact(&mut buf).await.expect("read");
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn small_write_arrives_after_one_way_delay() {
        let mut h = harness(DirectionConfig::new(20 * MS, None), 1 << 16);
        let start = Instant::now();
        h.sender.write_all(b"ping").await.expect("write");
        let took = read_exactly(&mut h.receiver, 4, start).await;
        assert!(took >= 20 * MS && took <= 21 * MS, "took {took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn bulk_write_is_paced_at_the_rate() {
        // 8 Mbit/s is one byte per microsecond: 200 000 bytes take 200 ms.
        let mut h = harness(DirectionConfig::new(5 * MS, Some(8_000_000)), 1 << 20);
        let data = vec![7u8; 200_000];
        let start = Instant::now();
        let writer = tokio::spawn(async move {
            h.sender.write_all(&data).await.expect("write");
            h.sender
        });
        let took = read_exactly(&mut h.receiver, 200_000, start).await;
        assert!(took >= 205 * MS && took <= 207 * MS, "took {took:?}");
        assert_eq!(h.delivered.load(Ordering::Relaxed), 200_000);
        drop(writer.await);
    }

    #[tokio::test(start_paused = true)]
    async fn end_of_stream_is_delayed_and_ends_the_relay() {
        let mut h = harness(DirectionConfig::new(10 * MS, None), 1 << 16);
        let start = Instant::now();
        h.sender.write_all(b"last words").await.expect("write");
        h.sender.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        h.receiver.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"last words");
        assert!(start.elapsed() >= 10 * MS);
        h.relay.await.expect("join").expect("relay");
    }

    #[tokio::test(start_paused = true)]
    async fn blackhole_holds_bytes_and_restore_releases_them() {
        let mut h = harness(DirectionConfig::new(20 * MS, None), 1 << 16);
        h.sender.write_all(b"before").await.expect("write");
        tokio::time::sleep(5 * MS).await;
        h.state
            .send_modify(|s| s.cut(CutMode::Blackhole, Instant::now()));
        h.sender.write_all(b"during").await.expect("write");

        let mut buf = [0u8; 12];
        let stalled =
            tokio::time::timeout(Duration::from_secs(10), h.receiver.read(&mut buf)).await;
        assert!(stalled.is_err(), "delivered while blackholed");

        let restored_at = Instant::now();
        h.state.send_modify(|s| s.restore(Instant::now()));
        h.receiver.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"beforeduring");
        // "before" had 15 ms of its delay left; "during" all 20 ms.
        let took = restored_at.elapsed();
        assert!(took >= 20 * MS && took <= 21 * MS, "took {took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_receiver_back_pressures_the_sender() {
        let direction = DirectionConfig::new(10 * MS, Some(80_000_000));
        let budget = direction.in_flight_budget();
        let socket_buffer = 4096;
        let h = harness(direction, socket_buffer);
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let mut sender = h.sender;
        let _writer = tokio::spawn(async move {
            let block = [1u8; 1024];
            loop {
                sender.write_all(&block).await.expect("write");
                counter.fetch_add(block.len(), Ordering::Relaxed);
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        let accepted = accepted.load(Ordering::Relaxed);
        let bound = budget + direction.read_chunk_size() + 3 * socket_buffer + 1024;
        assert!(
            accepted <= bound,
            "sender got {accepted} bytes in, bound {bound}"
        );
        assert!(accepted >= budget, "sender got only {accepted} bytes in");
        drop(h.receiver);
    }
}
