//! Crashes around held writes: records made durable before a write lands
//! or is acknowledged, entries let go while written, successors; and
//! fetches cut short by a crash, kept by their progress logs and resumed.

use super::*;
use crate::names::progress_path;
use crate::pieces::Mask;
use crate::progress::Progress;
use gvfs_ext::Profile;

/// An index that loses, in a crash, what was not flushed: `put` and
/// `remove` change the live map, `flush` makes it the durable one, and
/// [`CrashIndex::crashed`] is what a restart after a crash finds.
#[derive(Default)]
struct CrashIndex {
    live: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    durable: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
}

impl CrashIndex {
    fn crashed(&self) -> Arc<CrashIndex> {
        let kept = lock(&self.durable).clone();
        Arc::new(CrashIndex {
            live: Mutex::new(kept.clone()),
            durable: Mutex::new(kept),
        })
    }
}

impl MetaIndex for CrashIndex {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::IndexError> {
        Ok(lock(&self.live).get(key).cloned())
    }
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), crate::IndexError> {
        lock(&self.live).insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn remove(&self, key: &[u8]) -> Result<(), crate::IndexError> {
        lock(&self.live).remove(key);
        Ok(())
    }
    fn flush(&self) -> Result<(), crate::IndexError> {
        *lock(&self.durable) = lock(&self.live).clone();
        Ok(())
    }
    fn scan_prefix(
        &self,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<crate::index::Entry>, crate::IndexError> {
        Ok(lock(&self.live)
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn persistent(&self) -> bool {
        true
    }
}

/// A cache in `dir` on `index`, reopened as after a crash.
fn crash_open(dir: &Path, index: &Arc<CrashIndex>) -> Arc<FileCache> {
    let index: Arc<dyn MetaIndex> = index.clone();
    reopen(dir, &index)
}

/// The dirty chunks of `fh` in a cache reopened after a crash, and the
/// bytes it serves at `at`.
async fn after_crash(
    dir: &Path,
    index: &CrashIndex,
    fake: &Arc<Fake>,
    fh: &[u8],
    at: u64,
    len: u32,
) -> (Arc<CrashIndex>, Vec<usize>, Vec<u8>) {
    let index = index.crashed();
    let c = crash_open(dir, &index);
    let f = c.get(fh).unwrap_or_else(|| panic!("the file was not kept"));
    let dirty = f.versions.lock().dirty.keys().copied().collect();
    let (got, _) = f
        .read(&c, &src(fake), &Credentials::default(), at, len, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (index, dirty, got.to_vec())
}

#[tokio::test]
async fn writes_are_recorded_durably_before_they_land_or_are_acknowledged() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let c = crash_open(dir.path(), &index);
    let fake = Fake::new(content(4 * CHUNK as usize), true);
    let cred = Credentials::default();
    let f = c
        .start(b"fd", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    // Sled's own flush, half a second later: the clean record is durable.
    index.flush().unwrap_or_else(|e| panic!("{e}"));
    let chunk = u64::from(CHUNK);
    // A FILE_SYNC write is acknowledged: a crash right after keeps it.
    f.write(&c, &cred, chunk + 5, b"stable".to_vec(), true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, dirty, got) = after_crash(dir.path(), &index, &fake, b"fd", chunk + 5, 6).await;
    assert_eq!((dirty, &got[..]), (vec![1], &b"stable"[..]));
    // An UNSTABLE write into a clean chunk: a crash right after it
    // lists the chunk dirty (its bytes are not upstream's any more).
    f.write(&c, &cred, 2 * chunk, b"loose".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, dirty, _) = after_crash(dir.path(), &index, &fake, b"fd", 0, 1).await;
    assert_eq!(dirty, vec![1, 2]);
    // A COMMIT is acknowledged: a crash right after keeps the writes
    // before it, and the size they gave the file.
    let end = 4 * chunk;
    f.write(&c, &cred, end, b"tail".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
    let (_, dirty, got) = after_crash(dir.path(), &index, &fake, b"fd", end, 100).await;
    assert_eq!((dirty, &got[..]), (vec![1, 2, 4], &b"tail"[..]));
}

#[tokio::test]
async fn a_write_pins_its_entry_and_is_not_acknowledged_into_one_let_go() {
    let len = 3 * CHUNK as usize;
    let (_dir, fake, c, f) = started(b"fp", content(len), true, None, false);
    let cred = Credentials::default();
    whole(&c).await;
    // While a write is under way nothing lets the entry go: not a
    // client's write through the block path, nor room for another file,
    // nor a write-back.
    f.last_used.store(0, Ordering::Relaxed);
    let (pin, _) = f
        .versions
        .pin_write(0, 0, 10)
        .unwrap_or_else(|| panic!("not being let go"));
    c.forget(b"fp");
    assert!(c.make_room(&mut lock(&c.files), c.max_bytes).is_err());
    c.write_back(fake.as_ref())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.holds(&f), "the entry was let go under a write");
    drop(pin);
    // Clean (written back) and with no write under way, it goes; a
    // write that still holds it lands nowhere and is refused, for the
    // client to send again.
    c.forget(b"fp");
    assert!(c.get(b"fp").is_none());
    let late = f.write(&c, &cred, 7, b"lost".to_vec(), true).await;
    assert!(matches!(late, Err(HeldWriteError::LetGo)), "{late:?}");
    assert_eq!(HeldWriteError::LetGo.nfsstat(), nfsstat3::NFS3ERR_JUKEBOX);
    // A write counts as a use.
    let (_dir, _fake, c, f) = started(b"fq", content(len), true, None, false);
    whole(&c).await;
    f.last_used.store(0, Ordering::Relaxed);
    f.write(&c, &cred, 7, b"used".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(f.last_used.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn a_record_of_an_entry_let_go_does_not_describe_its_successor() {
    let len = 3 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(content(len));
    let cred = Credentials::default();
    // The file changes before its fetch runs: the old entry's fetch
    // finishes into its unlinked file while the new one's is held.
    c.start(b"fs", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    let newer = Fake::new(content(len), false);
    c.start(
        b"fs",
        &attrs(len as u64, 9),
        None,
        newer.clone(),
        &cred,
        false,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    drop(c);
    let c = reopen(dir.path(), &index);
    assert!(c.get(b"fs").is_none(), "a half-fetched file was kept");
    // A record removed but not yet flushed when the entry was let go:
    // a crash after the new file is made must not bring it back.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let c = crash_open(dir.path(), &index);
    c.start(b"ft", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    index.flush().unwrap_or_else(|e| panic!("{e}"));
    c.forget(b"ft");
    c.start(
        b"ft",
        &attrs(len as u64, 9),
        None,
        newer.clone(),
        &cred,
        false,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = crash_open(dir.path(), &index.crashed());
    assert!(c.get(b"ft").is_none(), "a half-fetched file was kept");
}

/// The progress log of `fh` in `dir`, as a restart finds it: the pieces
/// it records, by chunk.
fn recorded(dir: &Path, fh: &[u8]) -> Vec<(usize, Mask)> {
    let path = progress_path(&dir.join(file_name(fh)));
    Progress::load(&path, 1 << 40)
        .unwrap_or_else(|e| panic!("{e}"))
        .masks()
        .collect()
}

/// The fetch of `fake`'s file as `fh` in a cache in `dir` on `index`,
/// killed once `arrive` FETCHes have been answered: the process dies with
/// the rest in flight (held at `fake`'s gate for ever). Returns the
/// pieces its progress log recorded.
async fn killed_halfway(
    dir: &Path,
    index: &Arc<CrashIndex>,
    fake: &Arc<Fake>,
    fh: &[u8],
    arrive: usize,
) -> Vec<(usize, Mask)> {
    let c = crash_open(dir, index);
    c.start(
        fh,
        &fake.attrs,
        None,
        fake.clone(),
        &Credentials::default(),
        false,
        &FIRST,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    fake.gate.add_permits(arrive);
    for _ in 0..500 {
        if c.stats().counts.chunks_fetched == arrive as u64 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(c.stats().counts.chunks_fetched, arrive as u64);
    recorded(dir, fh)
}

/// Bytes of the pieces `recorded` names, of a file of `size` bytes.
fn recorded_bytes(size: u64, recorded: &[(usize, Mask)]) -> u64 {
    recorded
        .iter()
        .map(|&(idx, mask)| crate::progress::mask_bytes(size, idx, mask))
        .sum()
}

/// Whether piece `piece` of chunk `idx` is among the `recorded`.
fn was_recorded(recorded: &[(usize, Mask)], idx: usize, piece: u64) -> bool {
    recorded
        .iter()
        .any(|&(i, mask)| i == idx && mask & 1 << piece != 0)
}

#[tokio::test]
async fn a_fetch_killed_halfway_resumes_fetching_only_what_was_never_recorded() {
    let len = 8 * CHUNK as usize + 5000;
    let size = len as u64;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    // A working-set profile's pieces come first: some chunks are kept
    // in part.
    let fake = Fake::new(content(len), false);
    let per = CHUNK / PIECE;
    let parts = vec![2 * per + 10, 2 * per + 11, 5 * per + 40];
    *lock(&fake.profile) = Some(Profile::of(&fake.attrs, PIECE, parts));
    let kept = killed_halfway(dir.path(), &index, &fake, b"fk", 4).await;
    let kept_bytes = recorded_bytes(size, &kept);
    assert!(kept_bytes > 0 && kept_bytes < size, "{kept:?}");
    assert!(
        kept.iter().any(|&(_, m)| m != Mask::MAX),
        "no chunk kept in part: {kept:?}"
    );
    // The restart keeps the file, but serves nothing of it unresumed.
    let index = index.crashed();
    let c = crash_open(dir.path(), &index);
    assert!(c.get(b"fk").is_none(), "a partial file is served");
    let s = c.stats().counts;
    assert_eq!((s.kept_files, s.kept_bytes), (1, kept_bytes));
    // The next fetch of the same version resumes it.
    let fake = Fake::new(content(len), true);
    let cred = Credentials::default();
    let f = c
        .start(b"fk", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == fake.data, "resumed bytes differ");
    // Fetched after the restart: only pieces never recorded, each once.
    let fetched = lock(&fake.fetched).clone();
    for &(offset, count, _) in &fetched {
        for at in (offset..offset + u64::from(count)).step_by(PIECE as usize) {
            let idx = (at / u64::from(CHUNK)) as usize;
            let piece = at % u64::from(CHUNK) / u64::from(PIECE);
            assert!(
                !was_recorded(&kept, idx, piece),
                "piece {piece} of chunk {idx} fetched again"
            );
        }
    }
    let total: u64 = fetched.iter().map(|f| u64::from(f.1)).sum();
    assert_eq!(total, size - kept_bytes);
    let s = c.stats().counts;
    assert_eq!((s.refetched_bytes, s.kept_bad_pieces), (0, 0));
    // Whole: the log is gone, and a crash now keeps the file whole.
    let log = progress_path(&dir.path().join(file_name(b"fk")));
    assert!(!log.exists(), "the progress log of a whole file stays");
    let c = crash_open(dir.path(), &index.crashed());
    let f = c.get(b"fk").unwrap_or_else(|| panic!("not kept whole"));
    assert!(f.complete());
}

#[tokio::test]
async fn a_kept_piece_damaged_on_disk_is_fetched_again_and_counted() {
    let len = 6 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), false);
    let kept = killed_halfway(dir.path(), &index, &fake, b"fb", 3).await;
    assert_eq!(kept.len(), 3, "{kept:?}");
    // A byte of piece 5 of a kept chunk lost (a reboot, a bad disk).
    let (idx, _) = kept[1];
    let at = idx as u64 * u64::from(CHUNK) + 5 * u64::from(PIECE) + 77;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(file_name(b"fb")))
        .unwrap_or_else(|e| panic!("{e}"));
    file.write_all_at(&[!fake.data[at as usize]], at)
        .unwrap_or_else(|e| panic!("{e}"));
    let c = crash_open(dir.path(), &index.crashed());
    let fake = Fake::new(content(len), true);
    let cred = Credentials::default();
    let f = c
        .start(b"fb", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    // A reader at once: never the damaged byte.
    let (got, _) = f
        .read(&c, &src(&fake), &cred, at - 77, PIECE, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got[..] == fake.data[at as usize - 77..][..PIECE as usize]);
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == fake.data, "a damaged kept piece was served");
    let s = c.stats().counts;
    assert_eq!((s.kept_bad_pieces, s.refetched_bytes), (1, 0));
    let again = lock(&fake.fetched)
        .iter()
        .any(|&(o, n, _)| o <= at && at < o + u64::from(n));
    assert!(again, "the damaged piece was not fetched again");
}

#[tokio::test]
async fn a_kept_file_of_another_version_is_discarded() {
    let len = 6 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), false);
    let kept = killed_halfway(dir.path(), &index, &fake, b"fv", 3).await;
    assert!(!kept.is_empty());
    let c = crash_open(dir.path(), &index.crashed());
    assert_eq!(c.stats().counts.kept_files, 1);
    // The file changed at the origin while the proxy was down.
    let mut newer = Fake::new(content(len).iter().map(|b| b ^ 0x5a).collect(), true);
    if let Some(n) = Arc::get_mut(&mut newer) {
        n.attrs = attrs(len as u64, 9);
    }
    let cred = Credentials::default();
    let f = c
        .start(
            b"fv",
            &newer.attrs,
            None,
            newer.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&newer), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == newer.data, "bytes of the old version were served");
    let total: u64 = lock(&newer.fetched).iter().map(|f| u64::from(f.1)).sum();
    assert_eq!(total, len as u64, "the new version was not fetched whole");
    assert_eq!(c.stats().counts.refetched_bytes, 0);
}

#[tokio::test]
async fn kept_pieces_given_back_after_the_stream_passed_their_chunk_are_fetched() {
    let len = 6 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), false);
    let kept = killed_halfway(dir.path(), &index, &fake, b"fg", 3).await;
    let (idx, mask) = kept[1];
    let c = crash_open(dir.path(), &index.crashed());
    let fake = Fake::new(content(len), true);
    let cred = Credentials::default();
    let f = c
        .start(b"fg", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    // A reader's check holds the chunk's kept pieces (claimed) ...
    let taken = f
        .kept
        .as_ref()
        .map(|k| k.take(idx, idx))
        .unwrap_or_default();
    assert_eq!(taken.len(), 1);
    // ... while another reader's rest behind it streams the chunk, so
    // the background stream passes it over, and ends.
    let at = idx as u64 * u64::from(CHUNK);
    let (_, waiting) = f.fetch.plan(at, at + 1, f.size(), Class::Demand);
    assert!(waiting);
    for _ in 0..500 {
        let left = (0..6).filter(|&i| !f.fetch.chunks()[i].here()).count();
        if left == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    f.fetch.stop_streaming(idx);
    // The check fails every piece: given back, for the stream to fetch.
    f.fetch.kept_checked(idx, CHUNK, mask, 0);
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == fake.data);
}

#[tokio::test]
async fn a_check_of_kept_pieces_that_panics_gives_their_claims_back() {
    let len = 6 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), false);
    let kept = killed_halfway(dir.path(), &index, &fake, b"fc", 3).await;
    let (idx, _) = kept[1];
    let c = crash_open(dir.path(), &index.crashed());
    let fake = Fake::new(content(len), true);
    let cred = Credentials::default();
    let f = c
        .start(b"fc", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    let left = f
        .kept
        .as_ref()
        .map(|k| k.take(idx, idx))
        .unwrap_or_default();
    let taken = crate::fetch::kept::Taken {
        entry: f.clone(),
        left,
    };
    let checked = tokio::task::spawn_blocking(move || {
        let _taken = taken;
        panic!("a check of kept pieces fails");
    })
    .await;
    assert!(checked.is_err());
    // Its pieces are fetched instead; nobody waits for them for ever.
    let at = idx as u64 * u64::from(CHUNK);
    let (source, want) = (src(&fake), DEMAND);
    let read = f.read(&c, &source, &cred, at, CHUNK, &want);
    let (got, _) = tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .unwrap_or_else(|_| panic!("a reader waits for ever"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got[..] == fake.data[at as usize..][..CHUNK as usize]);
    whole(&c).await;
}

/// The metadata of `data` with its block fingerprints and piece hashes.
fn hashed_meta(data: &[u8]) -> MetaFile {
    use gvfs_metafile::hashes::{HASH_PIECE, fingerprint, piece_hash};
    let mut m = zero_meta(data.len(), &[]);
    let fps = data
        .chunks(m.block_size as usize)
        .map(fingerprint)
        .collect();
    let pieces = data.chunks(HASH_PIECE as usize).map(piece_hash).collect();
    let h = gvfs_metafile::BlockHashes::new(fps, pieces, &m.zero, m.block_size, m.file_size);
    m.hashes = Some(Arc::new(h.unwrap_or_else(|| panic!("hash counts"))));
    m
}

#[tokio::test]
async fn a_kept_piece_whose_crc_collides_fails_its_piece_hash() {
    let len = 6 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), false);
    let kept = killed_halfway(dir.path(), &index, &fake, b"fh", 3).await;
    let (idx, mask) = kept[1];
    assert_eq!(mask, Mask::MAX);
    // A byte of a kept chunk lost, and a log whose CRCs match what is on
    // disk now: a CRC32 that collides.
    let at = idx as u64 * u64::from(CHUNK) + 9 * u64::from(PIECE) + 77;
    let path = dir.path().join(file_name(b"fh"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    file.write_all_at(&[!fake.data[at as usize]], at)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut log =
        Progress::create(&progress_path(&path), &fake.attrs).unwrap_or_else(|e| panic!("{e}"));
    for &(i, _) in &kept {
        let mut raw = vec![0u8; CHUNK as usize];
        let offset = i as u64 * u64::from(CHUNK);
        file.read_exact_at(&mut raw, offset)
            .unwrap_or_else(|e| panic!("{e}"));
        log.note(offset, &raw).unwrap_or_else(|e| panic!("{e}"));
    }
    drop(log);
    let c = crash_open(dir.path(), &index.crashed());
    let fake = Fake::new(content(len), true);
    let meta = hashed_meta(&fake.data);
    let cred = Credentials::default();
    let f = c
        .start(
            b"fh",
            &fake.attrs,
            Some(&meta),
            fake.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let (got, _) = f
        .read(&c, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got == fake.data,
        "a kept piece with a colliding CRC was served"
    );
    // The whole hashed piece it is in failed.
    let per = gvfs_metafile::hashes::HASH_PIECE / u64::from(PIECE);
    assert_eq!(c.stats().counts.kept_bad_pieces, per);
}

/// A file of `fake`'s bytes as `fh` in `dir`, kept partial as after a
/// crash: a progress log recording the pieces `kept` of chunk `idx`.
fn kept_partial(dir: &Path, fake: &Fake, fh: &[u8], idx: usize, kept: Mask) {
    let path = dir.join(file_name(fh));
    std::fs::write(&path, &fake.data).unwrap_or_else(|e| panic!("{e}"));
    let mut log =
        Progress::create(&progress_path(&path), &fake.attrs).unwrap_or_else(|e| panic!("{e}"));
    for piece in 0..Mask::BITS {
        if kept & 1 << piece != 0 {
            let at = idx * CHUNK as usize + (piece * PIECE) as usize;
            log.note(at as u64, &fake.data[at..at + PIECE as usize])
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// Bytes `fake` was asked for of chunk `idx`, and whether any of them
/// was one of the pieces `of`.
fn asked_in(fake: &Fake, idx: usize, of: Mask) -> (u64, bool) {
    let (start, end) = (
        idx as u64 * u64::from(CHUNK),
        (idx as u64 + 1) * u64::from(CHUNK),
    );
    let (mut bytes, mut any) = (0, false);
    for &(offset, count, _) in lock(&fake.fetched).iter() {
        let to = offset + u64::from(count);
        if offset >= end || to <= start {
            continue;
        }
        bytes += to.min(end) - offset.max(start);
        for at in (offset.max(start)..to.min(end)).step_by(PIECE as usize) {
            any |= of & 1 << ((at - start) / u64::from(PIECE)) != 0;
        }
    }
    (bytes, any)
}

#[tokio::test]
async fn kept_pieces_failing_late_are_fetched_without_what_was_fetched_since() {
    let len = 4 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), true);
    let ends: Mask = 1 | 1 << (Mask::BITS - 1);
    kept_partial(dir.path(), &fake, b"fe", 2, ends);
    let c = crash_open(dir.path(), &index);
    let cred = Credentials::default();
    let f = c
        .start(b"fe", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    // The check of the chunk's two kept pieces is held ...
    let taken = f.kept.as_ref().map(|k| k.take(2, 2)).unwrap_or_default();
    assert_eq!(taken.len(), 1);
    // ... until the rest of the chunk has arrived ...
    for _ in 0..500 {
        if c.stats().counts.chunks_fetched == 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(c.stats().counts.chunks_fetched, 4);
    // ... and both fail it: only those two are fetched again.
    f.fetch.kept_checked(2, CHUNK, ends, 0);
    whole(&c).await;
    assert_eq!(asked_in(&fake, 2, 0).0, u64::from(CHUNK));
}

#[tokio::test]
async fn a_clean_resume_with_piece_hashes_fetches_no_kept_piece_again() {
    let len = 4 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let fake = Fake::new(content(len), true);
    // Half of a hashed piece kept, and the last piece of another.
    let kept: Mask = 0b1111 | 1 << 20;
    kept_partial(dir.path(), &fake, b"fw", 2, kept);
    let c = crash_open(dir.path(), &index);
    let meta = hashed_meta(&fake.data);
    let cred = Credentials::default();
    let f = c
        .start(
            b"fw",
            &fake.attrs,
            Some(&meta),
            fake.clone(),
            &cred,
            false,
            &FIRST,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // A reader in the chunk: the rest behind it, a run at a time.
    let at = 2 * u64::from(CHUNK) + 40 * u64::from(PIECE);
    f.read(&c, &src(&fake), &cred, at, PIECE, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    let (_, again) = asked_in(&fake, 2, kept);
    assert!(!again, "a kept piece was fetched again");
    let s = c.stats().counts;
    assert_eq!((s.refetched_bytes, s.kept_bad_pieces), (0, 0));
}

#[tokio::test]
async fn a_progress_log_let_go_after_a_failed_write_is_still_removed() {
    let len = 4 * CHUNK as usize;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let index = Arc::new(CrashIndex::default());
    let c = crash_open(dir.path(), &index);
    let cred = Credentials::default();
    // Whole: the log goes with the record, even one let go on the way
    // (as a write to it that fails lets it go).
    let fake = Fake::new(content(len), false);
    let f = c
        .start(b"fl", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    let log = progress_path(&f.path);
    assert!(log.exists());
    lock(&f.progress).take();
    fake.gate.add_permits(1 << 20);
    whole(&c).await;
    assert!(!log.exists(), "the log of a whole file stays");
    // Let go: its log goes with it.
    let fake = Fake::new(content(len), false);
    let f = c
        .start(b"fm", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    let log = progress_path(&f.path);
    lock(&f.progress).take();
    c.forget(b"fm");
    assert!(!log.exists(), "the log of a file let go stays");
}
