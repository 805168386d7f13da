use super::*;
use crate::chunks::Chunk;
use crate::fetch::rest::STREAM_RUN;
use crate::index::MemIndex;
use crate::names::file_name;
use gvfs_ext::FetchOk;
use gvfs_ext::{CHUNK, ChunkSource, Class, Want};
use gvfs_metafile::ZeroMap;
use gvfs_metafile::{ByteRepeat, MetaFile};
use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::nfsstat3;
use std::borrow::Cow;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

mod claims;
mod crash;
mod frames;
mod lazy;
mod learn;

pub(crate) use gvfs_nfs::testing::file_attrs as attrs;

pub(crate) use gvfs_ext::testing::FakeSource as Fake;

/// What the first request of a test's file wants: this proxy's own
/// background fetch.
pub(crate) const FIRST: Want = BACKGROUND;
/// A reader's fetch here.
pub(crate) const DEMAND: Want = Want::local(Class::Demand);
/// The background stream's, or another proxy's background FETCH.
pub(crate) const BACKGROUND: Want = Want::local(Class::Background);

/// `fake` as the file cache's reads take their source.
fn src(fake: &Arc<Fake>) -> Arc<dyn ChunkSource> {
    fake.clone()
}

fn content(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            if (i >> 20) % 3 == 1 {
                0
            } else {
                (i * 7 / 4096) as u8
            }
        })
        .collect()
}

fn index() -> Arc<dyn MetaIndex> {
    Arc::new(MemIndex::new(100))
}

/// Opens (or reopens, as after a restart) a 1 GiB cache in `dir`.
fn reopen(dir: &Path, index: &Arc<dyn MetaIndex>) -> Arc<FileCache> {
    reopen_with(dir, index, FileCacheParts::default())
}

fn reopen_with(dir: &Path, index: &Arc<dyn MetaIndex>, parts: FileCacheParts) -> Arc<FileCache> {
    FileCache::open(dir, Some(index.clone()), 1 << 30, parts).unwrap_or_else(|e| panic!("{e}"))
}

fn cache(dir: &Path) -> Arc<FileCache> {
    reopen(dir, &index())
}

/// A fresh directory, an index, a cache opened on both (reopen it with
/// [`reopen`] to stand for a restart) and an upstream holding `data`.
fn restartable(
    data: Vec<u8>,
) -> (
    tempfile::TempDir,
    Arc<dyn MetaIndex>,
    Arc<FileCache>,
    Arc<Fake>,
) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = index();
    let c = reopen(dir.path(), &index);
    (dir, index, c, Fake::new(data, true))
}

/// A cache in a fresh directory (keeping frames when `frames`) with the
/// fetch of `data` as file `fh` started, its fetches let through when
/// `open`.
fn started(
    fh: &[u8],
    data: Vec<u8>,
    open: bool,
    zero: Option<&MetaFile>,
    frames: bool,
) -> (
    tempfile::TempDir,
    Arc<Fake>,
    Arc<FileCache>,
    Arc<CachedFile>,
) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fake = Fake::new(data, open);
    let c = cache(dir.path());
    if frames {
        c.keep_frames();
    }
    let f = c
        .start(
            fh,
            &fake.attrs,
            zero,
            fake.clone(),
            &Credentials::default(),
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    (dir, fake, c, f)
}

#[tokio::test]
async fn fetches_whole_file_and_skips_zero_chunks() {
    let len = 10 * CHUNK as usize + 1234;
    // Chunks 1, 4, 7 are zeros (content() makes them so).
    let meta = zero_meta(len, &[1, 4, 7]);
    let (_dir, fake, c, f) = started(b"fh1", content(len), true, Some(&meta), false);
    let cred = Credentials::default();
    let (all, eof) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(eof);
    assert!(all == fake.data, "file cache bytes differ");
    assert_eq!(
        fake.calls.load(Ordering::Relaxed),
        8,
        "3 of 11 chunks are zeros"
    );
    let s = c.stats();
    assert_eq!((s.counts.zero_chunks, s.counts.chunks_fetched), (3, 8));
    assert!(s.counts.wire_bytes < s.counts.raw_bytes);
}

#[tokio::test]
async fn a_source_that_wants_parts_gets_background_chunks_in_parts() {
    let len = 3 * CHUNK as usize + 5000;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fake = Fake::new(content(len), true);
    let part = 256 << 10;
    fake.part.store(part, Ordering::Relaxed);
    let c = cache(dir.path());
    let f = c
        .start(
            b"fp",
            &fake.attrs,
            None,
            fake.clone(),
            &Credentials::default(),
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let (all, _) = f
        .read(
            &c,
            &src(&fake),
            &Credentials::default(),
            0,
            len as u32,
            &DEMAND,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(all == fake.data, "file cache bytes differ");
    // Chunk 1 is zeros (content()), but without a zero map it is fetched.
    let mut got: Vec<(u64, u32, Class)> = lock(&fake.fetched).clone();
    got.sort_unstable_by_key(|g| g.0);
    let want: Vec<(u64, u32, Class)> = (0..len as u64)
        .step_by(part as usize)
        .map(|o| (o, part.min((len as u64 - o) as u32), Class::Background))
        .collect();
    assert_eq!(got, want);
    // A source that wants whole chunks (the default) gets them.
    let (_dir, fake, c, _f) = started(b"fq", content(len), true, None, false);
    whole(&c).await;
    assert_eq!(fake.calls.load(Ordering::Relaxed), 4);
}

/// `data` with `(to, from, len)` made repeats of earlier bytes, and
/// those repeats listed.
fn with_repeats(mut data: Vec<u8>, list: &[(u64, u64, u32)]) -> (Vec<u8>, Vec<ByteRepeat>) {
    let mut out = Vec::new();
    for &(to, from, len) in list {
        let (t, f, n) = (to as usize, from as usize, len as usize);
        data.copy_within(f..f + n, t);
        out.push(ByteRepeat { to, from, len });
    }
    (data, out)
}

#[tokio::test]
async fn repeated_bytes_are_copied_from_earlier_ones_in_any_order() {
    let c = u64::from(CHUNK);
    let len = 6 * CHUNK as usize;
    let (data, list) = with_repeats(
        content(len),
        &[
            // From chunk 0 into chunk 2.
            (2 * c + 4096, 8192, 3 * 4096),
            // Within chunk 3.
            (3 * c + 65536, 3 * c, 4096),
            // From across the end of chunk 3 into chunk 5 (chunk 4 is
            // zeros in content()).
            (5 * c + 4096, 4 * c - 4096, 8192),
            // Into the last bytes of the file.
            (6 * c - 4096, 5 * 4096, 4096),
        ],
    );
    for read_last_first in [false, true] {
        let (_dir, fake, cache, f) = started(b"fhr", data.clone(), true, None, false);
        *lock(&fake.repeats) = list.clone();
        let cred = Credentials::default();
        if read_last_first {
            // A reader that needs the last chunk before the others came.
            let at = 6 * c - 4096;
            let (got, _) = f
                .read(&cache, &src(&fake), &cred, at, 4096, &DEMAND)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(*got, data[at as usize..]);
        }
        let (all, _) = f
            .read(&cache, &src(&fake), &cred, 0, len as u32, &DEMAND)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            all == data,
            "file cache bytes differ (last first: {read_last_first})"
        );
        assert_eq!(
            cache.stats().counts.repeat_bytes,
            3 * 4096 + 4096 + 8192 + 4096
        );
    }
}

#[tokio::test]
async fn repeats_that_do_not_fit_their_chunk_fail_the_fetch() {
    let c = u64::from(CHUNK);
    for bad in [
        // The source after the repeat; the source overlapping it; out
        // of order.
        vec![ByteRepeat {
            to: c + 4096,
            from: c + 8192,
            len: 4096,
        }],
        vec![ByteRepeat {
            to: c + 4096,
            from: c,
            len: 8192,
        }],
        vec![
            ByteRepeat {
                to: c + 8192,
                from: 0,
                len: 4096,
            },
            ByteRepeat {
                to: c + 4096,
                from: 0,
                len: 4096,
            },
        ],
    ] {
        let (_dir, fake, cache, f) =
            started(b"fhb", content(3 * CHUNK as usize), true, None, false);
        *lock(&fake.repeats) = bad.clone();
        let err = f
            .read(
                &cache,
                &src(&fake),
                &Credentials::default(),
                0,
                3 * CHUNK,
                &DEMAND,
            )
            .await
            .map(|_| ())
            .expect_err("a lying repeat");
        assert!(
            matches!(
                err,
                FileCacheError::Chunk(gvfs_ext::ChunkError::RepeatOutside { .. })
            ),
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains("does not fit"), "{err}");
    }
}

#[tokio::test]
async fn a_repeat_from_a_chunk_of_zeros_fails_the_fetch() {
    let len = 3 * CHUNK as usize;
    // content() makes chunk 1 zeros; the zero map says so.
    let meta = zero_meta(len, &[1]);
    let (_dir, fake, cache, f) = started(b"fhz", content(len), true, Some(&meta), false);
    *lock(&fake.repeats) = vec![ByteRepeat {
        to: 2 * u64::from(CHUNK),
        from: u64::from(CHUNK) + 4096,
        len: 4096,
    }];
    let cred = Credentials::default();
    let err = f
        .read(&cache, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .map(|_| ())
        .expect_err("the repeat contradicts the zero map");
    assert!(
        matches!(err, FileCacheError::RepeatFromZeros { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chunk of zeros"), "{err}");
}

#[tokio::test]
async fn a_read_far_ahead_is_served_before_the_rest() {
    let len = 40 * CHUNK as usize;
    let (_dir, fake, c, f) = started(b"fh2", content(len), false, None, false);
    let cred = Credentials::default();
    // Let the background window and the reader's own chunk through.
    fake.gate.add_permits(WINDOW + 1);
    let at = 30 * u64::from(CHUNK) + 5;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at, 1000, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(*got, fake.data[at as usize..at as usize + 1000]);
    assert!(!f.complete(), "served before the end arrived");
    fake.gate.add_permits(1 << 20);
    let (all, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(all == fake.data);
}

#[tokio::test]
async fn a_reader_that_goes_away_mid_fetch_leaves_no_chunk_stranded() {
    let len = 40 * CHUNK as usize;
    let (_dir, fake, c, f) = started(b"fh9", content(len), false, None, false);
    let cred = Credentials::default();
    // A client asks far ahead of the background window, then goes
    // away (its connection closed) while its chunk is on the wire.
    let at = 30 * u64::from(CHUNK);
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        f.read(&c, &src(&fake), &cred, at, 1000, &DEMAND),
    )
    .await;
    assert!(gone.is_err(), "the read waited for its chunk");
    fake.gate.add_permits(1 << 20);
    // Its chunk still arrives: the file completes, and reads of it end.
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at, 1000, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(*got, fake.data[at as usize..at as usize + 1000]);
    let fetched: u64 = lock(&fake.fetched).iter().map(|f| u64::from(f.1)).sum();
    assert_eq!(fetched, len as u64, "a byte fetched twice, or never");
}

#[tokio::test]
async fn concurrent_users_share_one_fetch_and_restart_keeps_it() {
    let len = 6 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(content(len));
    let cred = Credentials::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, fake, cred) = (c.clone(), fake.clone(), cred.clone());
        tasks.push(tokio::spawn(async move {
            let f = c.start(
                b"fh3",
                &fake.attrs,
                None,
                fake.clone(),
                &cred,
                false,
                &FIRST,
            )?;
            f.read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND).await
        }));
    }
    for t in tasks {
        let (got, _) = t
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(got == fake.data);
    }
    assert_eq!(fake.calls.load(Ordering::Relaxed), 6, "one fetch per chunk");
    // Wait for the record, then reopen: the file is kept, nothing fetched.
    whole(&c).await;
    drop(c);
    // Unfinished files without a progress log that loads are removed;
    // those with one are kept (`tests/crash.rs`).
    for (name, log) in [("abcd", None), ("abce", Some(&b"GVFP torn"[..]))] {
        std::fs::write(dir.path().join(name), b"half a fetch").unwrap_or_else(|e| panic!("{e}"));
        if let Some(log) = log {
            std::fs::write(dir.path().join(format!("{name}.progress")), log)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let c = reopen(dir.path(), &index);
    for name in ["abcd", "abce", "abce.progress"] {
        assert!(
            !dir.path().join(name).exists(),
            "{name}: files without progress are removed"
        );
    }
    assert_eq!(c.stats().counts.kept_files, 0);
    let f = c
        .get(b"fh3")
        .unwrap_or_else(|| panic!("kept across reopen"));
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == fake.data);
    assert_eq!(fake.calls.load(Ordering::Relaxed), 6);
}

#[tokio::test]
async fn zero_chunks_stay_unread_after_a_restart() {
    let len = 10 * CHUNK as usize + 1234;
    let meta = zero_meta(len, &[1, 4, 7]);
    let (dir, index, c, fake) = restartable(content(len));
    let cred = Credentials::default();
    c.start(
        b"fh0",
        &fake.attrs,
        Some(&meta),
        fake.clone(),
        &cred,
        false,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    drop(c);
    // The zero map is not asked again: the file's holes tell.
    let c = reopen(dir.path(), &index);
    let f = c
        .get(b"fh0")
        .unwrap_or_else(|| panic!("kept across reopen"));
    let zero: Vec<usize> = f
        .fetch
        .chunks()
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == Chunk::Zero)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(zero, [1, 4, 7]);
    let at = 4 * u64::from(CHUNK);
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at, CHUNK, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(got, Cow::Borrowed(_)) && got.iter().all(|&b| b == 0),
        "a zero chunk was read from the file"
    );
    let (all, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(all == fake.data);
    assert_eq!(
        fake.calls.load(Ordering::Relaxed),
        8,
        "nothing fetched again"
    );
}

#[tokio::test]
async fn writes_stay_local_survive_a_reopen_and_are_written_back() {
    let len = 5 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(content(len));
    let cred = Credentials::unix(7, 8);
    let f = c
        .start(
            b"fh5",
            &fake.attrs,
            None,
            fake.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // A write before the file is whole is refused (the caller forwards it).
    f.read(&c, &src(&fake), &cred, 0, 10, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    // A write far past the end is refused before anything grows.
    let huge = f.write(&c, &cred, 1 << 60, b"x".to_vec(), false).await;
    assert!(huge.is_err(), "a write at 2^60 was taken");
    let at = 2 * u64::from(CHUNK) - 3;
    let (before, after) = f
        .write(&c, &cred, at, b"abcdef".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((before.size, after.size), (len as u64, len as u64));
    // Past the end: the file grows.
    let (_, after) = f
        .write(&c, &cred, len as u64 + 10, b"tail".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(after.size, len as u64 + 14);
    f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
    let mut want = fake.data.clone();
    want[at as usize..at as usize + 6].copy_from_slice(b"abcdef");
    want.resize(len + 10, 0);
    want.extend_from_slice(b"tail");
    // Reopened (a restart after COMMIT): the writes are still there.
    drop((f, c));
    let c = reopen(dir.path(), &index);
    let f = c.get(b"fh5").unwrap_or_else(|| panic!("dirty file kept"));
    assert!(f.is_dirty());
    let (got, eof) = f
        .read(&c, &src(&fake), &cred, 0, len as u32 + 100, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(eof && got == want, "reads see the writes");
    // Write-back sends chunks 1, 2 and 5 (the touched ones), compressed.
    let bytes = c
        .write_back(fake.as_ref())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stored = lock(&fake.stored).clone();
    let offsets: Vec<u64> = stored.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        vec![u64::from(CHUNK), 2 * u64::from(CHUNK), 5 * u64::from(CHUNK)]
    );
    assert_eq!(bytes, 2 * u64::from(CHUNK) + 14);
    for (o, raw) in &stored {
        assert!(raw[..] == want[*o as usize..*o as usize + raw.len()]);
    }
    assert!(c.get(b"fh5").is_none(), "a written-back file is let go");
    assert!(c.stats().counts.written_back_wire_bytes < bytes);
}

/// Item 6a of issue 20: a file changed at the origin after it was
/// fetched is not written over. The write-back stops at the guard, the
/// local writes stay (served, dirty, kept across a reopen), the
/// conflict is counted; the other dirty files are still written back.
#[tokio::test]
async fn a_write_back_does_not_overwrite_a_change_made_at_the_origin() {
    let len = 3 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(content(len));
    let other = Fake::new(content(CHUNK as usize), true);
    let cred = Credentials::unix(7, 8);
    let f = c
        .start(
            b"fhA",
            &fake.attrs,
            None,
            fake.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let g = c
        .start(
            b"fhB",
            &other.attrs,
            None,
            other.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..500 {
        if c.stats().counts.files_complete == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    f.write(&c, &cred, 10, b"local".to_vec(), true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    g.write(&c, &cred, 10, b"other".to_vec(), true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Someone changes fhA at the origin (its mtime even put back: the
    // ctime moves).
    let mut changed = fake.attrs.clone();
    changed.ctime.seconds += 100;
    lock(&fake.origin).insert(b"fhA".to_vec(), changed);
    lock(&fake.origin).insert(b"fhB".to_vec(), other.attrs.clone());

    let e = c.write_back(fake.as_ref()).await;
    assert!(
        e.is_err_and(|e| matches!(e, FileCacheError::WriteBackConflict { .. })
            && e.to_string().contains("conflict")),
        "conflict not reported"
    );
    // Only fhB's chunk was stored; fhA's origin change stands.
    let stored: Vec<u64> = lock(&fake.stored).iter().map(|(o, _)| *o).collect();
    assert_eq!(stored, [0], "the origin's change was overwritten");
    assert!(
        c.get(b"fhB").is_none(),
        "the unchanged file was not written back"
    );
    lock(&fake.stored).clear();
    assert!(
        f.is_dirty() && c.get(b"fhA").is_some(),
        "the local writes were dropped"
    );
    assert_eq!(c.stats().counts.write_back_conflicts, 1);
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 10, 5, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&got[..], b"local");
    // Kept across a restart too, and refused again.
    drop((f, g, c));
    let c = reopen(dir.path(), &index);
    let f = c
        .get(b"fhA")
        .unwrap_or_else(|| panic!("kept across reopen"));
    assert!(f.is_dirty());
    assert!(c.write_back_file(fake.as_ref(), &f).await.is_err());
    assert!(lock(&fake.stored).is_empty());
    // Unchanged at the origin, a file is written back: the guard of
    // each chunk after the first is what the STORE before left.
    let h = Fake::new(content(len), true);
    let (_dir2, _index2, c2, _) = restartable(content(len));
    let f2 = c2
        .start(b"fhC", &h.attrs, None, h.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c2).await;
    for at in [0, u64::from(CHUNK) + 5, 2 * u64::from(CHUNK) + 5] {
        f2.write(&c2, &cred, at, b"w".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    c2.write_back(h.as_ref())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lock(&h.stored).len(), 3);
}

/// Item 6b of issue 20: a WRITE that comes while a SETATTR writes the
/// file back is not kept behind it: it is refused (the client sends it
/// again, upstream), and the file is let go, holding nothing dirty.
#[tokio::test]
async fn a_write_during_a_setattrs_write_back_does_not_stay_behind() {
    let len = 2 * CHUNK as usize;
    let (_dir, _index, c, fake) = restartable(content(len));
    let cred = Credentials::unix(7, 8);
    let f = c
        .start(
            b"fhS",
            &fake.attrs,
            None,
            fake.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    f.write(&c, &cred, 0, b"first".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Hold the write-back's STORE.
    fake.store_gate.forget_permits(1 << 20);
    let back = {
        let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
        tokio::spawn(async move { c.write_back_and_let_go(fake.as_ref(), &f).await })
    };
    while fake.stores.load(Ordering::Relaxed) == 0 {
        tokio::task::yield_now().await;
    }
    let late = f
        .write(&c, &cred, u64::from(CHUNK) + 7, b"late".to_vec(), false)
        .await;
    assert!(matches!(late, Err(HeldWriteError::LetGo)), "{late:?}");
    fake.store_gate.add_permits(1 << 20);
    back.await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!f.is_dirty(), "a write stayed dirty behind the SETATTR");
    assert!(c.get(b"fhS").is_none(), "the file was not let go");
    assert_eq!(c.stats().dirty_files, 0);
}

fn zero_meta(len: usize, zero_chunks: &[u64]) -> MetaFile {
    let mut zero = ZeroMap::new(gvfs_metafile::block_count(len as u64, 65_536));
    for c in zero_chunks {
        zero.set_zero_range(c * 16, c * 16 + 16);
    }
    MetaFile {
        block_size: 65_536,
        file_size: len as u64,
        mtime: (7, 0),
        ctime: (7, 0),
        actions: gvfs_metafile::Actions::COMPRESS_AND_COPY,
        compressed_size: 0,
        zero,
        repeats: Vec::new(),
        hashes: None,
    }
}

async fn whole(c: &FileCache) {
    for _ in 0..500 {
        if c.stats().counts.files_complete == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the file never arrived whole");
}

#[tokio::test]
async fn chunks_of_zeros_are_not_read_until_written() {
    let len = 6 * CHUNK as usize;
    let meta = zero_meta(len, &[1, 4]);
    let (dir, fake, c, f) = started(b"fz", content(len), true, Some(&meta), false);
    let cred = Credentials::default();
    whole(&c).await;
    // Bytes behind the cache's back in a chunk of zeros are not read:
    // the zero map answers for it.
    let path = dir.path().join(file_name(b"fz"));
    let local = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    local
        .write_all_at(b"junk", u64::from(CHUNK) + 10)
        .unwrap_or_else(|e| panic!("{e}"));
    let at = u64::from(CHUNK) - 100;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at, 2 * CHUNK, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got[..] == fake.data[at as usize..at as usize + 2 * CHUNK as usize]);
    // A write into one makes it data.
    let at = 4 * u64::from(CHUNK) + 100;
    f.write(&c, &cred, at, b"hello".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at - 1, 7, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&*got, b"\0hello\0");
}

#[tokio::test]
async fn a_write_of_no_bytes_past_the_end_changes_nothing() {
    let len = 2 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(content(len));
    let cred = Credentials::default();
    let f = c
        .start(b"fn", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    f.write(&c, &cred, 3, b"kept".to_vec(), true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, after) = f
        .write(&c, &cred, len as u64 + 100, Vec::new(), true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(after.size, len as u64);
    f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
    drop((f, c));
    let c = reopen(dir.path(), &index);
    let f = c
        .get(b"fn")
        .unwrap_or_else(|| panic!("the writes were dropped"));
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 3, 4, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&*got, b"kept");
}

#[tokio::test]
async fn a_fetch_of_a_file_written_here_carries_its_local_attributes() {
    let len = 2 * CHUNK as usize;
    let (_dir, fake, c, f) = started(b"fl", content(len), true, None, true);
    let cred = Credentials::default();
    whole(&c).await;
    let (_, _, _, a) = f
        .read_frame(
            &c,
            &src(&fake),
            &cred,
            0,
            CHUNK,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(same_version(&a, &fake.attrs));
    f.write(&c, &cred, 10, b"new".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (frame, n, _, a) = f
        .read_frame(
            &c,
            &src(&fake),
            &cred,
            0,
            CHUNK,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&frames::unframe(&frame, n)[10..13], b"new");
    assert!(
        !same_version(&a, &fake.attrs),
        "the written bytes as upstream's"
    );
    assert!(same_version(&a, &f.local_attrs()));
    // Nor is a FETCH answered while a write is under way.
    let pin = f.versions.pin_write(0, 0, 10);
    let raced = f
        .read_frame(
            &c,
            &src(&fake),
            &cred,
            0,
            CHUNK,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await;
    assert!(raced.is_err());
    drop(pin);
}

#[tokio::test]
async fn a_changed_file_fails_the_fetch() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let len = 3 * CHUNK as usize;
    let fake = Fake::new(content(len), true);
    let c = cache(dir.path());
    let cred = Credentials::default();
    // The proxy believes in an older version of the file.
    let old = attrs(len as u64, 6);
    let f = c
        .start(b"fh4", &old, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = f.read(&c, &src(&fake), &cred, 0, 100, &DEMAND).await;
    assert!(r.is_err(), "bytes of another version were served");
    assert!(c.get(b"fh4").is_none());
}
