//! The link estimate of a client whose calls cross a link of known round
//! trip and rate, played by a server over an in-memory stream.

use super::*;
use crate::rpc::ReplyStatus;

/// Hands out one stream, once.
struct Once(Mutex<Option<tokio::io::DuplexStream>>);

impl Connector for Once {
    fn connect(&self) -> BoxFuture<'_, io::Result<BoxStream>> {
        let s = lock(&self.0).take();
        Box::pin(async move {
            s.map(|s| Box::new(s) as BoxStream)
                .ok_or_else(|| io::Error::other("already connected"))
        })
    }

    fn describe(&self) -> String {
        "duplex".into()
    }
}

/// Answers every call with `reply` bytes of results `rtt` after it came,
/// and no sooner than `gap` after the previous answer: a link of round
/// trip `rtt` that carries one reply per `gap`.
fn serve(stream: tokio::io::DuplexStream, reply: usize, rtt: Duration, gap: Duration) {
    let (rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(1024);
    tokio::spawn(async move {
        while let Some((at, rec)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if wr.write_all(&rec).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut calls = RecordStream::new(rd, RecordLimits::for_payload(1 << 20));
        let mut last = Instant::now();
        let results = vec![7u8; reply];
        while let Ok(Some(call)) = calls.next().await {
            let Ok((head, _)) = rpc::parse_call(&call) else {
                break;
            };
            let at = (Instant::now() + rtt).max(last + gap);
            last = at;
            let rec = rpc::reply_record(head.xid, ReplyStatus::Success, &results);
            if tx.send((at, rec)).await.is_err() {
                break;
            }
        }
    });
}

#[tokio::test(start_paused = true)]
async fn the_estimate_converges_to_the_link() {
    const REPLY: usize = 64 << 10;
    let (rtt, gap) = (Duration::from_millis(40), Duration::from_millis(5));
    let (ours, theirs) = tokio::io::duplex(8 << 20);
    serve(theirs, REPLY, rtt, gap);
    let client = RpcClient::new(Once(Mutex::new(Some(ours))), ClientConfig::default());
    assert_eq!(client.link().estimate(), None);
    // 16 callers, more than the link holds (8 replies in a round trip).
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until {
                    let r = c.call(1, 1, 1, &Credentials::None, &[]).await.unwrap();
                    assert_eq!(r.len(), REPLY);
                }
            })
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    let got = client.link().estimate().expect("no estimate");
    // A reply record is its results and a 24-byte header.
    let record = (REPLY + 24) as u64;
    let rate = record * 1_000_000 / gap.as_micros() as u64;
    assert_eq!(got.min_rtt, rtt, "{got:?}");
    assert!(
        got.rate <= rate + rate / 100 && got.rate >= rate - rate / 20,
        "rate {} for a link of {rate}",
        got.rate
    );
    let bdp = 8 * record;
    assert!(
        got.bdp().abs_diff(bdp) <= bdp / 20,
        "bdp {} for a link of {bdp}",
        got.bdp()
    );
    assert_eq!(client.stats().snapshot().retransmits, 0);
}
