//! Crashes around held writes: records made durable before a write lands
//! or is acknowledged, entries let go while written, successors.

use super::*;

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
