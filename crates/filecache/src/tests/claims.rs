//! Exact claims and classes: a profile's run claims its pieces only,
//! overlapping readers never fetch a piece twice, a sequential reader
//! goes as bulk, a reader raises the fetch it waits for.

use super::*;
use crate::fetch::state::FetchState;
use crate::pieces::{PIECE, span_bits};

const MIB: usize = CHUNK as usize;

#[test]
fn a_profile_run_claims_its_pieces_not_its_chunk() {
    let state = FetchState::new(vec![Chunk::Missing; 4], gvfs_ext::Tenant(9), Class::Profile);
    let at = u64::from(CHUNK) + 2 * u64::from(PIECE);
    let size = 4 * u64::from(CHUNK);
    let (fetch, waiting) = state.plan(at, at + 2 * u64::from(PIECE), size, Class::Profile);
    assert!(waiting);
    let planned: Vec<_> = fetch.iter().map(|p| (p.idx, p.pieces, p.wait)).collect();
    assert_eq!(planned, vec![(1, Some(span_bits(2, 3)), true)]);
    assert_eq!(
        state.chunks()[1],
        Chunk::Missing,
        "the chunk was claimed whole"
    );
    // Asked again while they are on their way: nothing more to fetch.
    let (fetch, waiting) = state.plan(at, at + 2 * u64::from(PIECE), size, Class::Profile);
    assert!(fetch.is_empty() && waiting);
    // A background stream's read of the chunk claims it whole.
    let (fetch, _) = state.plan(
        u64::from(CHUNK),
        2 * u64::from(CHUNK),
        size,
        Class::Background,
    );
    let planned: Vec<_> = fetch.iter().map(|p| (p.idx, p.pieces)).collect();
    assert_eq!(planned, vec![(1, None)]);
    // The entry's own fetches are its first requester's; a profile's
    // request does not make the stream more than background.
    assert_eq!(state.owner, gvfs_ext::Tenant(9));
    assert_eq!(state.stream_class(), Class::Background);
}

#[tokio::test]
async fn overlapping_readers_fetch_each_piece_once() {
    // The background stream claims its window and waits (no permits).
    let (_dir, fake, c, f) = started(b"fo", content(16 * MIB), false, None, false);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // A profile brings the rest: readers fetch only their pieces.
    f.fetch.set_profiled(true);
    let base = 12 * MIB as u64;
    let piece = u64::from(PIECE);
    let read = |from: u64, to: u64| {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move {
            let (at, len) = (base + from * piece, (to + 1 - from) * piece);
            let want = Want::local(Class::Demand);
            let (got, _) = f
                .read(
                    &c,
                    &src(&fake),
                    &Credentials::default(),
                    at,
                    len as u32,
                    &want,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(got[..] == fake.data[at as usize..(at + len) as usize]);
        })
    };
    let asked = |n: usize| {
        let fake = fake.clone();
        async move {
            while lock(&fake.fetched).len() < WINDOW + n {
                tokio::task::yield_now().await;
            }
        }
    };
    // Pieces 10..=20, then 5..=30 while the first are on their way.
    let a = read(10, 20);
    asked(1).await;
    let b = read(5, 30);
    asked(3).await;
    fake.gate.add_permits(1 << 20);
    a.await.unwrap_or_else(|e| panic!("{e}"));
    b.await.unwrap_or_else(|e| panic!("{e}"));
    let demand: Vec<(u64, u32)> = lock(&fake.fetched)
        .iter()
        .filter(|(_, _, class)| *class == Class::Demand)
        .map(|(o, n, _)| (*o, *n))
        .collect();
    let at = |p: u64| base + p * piece;
    assert_eq!(
        demand,
        vec![
            (at(10), 11 * PIECE),
            (at(5), 5 * PIECE),
            (at(21), 10 * PIECE)
        ]
    );
    let fetched: u64 = demand.iter().map(|(_, n)| u64::from(*n)).sum();
    assert_eq!(fetched, 26 * piece, "bytes fetched = bytes wanted");
    assert_eq!(c.stats().counts.raw_bytes % piece, 0);
}

#[tokio::test]
async fn a_sequential_reader_becomes_bulk_and_so_does_the_stream() {
    let (_dir, fake, c, f) = started(b"fq", content(64 * MIB), false, None, false);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let step = 256 << 10;
    let mut classes = Vec::new();
    for i in 0..crate::BULK_READS as u64 {
        classes.push(f.note_read(20 * MIB as u64 + i * step, step));
    }
    assert!(
        classes[..classes.len() - 1]
            .iter()
            .all(|c| *c == Class::Demand)
    );
    assert_eq!(classes.last(), Some(&Class::Bulk));
    assert_eq!(
        (f.reader_class(), f.fetch.stream_class()),
        (Class::Bulk, Class::Bulk)
    );
    // Its next read fetches its chunk whole, as bulk.
    let at = 40 * MIB as u64;
    let reader = {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move {
            let want = Want::local(Class::Bulk);
            f.read(&c, &src(&fake), &Credentials::default(), at, 4096, &want)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        })
    };
    while lock(&fake.fetched).len() < WINDOW + 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(lock(&fake.fetched)[WINDOW], (at, CHUNK, Class::Bulk));
    fake.gate.add_permits(1 << 20);
    reader.await.unwrap_or_else(|e| panic!("{e}"));
    while !f.complete() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // The stream's chunks after the window went as bulk too.
    let after: Vec<Class> = lock(&fake.fetched)[WINDOW + 1..]
        .iter()
        .map(|(_, _, class)| *class)
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|c| *c == Class::Bulk),
        "{after:?}"
    );
    assert!(c.stats().counts.bulk_wire_bytes > 0);
    // A read far back: a reader again, and the stream background.
    assert_eq!(f.note_read(0, 4096), Class::Demand);
    assert_eq!(f.fetch.stream_class(), Class::Background);
}

#[tokio::test]
async fn a_reader_raises_the_background_fetch_it_waits_for() {
    // The background stream claims its window and waits (no permits).
    let (_dir, fake, c, f) = started(b"fr", content(16 * MIB), false, None, false);
    while lock(&fake.fetched).len() < WINDOW {
        tokio::task::yield_now().await;
    }
    let classes = |fake: &Fake| -> Vec<Option<Class>> {
        lock(&fake.tickets)
            .iter()
            .map(|t| t.as_ref().map(|t| t.class()))
            .collect()
    };
    assert!(
        classes(&fake).iter().all(|c| *c == Some(Class::Background)),
        "{:?}",
        classes(&fake)
    );
    // A reader of chunk 1, which the stream fetches.
    let at = MIB as u64 + 4096;
    let reader = {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move {
            let want = Want::local(Class::Demand);
            f.read(&c, &src(&fake), &Credentials::default(), at, 4096, &want)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        })
    };
    let chunk = |o: u64| o / u64::from(CHUNK);
    let raised = |fake: &Fake| {
        let fetched = lock(&fake.fetched);
        let tickets = lock(&fake.tickets);
        fetched
            .iter()
            .zip(tickets.iter())
            .filter(|(_, t)| t.as_ref().map(|t| t.class()) == Some(Class::Demand))
            .map(|((o, _, class), _)| (chunk(*o), *class))
            .collect::<Vec<_>>()
    };
    for _ in 0..1000 {
        if !raised(&fake).is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Chunk 1's fetch, asked as background, now goes as demand; no other.
    assert_eq!(raised(&fake), vec![(1, Class::Background)]);
    assert_eq!(lock(&fake.fetched).len(), WINDOW, "fetched again");
    fake.gate.add_permits(1 << 20);
    let (got, _) = reader.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(got[..] == fake.data[at as usize..at as usize + 4096]);
}
