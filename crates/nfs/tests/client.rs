//! The multiplexing RPC client against scripted servers on loopback: many
//! calls share one connection and replies may come in any order; a dropped
//! connection is reopened and the call resent with the same xid; a server
//! that stays away yields a clear error in bounded time.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gvfs_nfs::net::client::{ClientConfig, ClientError, RpcClient, TcpConnector};
use gvfs_nfs::record::RecordLimits;
use gvfs_nfs::rpc::{self, Credentials, ReplyStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads one single-fragment record (what the client sends); `None` at EOF.
async fn read_call(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut hdr = [0u8; 4];
    s.read_exact(&mut hdr).await.ok()?;
    let len = u32::from_be_bytes(hdr);
    assert!(
        len & 0x8000_0000 != 0,
        "the client sends one fragment per record"
    );
    let mut body = vec![0u8; (len & 0x7FFF_FFFF) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(body)
}

/// Echoes each call's argument bytes back as its result.
fn echo_reply(call: &[u8]) -> Vec<u8> {
    let (h, at) = rpc::parse_call(call).expect("a call");
    rpc::reply_record(h.xid, ReplyStatus::Success, &call[at..])
}

fn cfg(give_up: Duration) -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(2),
        retransmit_after: Duration::from_secs(30),
        give_up_after: Some(give_up),
        max_in_flight: 64,
        limits: RecordLimits::for_payload(1 << 16),
    }
}

#[tokio::test]
async fn many_calls_share_one_connection_with_replies_out_of_order() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(Mutex::new(0));
    let c2 = connections.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            *c2.lock().unwrap() += 1;
            tokio::spawn(async move {
                // Collect 16 calls before answering any, then answer them
                // in reverse order: only xid matching can pair them up.
                let mut calls = Vec::new();
                while calls.len() < 16 {
                    match read_call(&mut s).await {
                        Some(c) => calls.push(c),
                        None => return,
                    }
                }
                for c in calls.iter().rev() {
                    s.write_all(&echo_reply(c)).await.unwrap();
                }
            });
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_secs(10)));
    let mut tasks = Vec::new();
    for i in 0u32..16 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let args = i.to_be_bytes();
            (i, c.call(1, 1, 1, &Credentials::None, &args).await)
        }));
    }
    for t in tasks {
        let (i, r) = t.await.unwrap();
        assert_eq!(
            r.unwrap().to_vec(),
            i.to_be_bytes().to_vec(),
            "call {i} got another call's reply"
        );
    }
    assert_eq!(*connections.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_dropped_connection_is_reopened_and_the_call_resent_with_its_xid() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let xids = Arc::new(Mutex::new(Vec::new()));
    let x2 = xids.clone();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let Some(c) = read_call(&mut s).await else {
                continue;
            };
            x2.lock().unwrap().push(rpc::parse_call(&c).unwrap().0.xid);
            if first {
                // Drop the connection without answering.
                first = false;
                drop(s);
                continue;
            }
            s.write_all(&echo_reply(&c)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_secs(10)));
    let r = client
        .call(1, 1, 1, &Credentials::None, b"abcd")
        .await
        .unwrap();
    assert_eq!(&r[..], b"abcd");
    let seen = xids.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1], "the retransmission must reuse the xid");
    assert_eq!(client.stats().retransmits.get(), 1);
    assert_eq!(client.stats().connects.get(), 2);
}

#[tokio::test]
async fn a_server_that_stays_away_is_a_clear_error_in_bounded_time() {
    // Bind then drop: nothing listens on this port.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_millis(800)));
    let start = std::time::Instant::now();
    let err = client
        .call(1, 1, 1, &Credentials::None, &[])
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    match &err {
        ClientError::Unavailable {
            server, last_error, ..
        } => {
            assert_eq!(server, &addr.to_string());
            // Why, not only that time ran out.
            assert!(last_error.contains("refused"), "{last_error}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("unavailable"), "{err}");
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h2 = held.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            h2.lock().unwrap().push(s); // accept, read nothing, answer nothing
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_millis(500)));
    let err = client
        .call(1, 1, 1, &Credentials::None, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unavailable { .. }), "{err:?}");
}

#[tokio::test]
async fn rpc_level_errors_are_reported_not_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut seen = HashSet::new();
        while let Some(c) = read_call(&mut s).await {
            let (h, _) = rpc::parse_call(&c).unwrap();
            assert!(seen.insert(h.xid), "a call was retried");
            s.write_all(&rpc::reply_record(h.xid, ReplyStatus::ProcUnavail, &[]))
                .await
                .unwrap();
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_secs(5)));
    let err = client
        .call(1, 1, 99, &Credentials::None, &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Rpc {
                error: rpc::ReplyError::Accepted(ReplyStatus::ProcUnavail),
                ..
            }
        ),
        "{err:?}"
    );
}

/// Client settings for a hard mount (no deadline) that resends after `after`.
fn hard(after: Duration) -> ClientConfig {
    ClientConfig {
        retransmit_after: after,
        give_up_after: None,
        ..cfg(Duration::ZERO)
    }
}

#[tokio::test]
async fn a_connection_the_server_went_quiet_on_is_left_for_a_new_one() {
    // The first connection takes the calls and never answers (a server
    // that hung, or a link that went dark); the next ones answer. A hard
    // mount must not resend on the dead connection forever.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(Mutex::new(0));
    let c2 = connections.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let first = {
                let mut n = c2.lock().unwrap();
                *n += 1;
                *n == 1
            };
            if first {
                held.push(s);
                continue;
            }
            tokio::spawn(async move {
                while let Some(c) = read_call(&mut s).await {
                    s.write_all(&echo_reply(&c)).await.unwrap();
                }
            });
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, hard(Duration::from_millis(300)));
    let mut tasks = Vec::new();
    for i in 0u32..8 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            c.call(1, 1, 1, &Credentials::None, &i.to_be_bytes()).await
        }));
    }
    for (i, t) in (0u32..).zip(tasks) {
        let r = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("the calls stayed on the quiet connection")
            .unwrap()
            .unwrap();
        assert_eq!(r.to_vec(), i.to_be_bytes().to_vec());
    }
    assert_eq!(*connections.lock().unwrap(), 2);
}

#[tokio::test]
async fn calls_behind_a_server_that_stopped_reading_give_up_on_time() {
    // The server accepts and never reads: the socket buffers fill, the
    // client's writer blocks, and calls queue behind it. Each must still
    // fail by its deadline rather than wait on the queue for ever.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = listener.accept().await.unwrap();
            held.push(s);
        }
    });
    let client = RpcClient::new(
        TcpConnector { addr },
        ClientConfig {
            retransmit_after: Duration::from_millis(500),
            ..cfg(Duration::from_secs(2))
        },
    );
    let start = std::time::Instant::now();
    let big = vec![0u8; 1 << 20];
    let mut tasks = Vec::new();
    for _ in 0..48 {
        let (c, args) = (client.clone(), big.clone());
        tasks.push(tokio::spawn(async move {
            c.call(1, 1, 1, &Credentials::None, &args).await
        }));
    }
    for t in tasks {
        let r = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a call waited past its deadline")
            .unwrap();
        assert!(matches!(r, Err(ClientError::Unavailable { .. })), "{r:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn a_server_that_hangs_up_at_once_is_redialled_with_pauses() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(Mutex::new(0u32));
    let c2 = connections.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            *c2.lock().unwrap() += 1;
            // Take the call, then hang up without a word.
            let _ = read_call(&mut s).await;
        }
    });
    let client = RpcClient::new(TcpConnector { addr }, cfg(Duration::from_millis(1500)));
    let err = client
        .call(1, 1, 1, &Credentials::None, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unavailable { .. }), "{err:?}");
    // Pauses of 50, 100, 200, 400, 800 ms fit in 1.5 s: a handful of
    // connections, not one per loop of the scheduler.
    let n = *connections.lock().unwrap();
    assert!((2..=8).contains(&n), "{n} connections in 1.5 s");
}
