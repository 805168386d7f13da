use std::sync::Arc;
use std::time::Duration;

use gvfs_metafile::ByteRepeat;
use gvfs_nfs::Credentials;
use gvfs_nfs::FileVersion;
use gvfs_nfs::net::client::RpcClient;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::rpc::ReplyStatus;
use gvfs_nfs::xdr::XdrError;

use super::*;

fn attrs() -> fattr3 {
    gvfs_nfs::testing::file_attrs(1 << 20, 7)
}

#[test]
fn args_round_trip_and_caps() {
    let a = FetchArgs {
        fh: vec![7; 33],
        offset: 5 << 32 | 9,
        count: CHUNK,
        have: None,
    };
    let mut b = Vec::new();
    a.encode(&mut b);
    assert_eq!(FetchArgs::decode(&b), Ok(a.clone()));
    let mut big = a.clone();
    big.count = CHUNK + 1;
    let mut b = Vec::new();
    big.encode(&mut b);
    assert!(FetchArgs::decode(&b).is_err());
    let mut long = a;
    long.fh = vec![1; 65];
    let mut b = Vec::new();
    long.encode(&mut b);
    assert!(FetchArgs::decode(&b).is_err());
}

#[test]
fn results_round_trip_and_refuse_lies() {
    let raw: Vec<u8> = (0..CHUNK).map(|i| (i / 4096) as u8 & 3).collect();
    let (codec, data) = compress(&raw, 3);
    assert_eq!(codec, Codec::Zstd);
    let ok = FetchOk {
        attrs: attrs(),
        raw_len: CHUNK,
        eof: true,
        codec,
        data,
        repeats: Vec::new(),
    };
    let mut b = Vec::new();
    encode_fetch_res(&mut b, &Ok(ok.clone()));
    let back = decode_fetch_res(&b).unwrap_or_else(|e| panic!("{e}"));
    let back = back.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(back.eof);
    assert_eq!(decompress(back).ok(), Some(raw.clone()));
    // A frame announcing fewer bytes than it holds is refused.
    let mut short = ok.clone();
    short.raw_len = CHUNK / 2;
    assert!(matches!(
        decompress(short),
        Err(ChunkError::BadFrame { .. })
    ));
    // A stored chunk whose length disagrees is refused at decode.
    let mut b = Vec::new();
    let lie = FetchOk {
        codec: Codec::Stored,
        data: vec![1; 10],
        raw_len: 11,
        ..ok
    };
    encode_fetch_res(&mut b, &Ok(lie));
    assert!(decode_fetch_res(&b).is_err());
    // Errors carry only the status.
    let mut b = Vec::new();
    encode_fetch_res(&mut b, &Err(nfsstat3::NFS3ERR_STALE));
    assert!(matches!(
        decode_fetch_res(&b),
        Ok(Err(nfsstat3::NFS3ERR_STALE))
    ));
    // Truncations never panic and never succeed.
    let mut b = Vec::new();
    encode_fetch_res(
        &mut b,
        &Ok(FetchOk {
            attrs: attrs(),
            raw_len: 3,
            eof: false,
            codec: Codec::Stored,
            data: vec![1, 2, 3],
            repeats: Vec::new(),
        }),
    );
    for cut in 0..b.len() {
        assert!(decode_fetch_res(&b[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn guarded_store_args_round_trip() {
    let mut a = StoreArgs::new(vec![3; 20], 1 << 20, &[7u8; 5000], 3);
    let mut plain = Vec::new();
    a.encode(&mut plain);
    a.guard = Some(FileVersion::of(&attrs()));
    let mut b = Vec::new();
    a.encode(&mut b);
    assert_eq!(b.len(), plain.len() + GUARD_LEN);
    assert_eq!(StoreArgs::decode_guarded(&b), Ok(a.clone()));
    assert!(StoreArgs::decode(&b).is_err(), "STORE refuses a guard");
    assert!(StoreArgs::decode_guarded(&plain).is_err());
    assert!(StoreArgs::decode_guarded(&b[..10]).is_err());
    let mut other = attrs();
    assert!(FileVersion::of(&other).describes(&attrs()));
    other.ctime.nseconds += 1;
    assert!(!FileVersion::of(&other).describes(&attrs()));
}

#[test]
fn store_round_trip_and_refuse_lies() {
    let raw: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let a = StoreArgs::new(vec![3; 20], 1 << 20, &raw, 3);
    assert_eq!(a.codec, Codec::Zstd);
    let mut b = Vec::new();
    a.encode(&mut b);
    let back = StoreArgs::decode(&b).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, a);
    assert_eq!(back.raw().ok(), Some(raw));
    for cut in 0..b.len() {
        assert!(StoreArgs::decode(&b[..cut]).is_err(), "cut at {cut}");
    }
    let mut big = a.clone();
    big.raw_len = CHUNK + 1;
    let mut b = Vec::new();
    big.encode(&mut b);
    assert!(StoreArgs::decode(&b).is_err());
    let mut lie = a;
    lie.raw_len -= 1;
    assert!(matches!(lie.raw(), Err(ChunkError::BadFrame { .. })));
    let mut b = Vec::new();
    encode_store_res(&mut b, &Ok(attrs()));
    assert!(matches!(decode_store_res(&b), Ok(Ok(_))));
    let mut b = Vec::new();
    encode_store_res(&mut b, &Err(nfsstat3::NFS3ERR_NOSPC));
    assert!(matches!(
        decode_store_res(&b),
        Ok(Err(nfsstat3::NFS3ERR_NOSPC))
    ));
}

#[test]
fn incompressible_chunks_travel_stored() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let raw: Vec<u8> = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let (codec, data) = compress(&raw, 3);
    assert_eq!(codec, Codec::Stored);
    assert_eq!(data, raw);
}

/// A loopback server of RPC records that counts the calls it gets and
/// answers each with `status`, or never when `status` is `None`.
async fn counting_server(
    status: Option<ReplyStatus>,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    answering_server(move |_, _| status.map(|s| (s, Vec::new()))).await
}

/// A loopback server of RPC records that counts the calls it gets and
/// answers each as `answer` says for its version and procedure number
/// (never, for `None`).
async fn answering_server(
    answer: impl Fn(u32, u32) -> Option<(ReplyStatus, Vec<u8>)> + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let addr = connection_aware_server(move |_, vers, proc_| {
        counted.fetch_add(1, Ordering::SeqCst);
        answer(vers, proc_).map(|(status, results)| (status, results, false))
    })
    .await;
    (addr, calls)
}

fn client_of(addr: std::net::SocketAddr, probe_timeout: Duration) -> ExtClient {
    let cfg = gvfs_nfs::net::client::ClientConfig {
        // A hard mount: the call itself never gives up.
        give_up_after: None,
        ..Default::default()
    };
    let rpc = RpcClient::new(gvfs_nfs::net::client::TcpConnector { addr }, cfg);
    ExtClient::with_probe_timeout(rpc, probe_timeout)
}

/// HELLO's answer: `caps`.
fn hello_res(caps: Caps) -> Vec<u8> {
    let mut out = Vec::new();
    gvfs_nfs::xdr::put_u32(&mut out, caps.0);
    out
}

#[tokio::test]
async fn the_agreement_is_asked_once_by_callers_at_once_and_remembered() {
    use std::sync::atomic::Ordering;
    for (status, speaks) in [
        (ReplyStatus::Success, true),
        (ReplyStatus::ProgUnavail, false),
    ] {
        let (addr, calls) =
            answering_server(move |_, _| Some((status, hello_res(Caps::ALL)))).await;
        let ext = client_of(addr, PROBE_TIMEOUT);
        let (a, b) = tokio::join!(ext.supported(), ext.supported());
        assert_eq!((a, b), (speaks, speaks), "{status:?}");
        assert_eq!(ext.supported().await, speaks);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{status:?}");
    }
}

/// A FETCH answer of 4 KiB of sevens, and its file bytes.
fn sevens() -> (Vec<u8>, FetchOk) {
    let raw = vec![7u8; 4096];
    let (codec, data) = compress(&raw, 3);
    let ok = FetchOk {
        attrs: attrs(),
        raw_len: 4096,
        eof: false,
        codec,
        data,
        repeats: Vec::new(),
    };
    (raw, ok)
}

fn small_fetch() -> FetchArgs {
    FetchArgs {
        fh: vec![1; 8],
        offset: 0,
        count: 4096,
        have: None,
    }
}

#[tokio::test]
async fn a_version_2_peer_is_asked_only_what_it_agreed_to() {
    let (raw, ok) = sevens();
    let mut res = Vec::new();
    encode_fetch_repeats_res(&mut res, &Ok(ok));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    // It speaks FETCH_REPEATS and profiles, not FETCH_DEMAND.
    let (addr, _) = answering_server(move |vers, proc_| {
        log.lock().unwrap().push((vers, proc_));
        match proc_ {
            PROC_HELLO => Some((
                ReplyStatus::Success,
                hello_res(Caps::REPEATS.and(Caps::ALL)),
            )),
            PROC_FETCH_REPEATS => Some((ReplyStatus::Success, res.clone())),
            _ => Some((ReplyStatus::ProcUnavail, Vec::new())),
        }
    })
    .await;
    let ext = client_of(addr, PROBE_TIMEOUT);
    let cred = Credentials::default();
    for _ in 0..2 {
        let got = ext
            .fetch(&cred, &small_fetch(), &Want::local(Class::Demand))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decompress(got).ok(), Some(raw.clone()));
    }
    // No profile is asked for: not agreed.
    assert_eq!(ext.get_profile(&cred, b"fh").await, Ok(None));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (VERSION, PROC_HELLO),
            (VERSION, PROC_FETCH_REPEATS),
            (VERSION, PROC_FETCH_REPEATS)
        ]
    );
}

#[tokio::test]
async fn a_version_1_peer_is_spoken_to_in_version_1() {
    let (raw, ok) = sevens();
    let mut res = Vec::new();
    encode_fetch_repeats_res(&mut res, &Ok(ok));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    // What a proxy from before version 2 answers: `rpc_refusal` of then.
    let (addr, _) = answering_server(move |vers, proc_| {
        log.lock().unwrap().push((vers, proc_));
        if vers != VERSION_1 {
            let mismatch = ReplyStatus::ProgMismatch { low: 1, high: 1 };
            return Some((mismatch, Vec::new()));
        }
        match proc_ {
            PROC_FETCH_DEMAND => Some((ReplyStatus::Success, res.clone())),
            _ => Some((ReplyStatus::ProcUnavail, Vec::new())),
        }
    })
    .await;
    let ext = client_of(addr, PROBE_TIMEOUT);
    assert!(ext.supported().await);
    let cred = Credentials::default();
    let got = ext
        .fetch(&cred, &small_fetch(), &Want::local(Class::Demand))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(decompress(got).ok(), Some(raw));
    // Refused once, PROFILE_GET is not asked again.
    for _ in 0..2 {
        assert_eq!(ext.get_profile(&cred, b"fh").await, Ok(None));
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (VERSION, PROC_HELLO),
            (VERSION_1, PROC_FETCH_DEMAND),
            (VERSION_1, PROC_PROFILE_GET)
        ]
    );
}

#[test]
fn the_server_side_refuses_versions_and_procedures_it_does_not_have() {
    let mismatch = Some(ReplyStatus::ProgMismatch {
        low: VERSION_1,
        high: VERSION,
    });
    assert_eq!(rpc_refusal(0, PROC_NULL), mismatch);
    assert_eq!(rpc_refusal(3, PROC_NULL), mismatch);
    assert_eq!(rpc_refusal(VERSION_1, PROC_FETCH_HAVE), None);
    assert_eq!(
        rpc_refusal(VERSION_1, PROC_HELLO),
        Some(ReplyStatus::ProcUnavail)
    );
    assert_eq!(rpc_refusal(VERSION, PROC_HELLO), None);
    assert_eq!(rpc_refusal(VERSION, PROC_FETCH_CLASS), None);
    assert_eq!(
        rpc_refusal(VERSION_1, PROC_FETCH_CLASS),
        Some(ReplyStatus::ProcUnavail)
    );
    assert_eq!(rpc_refusal(2, 11), Some(ReplyStatus::ProcUnavail));
    assert_eq!(hello_answer(u32::MAX), Caps::ALL.0);
    assert_eq!(hello_answer(Caps::HAVE.0 | 1 << 30), Caps::HAVE.0);
}

#[tokio::test]
async fn an_upstream_without_fetch_repeats_is_asked_with_fetch_from_then_on() {
    use std::sync::atomic::Ordering;
    let raw = vec![7u8; 4096];
    let (codec, data) = compress(&raw, 3);
    let ok = FetchOk {
        attrs: attrs(),
        raw_len: 4096,
        eof: false,
        codec,
        data,
        repeats: Vec::new(),
    };
    let mut res = Vec::new();
    encode_fetch_res(&mut res, &Ok(ok));
    let (addr, calls) = answering_server(move |_, proc_| match proc_ {
        PROC_FETCH => Some((ReplyStatus::Success, res.clone())),
        _ => Some((ReplyStatus::ProcUnavail, Vec::new())),
    })
    .await;
    let ext = client_of(addr, PROBE_TIMEOUT);
    let args = FetchArgs {
        fh: vec![1; 8],
        offset: 0,
        count: 4096,
        have: None,
    };
    let cred = Credentials::default();
    // HELLO (refused: taken as every capability), FETCH_REPEATS (refused),
    // FETCH; then FETCH alone.
    for (i, want_calls) in [(0, 3), (1, 4)] {
        let got = ext
            .fetch(&cred, &args, &Want::local(Class::Background))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decompress(got).ok(), Some(raw.clone()), "fetch {i}");
        assert_eq!(calls.load(Ordering::SeqCst), want_calls, "fetch {i}");
    }
}

#[test]
fn repeat_lists_round_trip_capped_and_checked() {
    let raw = vec![0u8; 8192];
    let (codec, data) = compress(&raw, 3);
    let mut ok = FetchOk {
        attrs: attrs(),
        raw_len: 8192,
        eof: false,
        codec,
        data,
        repeats: vec![ByteRepeat {
            to: 1_000_000 + 4096,
            from: 10,
            len: 4096,
        }],
    };
    let mut b = Vec::new();
    encode_fetch_repeats_res(&mut b, &Ok(ok.clone()));
    let back = decode_fetch_repeats_res(&b).unwrap_or_else(|e| panic!("{e}"));
    let back = back.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(back.repeats, ok.repeats);
    assert!(back.check_repeats(1_000_000).is_ok());
    // Outside the chunk, from after to, or overlapping: refused.
    assert!(matches!(
        back.check_repeats(1_000_000 + 8192),
        Err(ChunkError::RepeatOutside { .. })
    ));
    ok.repeats[0].from = 1_000_000 + 1;
    assert!(ok.check_repeats(1_000_000).is_err());
    ok.repeats = vec![
        ByteRepeat {
            to: 1_000_000 + 4096,
            from: 0,
            len: 4096,
        },
        ByteRepeat {
            to: 1_000_000 + 4096,
            from: 0,
            len: 10,
        },
    ];
    assert!(ok.check_repeats(1_000_000).is_err());
    // A list longer than the cap is refused before it is read.
    ok.repeats = vec![
        ByteRepeat {
            to: 0,
            from: 0,
            len: 1
        };
        MAX_REPEATS + 1
    ];
    let mut b = Vec::new();
    encode_fetch_repeats_res(&mut b, &Ok(ok));
    assert!(matches!(
        decode_fetch_repeats_res(&b),
        Err(XdrError::TooLong { .. })
    ));
    for cut in 0..b.len() {
        assert!(decode_fetch_repeats_res(&b[..cut]).is_err(), "cut at {cut}");
    }
}

#[tokio::test]
async fn a_probe_without_an_answer_gives_up_and_is_asked_again() {
    use std::sync::atomic::Ordering;
    let (addr, calls) = counting_server(None).await;
    let ext = client_of(addr, Duration::from_millis(200));
    // Without the probe's own timeout this would wait forever: fail.
    let twice = async { (ext.supported().await, ext.supported().await) };
    let answers = tokio::time::timeout(Duration::from_secs(10), twice).await;
    assert_eq!(answers, Ok((false, false)), "the probe never gave up");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A loopback server of RPC records that answers each call as `answer`
/// says for its connection (0 for the first accepted), version and
/// procedure number (never, for `None`), and closes the connection after a
/// reply when `answer` says so.
async fn connection_aware_server(
    answer: impl Fn(usize, u32, u32) -> Option<(ReplyStatus, Vec<u8>, bool)> + Send + Sync + 'static,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer = Arc::new(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut conn = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4];
                while s.read_exact(&mut head).await.is_ok() {
                    let len = (u32::from_be_bytes(head) & 0x7fff_ffff) as usize;
                    let mut call = vec![0; len.min(1 << 16)];
                    if s.read_exact(&mut call).await.is_err() || call.len() < 24 {
                        return;
                    }
                    let word = |i: usize| u32::from_be_bytes(call[i..i + 4].try_into().unwrap());
                    let Some((status, results, close)) = answer(conn, word(16), word(20)) else {
                        continue;
                    };
                    let reply = gvfs_nfs::rpc::reply_record(word(0), status, &results);
                    if s.write_all(&reply).await.is_err() || close {
                        return;
                    }
                }
            });
            conn += 1;
        }
    });
    addr
}

#[tokio::test]
async fn a_new_connection_is_agreed_anew() {
    let (_, ok) = sevens();
    let mut fetched = Vec::new();
    encode_fetch_repeats_res(&mut fetched, &Ok(ok));
    let mut no_profile = Vec::new();
    gvfs_nfs::xdr::put_u32(&mut no_profile, nfsstat3::NFS3ERR_NOENT as u32);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    // The first connection's peer agrees to FETCH_REPEATS only and drops
    // the connection after its first FETCH; the peer behind the second
    // (upgraded, say) agrees to everything.
    let addr = connection_aware_server(move |conn, _, proc_| {
        log.lock().unwrap().push((conn, proc_));
        Some(match (conn, proc_) {
            (0, PROC_HELLO) => (ReplyStatus::Success, hello_res(Caps::REPEATS), false),
            (_, PROC_HELLO) => (ReplyStatus::Success, hello_res(Caps::ALL), false),
            (_, PROC_FETCH_REPEATS) => (ReplyStatus::Success, fetched.clone(), conn == 0),
            (_, PROC_PROFILE_GET) => (ReplyStatus::Success, no_profile.clone(), false),
            _ => (ReplyStatus::ProcUnavail, Vec::new(), false),
        })
    })
    .await;
    let ext = client_of(addr, PROBE_TIMEOUT);
    let cred = Credentials::default();
    let args = small_fetch();
    let want = Want::local(Class::Background);
    let fetch = || ext.fetch(&cred, &args, &want);
    fetch().await.unwrap_or_else(|e| panic!("{e}"));
    // Profiles were not agreed on this connection: not asked.
    assert_eq!(ext.get_profile(&cred, b"fh").await, Ok(None));
    // This FETCH goes out on a new connection, under the terms known...
    fetch().await.unwrap_or_else(|e| panic!("{e}"));
    // ...and the next call agrees anew, so profiles are asked for.
    assert_eq!(ext.get_profile(&cred, b"fh").await, Ok(None));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (0, PROC_HELLO),
            (0, PROC_FETCH_REPEATS),
            (1, PROC_FETCH_REPEATS),
            (1, PROC_HELLO),
            (1, PROC_PROFILE_GET)
        ]
    );
}

#[test]
fn fetch_class_args_round_trip_and_refuse_unknown_classes() {
    let mut have = Have::new(4096, 64 << 10);
    have.set(3);
    have.set(15);
    for class in Class::ALL {
        for have in [None, Some(have.clone())] {
            let a = FetchArgs {
                fh: vec![9; 40],
                offset: 3 << 20,
                count: 64 << 10,
                have,
            };
            let mut b = Vec::new();
            encode_class_args(&mut b, &a, class);
            assert_eq!(decode_class_args(&b), Ok((a.clone(), class)));
            for cut in 0..b.len() {
                assert!(decode_class_args(&b[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
    // An empty have is not sent: the same as none.
    let a = FetchArgs {
        have: Some(Have::new(4096, 8192)),
        ..small_fetch()
    };
    let mut b = Vec::new();
    encode_class_args(&mut b, &a, Class::Profile);
    assert_eq!(decode_class_args(&b), Ok((small_fetch(), Class::Profile)));
    // Class 4 (after demand) is no class: GARBAGE_ARGS at the server.
    let mut b = Vec::new();
    small_fetch().encode(&mut b);
    gvfs_nfs::xdr::put_u32(&mut b, 4);
    gvfs_nfs::xdr::put_u32(&mut b, 0);
    assert_eq!(decode_class_args(&b), Err(XdrError::InvalidValue(4)));
    // A have that is not a bool, a count over a chunk: refused.
    let mut b = Vec::new();
    small_fetch().encode(&mut b);
    gvfs_nfs::xdr::put_u32(&mut b, 1);
    gvfs_nfs::xdr::put_u32(&mut b, 2);
    assert!(decode_class_args(&b).is_err());
    let big = FetchArgs {
        count: CHUNK + 1,
        ..small_fetch()
    };
    let mut b = Vec::new();
    encode_class_args(&mut b, &big, Class::Demand);
    assert!(decode_class_args(&b).is_err());
}

/// A peer speaking `caps` (HELLO's answer), that answers FETCH_CLASS,
/// FETCH_DEMAND and FETCH_REPEATS with sevens and logs the procedures and
/// classes it was asked with.
async fn peer_logging_fetches(
    hello: Option<Caps>,
) -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<(u32, u32)>>>) {
    let (_, ok) = sevens();
    let mut res = Vec::new();
    encode_fetch_repeats_res(&mut res, &Ok(ok));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let (addr, _) = answering_server(move |vers, proc_| {
        log.lock().unwrap().push((vers, proc_));
        match (hello, vers, proc_) {
            // A proxy from before version 2.
            (None, v, _) if v != VERSION_1 => {
                let mismatch = ReplyStatus::ProgMismatch { low: 1, high: 1 };
                Some((mismatch, Vec::new()))
            }
            (Some(caps), _, PROC_HELLO) => Some((ReplyStatus::Success, hello_res(caps))),
            (_, _, PROC_FETCH_CLASS | PROC_FETCH_DEMAND | PROC_FETCH_REPEATS) => {
                Some((ReplyStatus::Success, res.clone()))
            }
            _ => Some((ReplyStatus::ProcUnavail, Vec::new())),
        }
    })
    .await;
    (addr, seen)
}

#[tokio::test]
async fn hello_agrees_on_fetch_class_and_fetches_carry_their_class() {
    let (addr, seen) = peer_logging_fetches(Some(Caps(hello_answer(Caps::ALL.0)))).await;
    let ext = client_of(addr, PROBE_TIMEOUT);
    let cred = Credentials::default();
    for class in [Class::Profile, Class::Demand] {
        let got = ext
            .fetch(&cred, &small_fetch(), &Want::local(class))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decompress(got).ok(), Some(vec![7u8; 4096]));
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (VERSION, PROC_HELLO),
            (VERSION, PROC_FETCH_CLASS),
            (VERSION, PROC_FETCH_CLASS)
        ]
    );
}

#[tokio::test]
async fn older_peers_get_fetch_demand_and_fetch_repeats() {
    // A version-2 peer of before FETCH_CLASS (HELLO's answer without its
    // bit), and a version-1 peer.
    let old_v2 = Caps::ALL.without(Caps::CLASS);
    for (hello, version) in [(Some(old_v2), VERSION), (None, VERSION_1)] {
        let (addr, seen) = peer_logging_fetches(hello).await;
        let ext = client_of(addr, PROBE_TIMEOUT);
        let cred = Credentials::default();
        for class in [Class::Demand, Class::Profile, Class::Bulk] {
            ext.fetch(&cred, &small_fetch(), &Want::local(class))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let fetches: Vec<(u32, u32)> = seen.lock().unwrap()[1..].to_vec();
        assert_eq!(
            fetches,
            [
                (version, PROC_FETCH_DEMAND),
                (version, PROC_FETCH_REPEATS),
                (version, PROC_FETCH_REPEATS)
            ],
            "{hello:?}"
        );
    }
}
