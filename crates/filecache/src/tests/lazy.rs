//! Lazy clones' side of the file cache: readers' own fetches go as demand,
//! a known profile's chunks are fetched first, and readers' first touches
//! are learned as a profile and sent upstream.

use super::*;
use gvfs_ext::Profile;

const MIB: usize = CHUNK as usize;

fn state(f: &CachedFile, idx: usize) -> Chunk {
    f.fetch.chunks()[idx]
}

fn learning_cache(data: Vec<u8>) -> (tempfile::TempDir, Arc<FileCache>, Arc<Fake>) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = index();
    let profiles = Some(crate::Profiles::new(index.clone()));
    let c = reopen_with(
        dir.path(),
        &index,
        FileCacheParts {
            profiles,
            ..FileCacheParts::default()
        },
    );
    (dir, c, Fake::new(data, true))
}

/// The fetch of `fake` as file `fh` started in `c`, learning when `learn`.
fn start(c: &Arc<FileCache>, fake: &Arc<Fake>, fh: &[u8], learn: bool) -> Arc<CachedFile> {
    c.start(
        fh,
        &fake.attrs,
        None,
        fake.clone(),
        &Credentials::default(),
        learn,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

async fn read_at(c: &Arc<FileCache>, f: &Arc<CachedFile>, fake: &Arc<Fake>, chunk: usize) {
    let off = (chunk * MIB + 100) as u64;
    f.touch(off, 4096);
    let (got, _) = f
        .read(c, &src(fake), &Credentials::default(), off, 4096, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got[..] == fake.data[chunk * MIB + 100..chunk * MIB + 4196]);
}

#[tokio::test]
async fn a_readers_own_fetch_goes_as_demand_and_is_counted_as_a_fault() {
    // Fetches are held: the background stream claims its window and
    // waits; the far read must fetch its chunk itself, as demand.
    let len = 40 * MIB;
    let (_dir, fake, c, f) = started(b"fd", content(len), false, None, false);
    tokio::task::yield_now().await;
    fake.gate.add_permits(1 << 20);
    read_at(&c, &f, &fake, 30).await;
    let demand = |fake: &Fake| -> Vec<(u64, u32)> {
        let mut d: Vec<(u64, u32)> = lock(&fake.fetched)
            .iter()
            .filter(|(_, _, u)| *u == Class::Demand)
            .map(|(o, c, _)| (*o, *c))
            .collect();
        d.sort_unstable();
        d
    };
    // No working-set profile: the piece the read needs as demand, and the
    // rest of its chunk behind it, for the faults near it, as the stream's
    // class (no reader waits for it).
    let at = 30 * MIB as u64;
    while state(&f, 30) != Chunk::Present {
        tokio::task::yield_now().await;
    }
    let (piece, run) = (u64::from(PIECE), u64::from(STREAM_RUN * PIECE));
    assert_eq!(demand(&fake), vec![(at, PIECE)]);
    let rest: Vec<(u64, u32)> = lock(&fake.fetched)
        .iter()
        .filter(|(o, _, u)| *u == Class::Background && *o / MIB as u64 == 30)
        .map(|(o, c, _)| (*o, *c))
        .collect();
    assert_eq!(
        rest,
        vec![
            (at + piece, STREAM_RUN * PIECE - PIECE),
            (at + run, STREAM_RUN * PIECE)
        ]
    );
    let s = c.stats().counts;
    assert_eq!(s.faults_waited, 1);
    assert!(s.demand_wire_bytes > 0 && s.demand_wire_bytes < s.wire_bytes);
    // With one (it brings the rest of the working set): only the piece
    // the read needs.
    let (_dir, fake, c, f) = started(b"fp", content(len), false, None, false);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    f.fetch.set_profiled(true);
    // The background's window, then the reader's piece.
    fake.gate.add_permits(WINDOW + 1);
    read_at(&c, &f, &fake, 33).await;
    assert_eq!(demand(&fake), vec![(33 * MIB as u64, PIECE)]);
    fake.gate.add_permits(1 << 20);
}

/// A file of `mibs` chunks whose background stream has claimed its
/// window and waits (no permits), and a reader of chunk `chunk`, once its
/// piece and the rest of its chunk have been asked for.
async fn fault_behind_the_window(
    mibs: usize,
    chunk: usize,
) -> (
    tempfile::TempDir,
    Arc<Fake>,
    Arc<FileCache>,
    Arc<CachedFile>,
    tokio::task::JoinHandle<()>,
) {
    let (dir, fake, c, f) = started(b"fw", content(mibs * MIB), false, None, false);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let reader = {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move { read_at(&c, &f, &fake, chunk).await })
    };
    while fake.calls.load(Ordering::Relaxed) < WINDOW as u64 + 2 {
        tokio::task::yield_now().await;
    }
    (dir, fake, c, f, reader)
}

#[tokio::test]
async fn a_reader_waits_for_its_piece_not_for_the_rest_of_its_chunk() {
    let (_dir, fake, _c, f, reader) = fault_behind_the_window(16, 12).await;
    let at = 12 * MIB as u64;
    let asked: Vec<(u64, u32)> = lock(&fake.fetched)[WINDOW..]
        .iter()
        .map(|(o, c, _)| (*o, *c))
        .collect();
    // The rest in runs, one at a time: the first from the piece on.
    assert_eq!(
        asked,
        vec![
            (at, PIECE),
            (at + u64::from(PIECE), STREAM_RUN * PIECE - PIECE)
        ]
    );
    // The background's window and the piece through (in the order they
    // asked), not the rest: the reader has its bytes.
    fake.gate.add_permits(WINDOW + 1);
    tokio::time::timeout(std::time::Duration::from_secs(10), reader)
        .await
        .unwrap_or_else(|_| panic!("the reader waited for the rest of its chunk"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(state(&f, 12), Chunk::Present);
    fake.gate.add_permits(1 << 20);
}

#[tokio::test]
async fn the_background_stream_goes_on_after_a_readers_fault() {
    let (_dir, fake, c, f, reader) = fault_behind_the_window(40, 30).await;
    fake.gate.add_permits(1 << 20);
    reader.await.unwrap_or_else(|e| panic!("{e}"));
    while !f.complete() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    read_all(&c, &f, &fake).await;
    let background: Vec<u64> = lock(&fake.fetched)
        .iter()
        .filter(|(_, _, u)| *u == Class::Background)
        .map(|(o, _, _)| *o / MIB as u64)
        .collect();
    // The first window, the rest of the reader's chunk (two runs, behind
    // its piece), then on from chunk 31 to the end, then what that passed
    // over.
    let want: Vec<u64> = (0..WINDOW as u64)
        .chain([30, 30])
        .chain(31..40)
        .chain(8..30)
        .collect();
    assert_eq!(background, want);
}

#[tokio::test]
async fn the_background_stream_holds_back_while_readers_fetch() {
    let len = 64 * MIB;
    let (_dir, fake, c, f) = started(b"fw", content(len), false, None, false);
    // Let the background stream fill its window.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(fake.calls.load(Ordering::Relaxed), WINDOW as u64);
    // A reader's fetch of chunk 50 is under way (held at the gate).
    let reader = {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move { read_at(&c, &f, &fake, 50).await })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(f.fetch.demand_active());
    // Let the background's chunks through one at a time: while the
    // demand fetch is under way no new background chunk starts until
    // fewer than UNDER_DEMAND are in flight.
    let before = fake.calls.load(Ordering::Relaxed);
    fake.gate.add_permits(WINDOW - UNDER_DEMAND);
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        fake.calls.load(Ordering::Relaxed),
        before,
        "the background stream started chunks while a reader waited"
    );
    fake.gate.add_permits(1 << 20);
    reader.await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn a_known_profile_is_fetched_first_and_a_stale_one_is_not() {
    let len = 24 * MIB;
    for (mtime, used) in [(7, true), (8, false)] {
        let (_dir, c, fake) = learning_cache(content(len));
        let per = CHUNK / PIECE;
        let plan = vec![17 * per + 2, 3 * per, 3 * per + 1, 21 * per + 5];
        *lock(&fake.profile) = Some(Profile::of(&attrs(len as u64, mtime), PIECE, plan.clone()));
        let f = start(&c, &fake, b"fp", false);
        read_all(&c, &f, &fake).await;
        let fetched = lock(&fake.fetched).clone();
        let first: Vec<(u64, u32)> = fetched
            .iter()
            .filter(|(_, _, u)| *u == Class::Profile)
            .map(|(o, c, _)| (*o, *c))
            .collect();
        let s = c.stats().counts;
        if used {
            // In its order, consecutive pieces of a chunk in one run.
            let at = |p: u32| u64::from(p) * u64::from(PIECE);
            let want = vec![
                (at(plan[0]), PIECE),
                (at(plan[1]), 2 * PIECE),
                (at(plan[3]), PIECE),
            ];
            assert_eq!(first, want, "{fetched:?}");
            assert_eq!((s.profile_hits, s.profile_pieces), (1, 4));
            assert!(s.profile_wire_bytes > 0);
        } else {
            assert!(first.is_empty(), "a stale profile was used: {fetched:?}");
            assert_eq!(s.profile_hits, 0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn readers_first_touches_are_learned_kept_and_sent_upstream() {
    let len = 32 * MIB;
    let (_dir, c, fake) = learning_cache(content(len));
    let f = start(&c, &fake, b"fl", true);
    for chunk in [9, 2, 9, 30, 2, 5] {
        read_at(&c, &f, &fake, chunk).await;
    }
    assert!(
        lock(&fake.put).is_empty(),
        "sent before the readers went quiet"
    );
    tokio::time::sleep(LEARN_QUIET * 2).await;
    let put = lock(&fake.put).clone();
    assert_eq!(put.len(), 1, "{put:?}");
    let per = CHUNK / PIECE;
    let want = vec![9 * per, 2 * per, 30 * per, 5 * per];
    assert_eq!((put[0].unit, &put[0].parts), (PIECE, &want));
    assert!(put[0].version().describes(&fake.attrs));
    assert_eq!(c.stats().counts.profiles_sent, 1);
    // Kept here too: the next fetch of this version starts with it.
    let kept = c.profiles.as_ref().and_then(|p| p.get(b"fl", &fake.attrs));
    assert_eq!(kept.map(|p| p.parts), Some(want));
}

#[tokio::test(start_paused = true)]
async fn a_reader_of_the_whole_file_teaches_nothing() {
    let len = 8 * MIB;
    let (_dir, c, fake) = learning_cache(content(len));
    let f = start(&c, &fake, b"fc", true);
    for chunk in 0..8 {
        let at = (chunk * MIB) as u64;
        f.touch(at, MIB as u64);
        f.read(&c, &src(&fake), &Credentials::default(), at, CHUNK, &DEMAND)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    tokio::time::sleep(LEARN_QUIET * 2).await;
    assert!(lock(&fake.put).is_empty());
    assert_eq!(c.stats().counts.profiles_discarded, 1);
}

/// A cache learning nothing, with `fake`'s profile set to `parts` (in
/// pieces), and the fetch of it started: nothing passes the gate yet.
fn with_profile(len: usize, parts: Vec<u32>) -> (tempfile::TempDir, Arc<FileCache>, Arc<Fake>) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let profiles = Some(crate::Profiles::new(index()));
    let c = reopen_with(
        dir.path(),
        &index(),
        FileCacheParts {
            profiles,
            ..FileCacheParts::default()
        },
    );
    let fake = Fake::new(content(len), false);
    *lock(&fake.profile) = Some(Profile::of(&fake.attrs, PIECE, parts));
    (dir, c, fake)
}

/// Reads all of `f` (as the background stream does) and checks it.
async fn read_all(c: &Arc<FileCache>, f: &Arc<CachedFile>, fake: &Arc<Fake>) {
    let len = fake.data.len() as u32;
    let (all, _) = f
        .read(c, &src(fake), &Credentials::default(), 0, len, &BACKGROUND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(all == fake.data);
}

#[tokio::test]
async fn a_profile_is_fetched_many_pieces_at_once_but_so_many_bytes_at_most() {
    let per = CHUNK / PIECE;
    // Scattered single pieces: a bandwidth-delay product of them.
    let single: Vec<u32> = (0..200).map(|i| (i % 8) * per + i / 8 * 4).collect();
    // Runs of 8 pieces (64 KiB): PROFILE_BYTES of them.
    let runs: Vec<u32> = (0..40 * 8)
        .map(|i| (i / 8 % 8) * per + i / 64 * 16 + i % 8)
        .collect();
    for (parts, want) in [
        (single, PROFILE_WINDOW),
        (runs, (PROFILE_BYTES / u64::from(8 * PIECE)) as usize),
    ] {
        let (_dir, c, fake) = with_profile(8 * MIB, parts);
        let f = start(&c, &fake, b"fw", false);
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(fake.calls.load(Ordering::Relaxed), want as u64);
        assert!(
            lock(&fake.fetched)
                .iter()
                .all(|(_, _, u)| *u == Class::Profile)
        );
        fake.gate.add_permits(1 << 20);
        read_all(&c, &f, &fake).await;
    }
}

#[tokio::test]
async fn the_rest_of_a_chunk_a_profile_left_pieces_of_comes_in_one_fetch() {
    let per = CHUNK / PIECE;
    // Chunk 3: its first two pieces and its last one; chunk 5: two in
    // the middle.
    let parts = vec![
        3 * per,
        3 * per + 1,
        4 * per - 1,
        5 * per + 10,
        5 * per + 20,
    ];
    let (_dir, c, fake) = with_profile(8 * MIB, parts);
    let f = start(&c, &fake, b"fr", false);
    // The profile's fetches (four runs) are all on their way before any
    // passes the gate.
    while fake.calls.load(Ordering::Relaxed) < 4 {
        tokio::task::yield_now().await;
    }
    fake.gate.add_permits(1 << 20);
    read_all(&c, &f, &fake).await;
    let of_chunk = |idx: u64| -> Vec<(u64, u32)> {
        let at = idx * u64::from(CHUNK);
        lock(&fake.fetched)
            .iter()
            .filter(|(o, _, u)| *u == Class::Background && (at..at + u64::from(CHUNK)).contains(o))
            .map(|(o, c, _)| (*o, *c))
            .collect()
    };
    let at = |p: u32| u64::from(p) * u64::from(PIECE);
    // The pieces between those here, in one run ...
    assert_eq!(of_chunk(3), vec![(at(3 * per + 2), (per - 3) * PIECE)]);
    // ... and around two pieces in its middle, still on their way when
    // the stream came to the chunk, the runs between them: never the two
    // again.
    let mut runs = of_chunk(5);
    runs.sort_unstable();
    let at5 = |p: u32| at(5 * per + p);
    assert_eq!(
        runs,
        vec![
            (at5(0), 10 * PIECE),
            (at5(11), 9 * PIECE),
            (at5(21), (per - 21) * PIECE)
        ]
    );
}
