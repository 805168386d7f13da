//! The tokio edge of the front end: accepts connections, reads records,
//! runs calls concurrently and writes replies.
//!
//! Bounded everywhere: at most `max_connections` connections (further
//! clients wait in the kernel's accept queue), at most `max_in_flight` calls
//! per connection (the reader stops reading while that many run), a bounded
//! reply queue, and record caps enforced before allocation. On shutdown the
//! listener stops, readers stop taking new calls, calls in flight finish and
//! their replies are written, within the drain deadline.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gvfs_nfs::record::RecordLimits;
use gvfs_nfs::rpc::ReplyRecord;
use gvfs_nfs::stream::{RecordStream, StreamError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::front::FrontEnd;

/// Limits of the server edge.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Calls in flight per connection.
    pub max_in_flight: usize,
    /// Caps on incoming records.
    pub records: RecordLimits,
    /// A connection with no complete record for this long is closed.
    pub idle_timeout: Duration,
    /// Longest wait for one reply write before the connection is dropped.
    pub write_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_in_flight: 64,
            records: RecordLimits::for_payload(gvfs_nfs::proc::MAX_DATA),
            idle_timeout: Duration::from_secs(3600),
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// Connection counters.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Connections closed for exceeding a record cap.
    pub oversized: AtomicU64,
}

/// Serves `front` on `listener` until `shutdown` is cancelled, then drains
/// in-flight calls (tracked by `tasks`) and returns.
pub async fn serve(
    listener: TcpListener,
    front: Arc<FrontEnd>,
    limits: ServerLimits,
    stats: Arc<ServerStats>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let conns = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = conns.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (front, stats, shutdown) = (front.clone(), stats.clone(), shutdown.clone());
        let conn_tasks = tasks.clone();
        tasks.spawn(async move {
            stats.accepted.fetch_add(1, Ordering::Relaxed);
            stats.open.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "connection opened");
            serve_connection(
                stream,
                Some(peer),
                front,
                limits,
                &stats,
                shutdown,
                conn_tasks,
            )
            .await;
            stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(%peer, "connection closed");
            drop(permit);
        });
    }
}

/// Serves one connection until EOF, an error, or shutdown.
pub async fn serve_connection<S>(
    stream: S,
    peer: Option<SocketAddr>,
    front: Arc<FrontEnd>,
    limits: ServerLimits,
    stats: &ServerStats,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    let (reply_tx, mut reply_rx) = mpsc::channel::<ReplyRecord>(limits.max_in_flight.max(1));
    let write_timeout = limits.write_timeout;
    let writer = tokio::spawn(async move {
        while let Some(rec) = reply_rx.recv().await {
            match tokio::time::timeout(write_timeout, write_record(&mut wr, rec)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
        let _ = wr.shutdown().await;
    });

    let mut records = RecordStream::new(rd, limits.records);
    loop {
        let rec = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = tokio::time::timeout(limits.idle_timeout, records.next()) => match r {
                Ok(Ok(Some(rec))) => rec,
                Ok(Ok(None)) => break,
                Ok(Err(StreamError::Record(e))) => {
                    stats.oversized.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(?peer, error = %e, "closing connection");
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(?peer, error = %e, "connection ended");
                    break;
                }
                Err(_) => {
                    tracing::debug!(?peer, "idle connection closed");
                    break;
                }
            },
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (front, tx) = (front.clone(), reply_tx.clone());
        tasks.spawn(async move {
            if let Some(reply) = front.handle(&rec, peer).await {
                let _ = tx.send(reply).await;
            }
            drop(permit);
        });
    }
    // Let calls in flight finish and queue their replies, then close.
    drop(reply_tx);
    let _ = writer.await;
}

/// Writes one reply record with as few system calls as the stream allows
/// (one `writev` for a TCP socket), without first joining its parts.
async fn write_record<W: AsyncWrite + Unpin>(wr: &mut W, rec: ReplyRecord) -> std::io::Result<()> {
    if !wr.is_write_vectored() {
        return wr.write_all(&rec.into_vec()).await;
    }
    let parts = rec.parts();
    let (total, mut done) = (rec.len(), 0);
    while done < total {
        let mut skip = done;
        let mut bufs = [IoSlice::new(&[]); 3];
        let mut n = 0;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            bufs[n] = IoSlice::new(&p[skip..]);
            skip = 0;
            n += 1;
        }
        match wr.write_vectored(&bufs[..n]).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            w => done += w,
        }
    }
    Ok(())
}
