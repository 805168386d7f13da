//! The emulator against real sockets on 127.0.0.1: delay, rate, byte-exact
//! relaying, and both kinds of cut.
//!
//! The RTT and throughput checks measure wall-clock time on purpose: the
//! emulator's job is to be within 10% of its settings. They take the median
//! of many samples and retry a failed measurement, so a loaded two-core
//! machine does not fail them by accident.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use gvfs_wanlink::{CutMode, DirectionConfig, LinkConfig, WanLink};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

const ATTEMPTS: usize = 3;
const TOLERANCE: f64 = 0.10;
const PATIENCE: Duration = Duration::from_secs(5);

fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Echoes every connection back to itself; reports each connection's end
/// (`true` for a clean EOF, `false` for an error such as a reset).
async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<bool>) {
    let listener = TcpListener::bind(localhost()).await.expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    let (ended_tx, ended_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let ended = ended_tx.clone();
            tokio::spawn(async move {
                stream.set_nodelay(true).expect("nodelay");
                let mut buf = vec![0u8; 64 * 1024];
                let clean = loop {
                    match stream.read(&mut buf).await {
                        Ok(0) => break stream.shutdown().await.is_ok(),
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                break false;
                            }
                        }
                        Err(_) => break false,
                    }
                };
                let _ = ended.send(clean);
            });
        }
    });
    (addr, ended_rx)
}

/// What a receiver saw of one bulk transfer.
#[derive(Debug)]
struct Transfer {
    bytes: usize,
    first_read: usize,
    first_at: Instant,
    last_at: Instant,
}

impl Transfer {
    /// Bits per second between the first and the last read, not counting
    /// the first read's bytes (they arrived at the start of the interval).
    fn rate_bps(&self) -> f64 {
        let secs = (self.last_at - self.first_at).as_secs_f64();
        (self.bytes - self.first_read) as f64 * 8.0 / secs
    }
}

async fn receive_all(stream: &mut TcpStream) -> io::Result<Transfer> {
    let mut buf = vec![0u8; 256 * 1024];
    let first_read = stream.read(&mut buf).await?;
    let first_at = Instant::now();
    let mut transfer = Transfer {
        bytes: first_read,
        first_read,
        first_at,
        last_at: first_at,
    };
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(transfer);
        }
        transfer.bytes += n;
        transfer.last_at = Instant::now();
    }
}

/// Reads every connection to its end and reports what it saw.
async fn sink_server() -> (SocketAddr, mpsc::UnboundedReceiver<Transfer>) {
    let listener = TcpListener::bind(localhost()).await.expect("bind sink");
    let addr = listener.local_addr().expect("sink addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(transfer) = receive_all(&mut stream).await {
                    let _ = tx.send(transfer);
                }
            });
        }
    });
    (addr, rx)
}

/// Sends `bytes` bytes to every connection, then closes it.
async fn source_server(bytes: usize) -> SocketAddr {
    let listener = TcpListener::bind(localhost()).await.expect("bind source");
    let addr = listener.local_addr().expect("source addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let data = vec![0x5a; bytes];
                if stream.write_all(&data).await.is_ok() {
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    addr
}

async fn start_link(target: SocketAddr, config: LinkConfig) -> WanLink {
    WanLink::start(localhost(), target, config)
        .await
        .expect("start link")
}

async fn connect(link: &WanLink) -> TcpStream {
    let stream = timeout(PATIENCE, TcpStream::connect(link.local_addr()))
        .await
        .expect("connect timed out")
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn within(measured: f64, expected: f64) -> bool {
    (measured - expected).abs() <= expected * TOLERANCE
}

/// Runs `measure` until it lands within 10% of `expected`, at most
/// `ATTEMPTS` times, and fails with every measurement if it never does.
async fn assert_measures(what: &str, expected: f64, mut measure: impl AsyncFnMut() -> f64) {
    let mut seen = Vec::new();
    for _ in 0..ATTEMPTS {
        let measured = measure().await;
        eprintln!("{what}: measured {measured:.3}, expected {expected:.3}");
        if within(measured, expected) {
            return;
        }
        seen.push(measured);
    }
    panic!("{what}: expected {expected:.3} +-10%, measured {seen:?}");
}

/// A deterministic pseudo-random byte stream (xorshift64).
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()[0]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_time_matches_the_configured_rtt() {
    let (echo, _) = echo_server().await;
    let link = start_link(
        echo,
        LinkConfig::from_rtt(Duration::from_millis(40), Some(50_000_000)),
    )
    .await;
    let mut stream = connect(&link).await;

    assert_measures("rtt ms", 40.0, async || {
        let mut samples = Vec::new();
        let mut reply = [0u8; 32];
        for i in 0..21u8 {
            let ping = [i; 32];
            let start = Instant::now();
            stream.write_all(&ping).await.expect("write ping");
            timeout(PATIENCE, stream.read_exact(&mut reply))
                .await
                .expect("pong timed out")
                .expect("read pong");
            assert_eq!(reply, ping);
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        // The first exchange also waited for the link to reach the target.
        median(samples.split_off(1))
    })
    .await;
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_throughput_matches_the_configured_rate() {
    const RATE: u64 = 50_000_000;
    const BYTES: usize = 4 << 20;
    let (sink, mut transfers) = sink_server().await;
    let config = LinkConfig {
        upstream: DirectionConfig::new(Duration::from_millis(10), Some(RATE)),
        downstream: DirectionConfig::new(Duration::from_millis(10), None),
        ..LinkConfig::default()
    };
    let link = start_link(sink, config).await;
    let data = vec![0xa5; BYTES];

    assert_measures("upstream Mbit/s", RATE as f64 / 1e6, async || {
        let mut stream = connect(&link).await;
        stream.write_all(&data).await.expect("write bulk");
        stream.shutdown().await.expect("shutdown");
        let transfer = timeout(Duration::from_secs(10), transfers.recv())
            .await
            .expect("transfer timed out")
            .expect("sink gone");
        assert_eq!(transfer.bytes, BYTES);
        transfer.rate_bps() / 1e6
    })
    .await;
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_throughput_matches_the_configured_rate() {
    const RATE: u64 = 50_000_000;
    const BYTES: usize = 4 << 20;
    let source = source_server(BYTES).await;
    let config = LinkConfig {
        upstream: DirectionConfig::new(Duration::from_millis(10), None),
        downstream: DirectionConfig::new(Duration::from_millis(10), Some(RATE)),
        ..LinkConfig::default()
    };
    let link = start_link(source, config).await;

    assert_measures("downstream Mbit/s", RATE as f64 / 1e6, async || {
        let mut stream = connect(&link).await;
        let transfer = timeout(Duration::from_secs(10), receive_all(&mut stream))
            .await
            .expect("transfer timed out")
            .expect("receive");
        assert_eq!(transfer.bytes, BYTES);
        transfer.rate_bps() / 1e6
    })
    .await;
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_share_the_link_bandwidth() {
    const RATE: u64 = 50_000_000;
    const BYTES: usize = 1 << 20;
    const FLOWS: usize = 4;
    let source = source_server(BYTES).await;
    let config = LinkConfig {
        upstream: DirectionConfig::new(Duration::from_millis(10), None),
        downstream: DirectionConfig::new(Duration::from_millis(10), Some(RATE)),
        ..LinkConfig::default()
    };
    let link = start_link(source, config).await;

    // Four flows at once get the link's rate between them, not four times it.
    assert_measures(
        "aggregate Mbit/s of 4 flows",
        RATE as f64 / 1e6,
        async || {
            let mut flows = Vec::new();
            for _ in 0..FLOWS {
                let mut stream = connect(&link).await;
                flows.push(tokio::spawn(async move {
                    timeout(Duration::from_secs(10), receive_all(&mut stream))
                        .await
                        .expect("transfer timed out")
                        .expect("receive")
                }));
            }
            let mut transfers = Vec::new();
            for flow in flows {
                transfers.push(flow.await.expect("flow task"));
            }
            assert!(transfers.iter().all(|t| t.bytes == BYTES));
            let first = transfers.iter().map(|t| t.first_at).min().expect("flows");
            let last = transfers.iter().map(|t| t.last_at).max().expect("flows");
            let counted: usize = transfers.iter().map(|t| t.bytes).sum::<usize>()
                - transfers.iter().map(|t| t.first_read).min().unwrap_or(0);
            counted as f64 * 8.0 / (last - first).as_secs_f64() / 1e6
        },
    )
    .await;
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_data_is_relayed_byte_exact_both_ways() {
    let (echo, _) = echo_server().await;
    for config in [
        LinkConfig::symmetric(Duration::from_millis(1), None),
        LinkConfig::symmetric(Duration::from_millis(2), Some(200_000_000)),
    ] {
        let link = start_link(echo, config).await;
        let data = random_bytes(2 << 20, 0x9e37_79b9_7f4a_7c15);
        let stream = connect(&link).await;
        let (mut read_half, mut write_half) = stream.into_split();

        let sent = data.clone();
        let writer = tokio::spawn(async move {
            // Uneven writes, so chunk boundaries fall everywhere.
            let mut rest = &sent[..];
            let mut size = 1;
            while !rest.is_empty() {
                let n = size.min(rest.len());
                write_half.write_all(&rest[..n]).await.expect("write");
                rest = &rest[n..];
                size = size * 7 % 100_003 + 1;
            }
            write_half.shutdown().await.expect("shutdown");
        });
        let mut echoed = Vec::new();
        timeout(Duration::from_secs(10), read_half.read_to_end(&mut echoed))
            .await
            .expect("echo timed out")
            .expect("read echo");
        writer.await.expect("writer");
        assert!(echoed == data, "echoed bytes differ from sent bytes");

        let stats = link.stats();
        assert_eq!(stats.upstream_bytes, data.len() as u64);
        assert_eq!(stats.downstream_bytes, data.len() as u64);
        link.shutdown().await;
    }
}

/// True once `stream` reports a reset or end of stream.
async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        timeout(PATIENCE, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn echoes(stream: &mut TcpStream, message: &[u8]) -> bool {
    let mut reply = vec![0u8; message.len()];
    stream.write_all(message).await.is_ok()
        && matches!(
            timeout(PATIENCE, stream.read_exact(&mut reply)).await,
            Ok(Ok(_))
        )
        && reply == message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_cut_closes_connections_until_restored() {
    let (echo, mut server_ends) = echo_server().await;
    let config =
        LinkConfig::symmetric(Duration::from_millis(5), None).with_cut_mode(CutMode::Reset);
    let link = start_link(echo, config).await;

    let mut before = connect(&link).await;
    assert!(echoes(&mut before, b"hello").await);

    link.cut();
    assert_eq!(link.cut_state(), Some(CutMode::Reset));
    assert!(is_closed(&mut before).await, "client side survived the cut");
    let server_end = timeout(PATIENCE, server_ends.recv())
        .await
        .expect("server side survived the cut");
    assert_eq!(server_end, Some(false), "server side should see a reset");

    // While cut, a new client is accepted by the kernel but reset at once.
    if let Ok(Ok(mut during)) = timeout(PATIENCE, TcpStream::connect(link.local_addr())).await {
        let _ = during.write_all(b"anyone?").await;
        assert!(
            is_closed(&mut during).await,
            "new connection relayed while cut"
        );
    }

    link.restore();
    assert_eq!(link.cut_state(), None);
    let mut after = connect(&link).await;
    assert!(echoes(&mut after, b"back again").await);
    assert!(link.stats().connections_reset >= 2, "{}", link.stats());
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_cut_stalls_delivery_until_restored() {
    let (echo, _) = echo_server().await;
    let config =
        LinkConfig::symmetric(Duration::from_millis(5), None).with_cut_mode(CutMode::Blackhole);
    let link = start_link(echo, config).await;

    let mut open = connect(&link).await;
    assert!(echoes(&mut open, b"hello").await);

    link.cut();
    assert_eq!(link.cut_state(), Some(CutMode::Blackhole));
    open.write_all(b"held back")
        .await
        .expect("write during cut");
    let mut fresh = connect(&link).await;
    fresh
        .write_all(b"new client")
        .await
        .expect("write during cut");

    let mut buf = [0u8; 64];
    let stall = Duration::from_millis(300);
    assert!(
        timeout(stall, open.read(&mut buf)).await.is_err(),
        "delivered while blackholed"
    );
    assert!(
        timeout(stall, fresh.read(&mut buf)).await.is_err(),
        "new client relayed while blackholed"
    );

    link.restore();
    let mut reply = [0u8; 9];
    timeout(PATIENCE, open.read_exact(&mut reply))
        .await
        .expect("held bytes never delivered")
        .expect("read held bytes");
    assert_eq!(&reply, b"held back");
    let mut reply = [0u8; 10];
    timeout(PATIENCE, fresh.read_exact(&mut reply))
        .await
        .expect("new client never relayed")
        .expect("read new client");
    assert_eq!(&reply, b"new client");
    assert_eq!(link.stats().connections_reset, 0);
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_target_resets_the_client() {
    // Bind and drop a listener to find a port nobody is listening on.
    let closed = TcpListener::bind(localhost())
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let config = LinkConfig {
        connect_timeout: Duration::from_secs(1),
        ..LinkConfig::default()
    };
    let link = start_link(closed, config).await;
    // The reset can come so fast that connect itself reports it.
    if let Ok(mut stream) = timeout(PATIENCE, TcpStream::connect(link.local_addr()))
        .await
        .expect("connect hung")
    {
        assert!(is_closed(&mut stream).await);
    }
    link.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_open_connections() {
    let (echo, _) = echo_server().await;
    let link = start_link(echo, LinkConfig::default()).await;
    let addr = link.local_addr();
    let mut stream = connect(&link).await;
    assert!(echoes(&mut stream, b"hi").await);
    timeout(PATIENCE, link.shutdown())
        .await
        .expect("shutdown hung");
    assert!(is_closed(&mut stream).await);
    assert!(
        timeout(PATIENCE, TcpStream::connect(addr))
            .await
            .expect("connect hung")
            .is_err(),
        "still accepting after shutdown"
    );
}
