//! A served connection's calls by class: a call a reader waits for is
//! read and run while lower-class calls fill `max_in_flight`.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gvfs_nfs::{
    BoxFuture, CallContext, Credentials, NfsReply, NfsRequest, NfsService, ServiceError,
};
use nfs3_types::nfs3::nfs_fh3;
use nfs3_types::xdr_codec::Opaque;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::*;
use crate::front::program::{Answer, Call, Program};

/// No file system: only the test's program is called.
struct NoFiles;

impl NfsService for NoFiles {
    fn describe(&self) -> String {
        "no files".into()
    }
    fn call<'a>(
        &'a self,
        _cx: &'a CallContext,
        _req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async {
            Err(ServiceError::UpstreamUnavailable {
                upstream: "none".into(),
                reason: "no files".into(),
            })
        })
    }
    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async {
            Ok(nfs_fh3 {
                data: Opaque::owned(b"root".to_vec()),
            })
        })
    }
}

const PROG: u32 = 0x4000_0123;
/// A background call: answered once the test lets it.
const HELD: u32 = 1;
/// A demand call: answered at once.
const NOW: u32 = 2;

/// Background calls wait for `open`; counts how many run at once.
struct Held {
    open: Semaphore,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl Program for Held {
    fn number(&self) -> u32 {
        PROG
    }
    fn versions(&self) -> RangeInclusive<u32> {
        1..=1
    }
    fn class(&self, _vers: u32, proc_: u32, _args: &[u8]) -> Class {
        if proc_ == HELD {
            Class::Background
        } else {
            Class::Demand
        }
    }
    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            if call.hdr.proc_ == HELD {
                let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                self.open.acquire().await.expect("never closed").forget();
                self.running.fetch_sub(1, Ordering::SeqCst);
            }
            Answer::Results(Vec::new())
        })
    }
}

/// A proxy edge serving `held` with `max_in_flight` 2; its address.
async fn serve_held(held: Arc<Held>) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let front = FrontEnd::new(Arc::new(NoFiles), "/export".into(), 2049, vec![held]);
    let shutdown = CancellationToken::new();
    let shared = Shared {
        front: Arc::new(front),
        stats: Arc::new(ServerStats::default()),
        budget: Arc::new(MemoryBudget::new(1 << 30, 1 << 20)),
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
    };
    let limits = ServerLimits {
        max_in_flight: 2,
        ..ServerLimits::default()
    };
    tokio::spawn(serve(
        listener,
        Security::Plain { starttls: None },
        limits,
        shared,
    ));
    (addr, shutdown)
}

async fn send(s: &mut TcpStream, xid: u32, proc_: u32) {
    let rec = gvfs_nfs::rpc::seal(gvfs_nfs::rpc::call_record(
        xid,
        PROG,
        1,
        proc_,
        &Credentials::None,
    ));
    s.write_all(&rec).await.unwrap();
}

/// The xid of the next reply, or `None` if none comes within `wait`.
async fn next_reply(s: &mut TcpStream, wait: Duration) -> Option<u32> {
    tokio::time::timeout(wait, async {
        let mut marker = [0; 4];
        s.read_exact(&mut marker).await.unwrap();
        let len = (u32::from_be_bytes(marker) & 0x7fff_ffff) as usize;
        let mut body = vec![0; len];
        s.read_exact(&mut body).await.unwrap();
        u32::from_be_bytes(body[..4].try_into().unwrap())
    })
    .await
    .ok()
}

fn held() -> Arc<Held> {
    Arc::new(Held {
        open: Semaphore::new(0),
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    })
}

#[tokio::test]
async fn a_demand_call_behind_a_full_connection_of_background_calls_is_answered() {
    let held = held();
    let (addr, shutdown) = serve_held(held.clone()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    for xid in 1..=3 {
        send(&mut s, xid, HELD).await;
    }
    send(&mut s, 99, NOW).await;
    // Before, the reader stopped at the third background call and never
    // read the demand call behind it.
    assert_eq!(next_reply(&mut s, Duration::from_secs(10)).await, Some(99));
    assert_eq!(held.most.load(Ordering::SeqCst), 2, "max_in_flight runs");
    held.open.add_permits(3);
    let mut rest = Vec::new();
    for _ in 0..3 {
        rest.push(next_reply(&mut s, Duration::from_secs(10)).await);
    }
    rest.sort();
    assert_eq!(rest, [Some(1), Some(2), Some(3)]);
    assert_eq!(held.most.load(Ordering::SeqCst), 2);
    shutdown.cancel();
}

#[tokio::test]
async fn a_connection_reads_at_most_twice_max_in_flight_calls_ahead() {
    let held = held();
    let (addr, shutdown) = serve_held(held.clone()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    for xid in 1..=4 {
        send(&mut s, xid, HELD).await;
    }
    send(&mut s, 99, NOW).await;
    // Four calls read and unanswered: the demand call stays unread...
    assert_eq!(next_reply(&mut s, Duration::from_millis(300)).await, None);
    // ...until one is answered.
    held.open.add_permits(1);
    let first = next_reply(&mut s, Duration::from_secs(10)).await;
    assert!(matches!(first, Some(1 | 2)), "{first:?}");
    assert_eq!(next_reply(&mut s, Duration::from_secs(10)).await, Some(99));
    held.open.add_permits(3);
    shutdown.cancel();
}
