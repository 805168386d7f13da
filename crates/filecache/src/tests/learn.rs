//! Learnings that end on their own: a window after the first touch, a
//! size cap, and an end on request; profiles that name most of a file are
//! neither kept, sent nor used; a known profile is merged, bounded.

use super::*;
use crate::learn::{DEFAULT_LEARN_WINDOW, LEARN_TICK, LearnSettings};
use crate::pieces::PIECE;
use gvfs_ext::Profile;
use std::time::Duration;
use tokio::time::Instant;

const MIB: usize = CHUNK as usize;

/// A cache keeping profiles, learning with `window`, and an upstream
/// holding a file of `len` bytes (its fetches let through), whose
/// PROFILE_GET answers `known` (in pieces) if given.
fn learning(
    len: usize,
    window: Duration,
    known: Option<Vec<u32>>,
) -> (tempfile::TempDir, Arc<FileCache>, Arc<Fake>) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = index();
    let c = reopen_with(
        dir.path(),
        &index,
        FileCacheParts {
            profiles: Some(crate::Profiles::new(index.clone())),
            learn: LearnSettings { window },
            ..FileCacheParts::default()
        },
    );
    let fake = Fake::new(content(len), true);
    if let Some(parts) = known {
        *lock(&fake.profile) = Some(Profile::of(&fake.attrs, PIECE, parts));
    }
    (dir, c, fake)
}

/// The fetch of `fake` as `fh` in `c`, learning its readers' touches.
fn start(c: &Arc<FileCache>, fake: &Arc<Fake>, fh: &[u8]) -> Arc<CachedFile> {
    c.start(
        fh,
        &fake.attrs,
        None,
        fake.clone(),
        &Credentials::default(),
        true,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn touch_piece(f: &CachedFile, piece: u32) {
    f.touch(u64::from(piece) * u64::from(PIECE) + 100, 4096);
}

/// Waits (in paused time, a minute at most) until `fake` was sent a
/// profile; returns it.
async fn sent(fake: &Fake) -> Profile {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = lock(&fake.put).first() {
            return p.clone();
        }
        assert!(Instant::now() < give_up, "no profile sent in a minute");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The n-th piece a busy reader of a 32 MiB file touches: scattered (a
/// guest's faults jump back further than a copy's read-ahead).
fn scattered(n: u32) -> u32 {
    n * 1237 % 4096
}

#[tokio::test(start_paused = true)]
async fn a_busy_reader_is_published_when_the_window_closes() {
    let (_dir, c, fake) = learning(32 * MIB, DEFAULT_LEARN_WINDOW, None);
    let f = start(&c, &fake, b"fb");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let first = Instant::now();
    // A new piece every 100 ms, never quiet.
    let reader = {
        let f = f.clone();
        tokio::spawn(async move {
            for n in 0.. {
                touch_piece(&f, scattered(n));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let p = sent(&fake).await;
    let after = first.elapsed();
    assert!(
        after >= DEFAULT_LEARN_WINDOW && after <= DEFAULT_LEARN_WINDOW + LEARN_TICK,
        "sent {after:?} after the first touch"
    );
    // Only what was touched before the window closed: 20 s of touches.
    let want: Vec<u32> = (0..200).map(scattered).collect();
    assert_eq!(p.parts, want);
    let s = c.stats().counts;
    assert_eq!((s.learn_closed_time, s.learn_closed_quiet), (1, 0));
    assert_eq!(s.profiles_sent, 1);
    let kept = c.profiles.as_ref().and_then(|p| p.get(b"fb", &fake.attrs));
    assert_eq!(kept.map(|p| p.parts), Some(want));
    reader.abort();
}

#[tokio::test(start_paused = true)]
async fn the_size_cap_closes_the_window_and_most_of_a_file_is_not_kept() {
    // 16 MiB: 2048 data pieces, of which 1365 may be a profile.
    let share = 2048 * 2 / 3;
    for (touched, too_big) in [(share, false), (share + 1, true)] {
        let (_dir, c, fake) = learning(16 * MIB, DEFAULT_LEARN_WINDOW, None);
        let f = start(&c, &fake, b"fs");
        tokio::time::sleep(Duration::from_millis(30)).await;
        for n in 0..touched {
            touch_piece(&f, n * 7 % 2048);
        }
        // Closed at once by size (long before the readers went quiet)...
        tokio::time::sleep(LEARN_TICK + Duration::from_millis(10)).await;
        let s = c.stats().counts;
        assert_eq!(s.learn_closed_size, u64::from(too_big), "{touched}");
        assert_eq!(s.profiles_too_big, u64::from(too_big), "{touched}");
        // ... and neither kept nor sent.
        if too_big {
            assert!(lock(&fake.put).is_empty());
            assert!(c.profiles.as_ref().and_then(|p| p.peek(b"fs")).is_none());
        } else {
            // At the share: a profile, once the readers go quiet.
            assert_eq!(sent(&fake).await.parts.len(), share as usize);
            assert_eq!(c.stats().counts.learn_closed_quiet, 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn ending_a_learning_publishes_it_at_once() {
    let (_dir, c, fake) = learning(32 * MIB, DEFAULT_LEARN_WINDOW, None);
    let f = start(&c, &fake, b"fe");
    let other = start(&c, &fake, b"fo");
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Scattered: a copy's order teaches nothing.
    for chunk in [30u32, 2, 9] {
        touch_piece(&f, chunk * (CHUNK / PIECE));
    }
    touch_piece(&other, 5);
    assert_eq!(c.end_learning(|fh| fh == b"fx"), 0);
    let asked = Instant::now();
    assert_eq!(c.end_learning(|fh| fh == b"fe"), 1);
    // Ended already.
    assert_eq!(c.end_learning(|fh| fh == b"fe"), 0);
    let p = sent(&fake).await;
    assert!(asked.elapsed() < LEARN_TICK, "{:?}", asked.elapsed());
    let per = CHUNK / PIECE;
    assert_eq!(p.parts, vec![30 * per, 2 * per, 9 * per]);
    let s = c.stats().counts;
    assert_eq!((s.learn_ended_early, s.profiles_sent), (1, 1));
    // The other file's learning goes on.
    assert!(lock(&other.learning).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_known_profile_is_merged_after_this_clones_order() {
    let per = CHUNK / PIECE;
    let known: Vec<u32> = [14, 2, 9, 0, 12, 5, 15, 1].map(|c| c * per).to_vec();
    let (_dir, c, fake) = learning(16 * MIB, DEFAULT_LEARN_WINDOW, Some(known.clone()));
    let f = start(&c, &fake, b"fm");
    // Wait for the fetch to start with the known profile.
    while c.stats().counts.profile_hits == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ours = [12 * per + 3, 3 * per, 14 * per + 1, 5 * per];
    for p in ours {
        touch_piece(&f, p);
    }
    let p = sent(&fake).await;
    // This clone's order, then what it missed: 7 of them in all (7/8 of
    // the known profile; 5/4 of this clone's would be 5).
    assert_eq!(
        p.parts,
        vec![
            12 * per + 3,
            3 * per,
            14 * per + 1,
            5 * per,
            14 * per,
            2 * per,
            9 * per
        ]
    );
    // The same pieces in the known order: nothing sent.
    let (_dir, c, fake) = learning(16 * MIB, DEFAULT_LEARN_WINDOW, Some(known.clone()));
    let f = start(&c, &fake, b"fu");
    while c.stats().counts.profile_hits == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for &p in &known {
        touch_piece(&f, p);
    }
    tokio::time::sleep(crate::LEARN_QUIET * 2).await;
    assert!(lock(&fake.put).is_empty());
    assert_eq!(c.stats().counts.profiles_unchanged, 1);
}

#[tokio::test]
async fn a_profile_naming_most_of_a_file_is_not_used() {
    // 4 MiB: 512 pieces of data; a profile may name 341 of them.
    for (parts, used) in [(341u32, true), (342, false)] {
        let known: Vec<u32> = (0..parts).map(|n| n * 3 % 512).collect();
        let (_dir, c, fake) = learning(4 * MIB, DEFAULT_LEARN_WINDOW, Some(known));
        let f = c
            .start(
                b"fk",
                &fake.attrs,
                None,
                fake.clone(),
                &Credentials::default(),
                false,
                &FIRST,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let (all, _) = f
            .read(
                &c,
                &src(&fake),
                &Credentials::default(),
                0,
                fake.data.len() as u32,
                &BACKGROUND,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(all == fake.data);
        let s = c.stats().counts;
        assert_eq!(s.profile_hits, u64::from(used), "{parts} parts");
        let profiled = lock(&fake.fetched)
            .iter()
            .any(|(_, _, class)| *class == Class::Profile);
        assert_eq!(profiled, used, "{parts} parts");
        // Not kept here either.
        let kept = c.profiles.as_ref().and_then(|p| p.peek(b"fk")).is_some();
        assert_eq!(kept, used, "{parts} parts");
    }
}
