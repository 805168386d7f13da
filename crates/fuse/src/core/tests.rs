//! The operations against a fake stack that records the calls it gets.

use std::sync::Mutex;

use gvfs_nfs::{BoxFuture, NfsProc, ServiceError};

use super::*;
use crate::journal::Journal;
use std::sync::atomic::Ordering;

/// Answers as a server whose write verifier is `verf` (changed by the
/// test), and remembers every call.
struct Fake {
    verf: Mutex<[u8; 8]>,
    calls: Mutex<Vec<(NfsProc, u64, stable_how)>>,
    /// RENAMEs wait for a permit (none until a test adds them).
    renames: tokio::sync::Semaphore,
    /// Names RENAMEd to, and REMOVEd.
    renamed: Mutex<Vec<Vec<u8>>>,
    removed: Mutex<Vec<Vec<u8>>>,
}

impl Fake {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            verf: Mutex::new([1; 8]),
            calls: Mutex::new(Vec::new()),
            renames: tokio::sync::Semaphore::new(0),
            renamed: Mutex::new(Vec::new()),
            removed: Mutex::new(Vec::new()),
        })
    }

    fn writes(&self) -> Vec<(u64, stable_how)> {
        lock(&self.calls)
            .iter()
            .filter(|c| c.0 == NfsProc::Write)
            .map(|c| (c.1, c.2))
            .collect()
    }
}

fn wcc() -> wcc_data {
    wcc_data::default()
}

impl NfsService for Fake {
    fn call<'a>(
        &'a self,
        _cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        let verf = writeverf3(*lock(&self.verf));
        let reply = match req {
            NfsRequest::Getattr(_) => NfsReply::Getattr(Nfs3Result::Ok(GETATTR3resok {
                obj_attributes: gvfs_nfs::testing::file_attrs(100, 1),
            })),
            NfsRequest::Write(a) => {
                lock(&self.calls).push((NfsProc::Write, a.offset, a.stable));
                NfsReply::Write(Nfs3Result::Ok(WRITE3resok {
                    file_wcc: wcc(),
                    count: a.count,
                    committed: if a.stable == stable_how::FILE_SYNC {
                        stable_how::FILE_SYNC
                    } else {
                        stable_how::UNSTABLE
                    },
                    verf,
                }))
            }
            NfsRequest::Commit(_) => {
                lock(&self.calls).push((NfsProc::Commit, 0, stable_how::UNSTABLE));
                NfsReply::Commit(Nfs3Result::Ok(COMMIT3resok {
                    file_wcc: wcc(),
                    verf,
                }))
            }
            // Every name is the file the tests remember, but names
            // starting "new", which are files of their own.
            NfsRequest::Lookup(a) => NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                object: if a.what.name.0.starts_with(b"new") {
                    fh3(&a.what.name.0)
                } else {
                    fh3(b"file")
                },
                obj_attributes: Nfs3Option::None,
                dir_attributes: Nfs3Option::None,
            })),
            NfsRequest::Rename(a) => {
                lock(&self.renamed).push(a.to.name.0.to_vec());
                return Box::pin(async move {
                    if let Ok(p) = self.renames.acquire().await {
                        p.forget();
                    }
                    Ok(NfsReply::Rename(Nfs3Result::Ok(RENAME3resok {
                        fromdir_wcc: wcc(),
                        todir_wcc: wcc(),
                    })))
                });
            }
            NfsRequest::Remove(a) => {
                lock(&self.removed).push(a.object.name.0.to_vec());
                NfsReply::Remove(Nfs3Result::Ok(REMOVE3resok { dir_wcc: wcc() }))
            }
            other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOTSUPP),
        };
        Box::pin(async move { Ok(reply) })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async { Ok(fh3(b"root")) })
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

fn core_over(fake: &Arc<Fake>) -> (Core, u64) {
    let root = gvfs_nfs::testing::file_attrs(0, 1);
    let core = Core::new(fake.clone(), b"root", &root, Duration::from_secs(1), None);
    let ino = lock(&core.inodes).remember(b"file", 10).unwrap();
    (core, ino)
}

#[tokio::test]
async fn writes_are_committed_and_sent_again_in_order_when_the_verifier_changed() {
    let fake = Fake::new();
    let (core, ino) = core_over(&fake);
    let cx = CallContext::default();
    let h = core.add_open(ino, &cx).unwrap();
    for off in [0_u64, 4096, 0] {
        assert_eq!(
            core.write(&cx, ino, h, off, vec![off as u8; 4096]).await,
            Ok(4096)
        );
    }
    assert_eq!(core.stats().uncommitted_bytes, 3 * 4096);
    // The server restarted between the WRITEs and the COMMIT.
    *lock(&fake.verf) = [2; 8];
    core.commit(ino).await.unwrap();
    let again: Vec<_> = fake.writes().into_iter().skip(3).collect();
    assert_eq!(
        again,
        vec![
            (0, stable_how::FILE_SYNC),
            (4096, stable_how::FILE_SYNC),
            (0, stable_how::FILE_SYNC)
        ],
        "every uncommitted write again, in the order written"
    );
    assert_eq!(core.stats().uncommitted_bytes, 0);
    assert_eq!(core.counters.writes_resent.get(), 3);

    // Same verifier: a COMMIT alone.
    core.write(&cx, ino, h, 0, vec![9; 10]).await.unwrap();
    core.commit(ino).await.unwrap();
    assert_eq!(fake.writes().len(), 7, "nothing sent again");
}

#[tokio::test]
async fn kept_writes_past_the_budget_are_committed_by_the_writer() {
    let fake = Fake::new();
    let (mut core, ino) = core_over(&fake);
    core.uncommitted = Uncommitted::new(10_000);
    let cx = CallContext::default();
    let h = core.add_open(ino, &cx).unwrap();
    for i in 0..5_u64 {
        core.write(&cx, ino, h, i * 4096, vec![1; 4096])
            .await
            .unwrap();
    }
    assert!(core.stats().uncommitted_bytes <= 10_000);
    assert!(core.counters.commits.get() >= 1);
}

#[tokio::test]
async fn io_through_an_open_file_goes_as_its_opener() {
    let fake = Fake::new();
    let (core, ino) = core_over(&fake);
    let opener = CallContext::with_cred(gvfs_nfs::Credentials::unix(1000, 1000));
    let h = core.add_open(ino, &opener).unwrap();
    let kernel = CallContext::with_cred(gvfs_nfs::Credentials::unix(0, 0));
    assert_eq!(core.io_context(h, &kernel).cred, opener.cred);
    core.release(h).await.unwrap();
    assert_eq!(core.io_context(h, &kernel).cred, kernel.cred, "closed");
    assert!(matches!(
        core.readlink(&kernel, ino).await,
        Err(e) if e == Errno::EOPNOTSUPP
    ));
    assert_eq!(
        core.getattr(&kernel, 12345).await.err(),
        Some(Errno::ESTALE)
    );
}

#[tokio::test]
async fn a_file_removed_as_its_last_close_passes_is_not_left_hidden() {
    let fake = Fake::new();
    let (core, ino) = core_over(&fake);
    let core = Arc::new(core);
    let cx = CallContext::default();
    let h = core.add_open(ino, &cx).unwrap();
    // close() returned and the kernel's RELEASE is on its way when the
    // unlink comes: the file is still open, so it is renamed to a hidden
    // name...
    let unlink = {
        let (core, cx) = (core.clone(), cx.clone());
        tokio::spawn(async move { core.unlink(&cx, Inodes::ROOT, b"name").await })
    };
    while lock(&fake.renamed).is_empty() {
        tokio::task::yield_now().await;
    }
    // ...and the RELEASE is done before the rename.
    core.release(h).await.unwrap();
    assert!(lock(&fake.removed).is_empty());
    fake.renames.add_permits(1);
    unlink.await.unwrap().unwrap();
    let hidden = lock(&fake.renamed)[0].clone();
    assert!(hidden.starts_with(b".gvfs-fuse"));
    assert_eq!(
        *lock(&fake.removed),
        vec![hidden],
        "the hidden file is gone"
    );
    assert!(lock(&core.hidden).is_empty());

    // Still open when the rename ends: removed at the last close.
    let h = core.add_open(ino, &cx).unwrap();
    fake.renames.add_permits(1);
    core.unlink(&cx, Inodes::ROOT, b"other").await.unwrap();
    assert_eq!(lock(&fake.removed).len(), 1);
    core.release(h).await.unwrap();
    assert_eq!(lock(&fake.removed).len(), 2);
}

/// `core_over` with a journal in `dir`.
fn journaled(fake: &Arc<Fake>, dir: &std::path::Path) -> (Core, Arc<Journal>) {
    let root = gvfs_nfs::testing::file_attrs(0, 1);
    let j = Arc::new(Journal::create(dir).unwrap());
    let core = Core::new(fake.clone(), b"root", &root, Duration::from_secs(1), None)
        .with_journal(j.clone());
    (core, j)
}

#[tokio::test]
async fn a_node_or_handle_the_journal_cannot_record_is_refused_with_eio() {
    let fake = Fake::new();
    let dir = tempfile::tempdir().unwrap();
    let (core, j) = journaled(&fake, dir.path());
    let cx = CallContext::default();
    let a = core.lookup(&cx, Inodes::ROOT, b"name").await.unwrap();
    let ino = a.ino.0;
    let h = core.add_open(ino, &cx).unwrap();
    let t = crate::journal::replay(&j.path()).unwrap();
    assert_eq!(t.nodes[&ino].lookups, 1, "recorded before the reply");
    assert_eq!(t.opens[&h].ino, ino);

    j.sabotage();
    assert_eq!(
        core.lookup(&cx, Inodes::ROOT, b"name").await.err(),
        Some(Errno::EIO),
        "no id the journal lacks"
    );
    assert_eq!(
        core.lookup(&cx, Inodes::ROOT, b"new file").await.err(),
        Some(Errno::EIO),
        "nor a new one"
    );
    assert_eq!(lock(&core.inodes).ino_of(b"new file"), None);
    assert_eq!(lock(&core.inodes).len(), 2, "the root and one file");
    assert_eq!(core.add_open(ino, &cx).err(), Some(Errno::EIO));
    assert_eq!(lock(&core.opens).len(), 1, "no handle either");
    // The table is as the journal says: one lookup, not two.
    core.forget(ino, 1);
    assert_eq!(
        core.getattr(&cx, ino).await.err(),
        Some(Errno::ESTALE),
        "forgotten after its one recorded lookup"
    );
}

#[tokio::test]
async fn a_restored_table_is_the_journal_and_new_ids_do_not_collide() {
    let fake = Fake::new();
    let dir = tempfile::tempdir().unwrap();
    let (core, j) = journaled(&fake, dir.path());
    let cx = CallContext::with_cred(gvfs_nfs::Credentials::Unix(gvfs_nfs::rpc::AuthUnix {
        stamp: 0,
        machine: crate::journal::MACHINE.to_vec(),
        uid: 1000,
        gid: 100,
        gids: vec![4, 27],
    }));
    // Node "file" (file id 1, so a spare id), looked up twice, opened
    // twice, and removed while open (hidden).
    let ino = core.lookup(&cx, Inodes::ROOT, b"a").await.unwrap().ino.0;
    assert_eq!(
        core.lookup(&cx, Inodes::ROOT, b"a").await.unwrap().ino.0,
        ino
    );
    assert!(ino > 1 << 63);
    let h1 = core.add_open(ino, &cx).unwrap();
    let h2 = core.add_open(ino, &cx).unwrap();
    fake.renames.add_permits(1);
    core.unlink(&cx, Inodes::ROOT, b"a").await.unwrap();
    let hidden_name = lock(&fake.renamed)[0].clone();
    core.release(h1).await.unwrap();
    let last_h = core.next_fh.load(Ordering::Relaxed) - 1;
    drop(core);

    // A new process: the same root, the replayed table.
    let t = crate::journal::replay(&j.path()).unwrap();
    let j2 = Arc::new(Journal::resume(dir.path(), &t).unwrap());
    let root = gvfs_nfs::testing::file_attrs(0, 1);
    let core = Core::new(fake.clone(), b"root", &root, Duration::from_secs(1), None)
        .with_journal(j2.clone());
    core.restore(t);
    assert_eq!(
        lock(&core.inodes).handle(ino).as_deref(),
        Some(&b"file"[..])
    );
    assert_eq!(core.io_context(h2, &CallContext::default()).cred, cx.cred);
    assert!(core.io_context(h1, &CallContext::default()).cred != cx.cred);
    // Known handles keep their ids; new ones get ids and handles past
    // every restored one (and past the hidden name's number).
    assert_eq!(lock(&core.inodes).remember(b"file", 1), Ok(ino));
    let other = lock(&core.inodes).remember(b"other", 0).unwrap();
    assert!(other > ino, "{other:#x} after {ino:#x}");
    let h3 = core.add_open(ino, &cx).unwrap();
    assert!(h3 > last_h && h3 != h2);
    // Two lookups restored (and one more now): three FORGETs drop it.
    core.forget(ino, 2);
    assert!(lock(&core.inodes).handle(ino).is_some());
    // The hidden file is removed at the last close, as before.
    core.release(h2).await.unwrap();
    assert!(lock(&fake.removed).is_empty());
    core.release(h3).await.unwrap();
    assert_eq!(*lock(&fake.removed), vec![hidden_name]);
    core.forget(ino, 1);
    assert!(lock(&core.inodes).handle(ino).is_none());
    // And the new journal says the same.
    let t = crate::journal::replay(&j2.path()).unwrap();
    assert!(!t.nodes.contains_key(&ino) && t.nodes.contains_key(&other));
    assert!(t.opens.is_empty() && t.hidden.is_empty());
}

#[test]
fn compaction_runs_under_the_core_locks_and_keeps_the_table() {
    let fake = Fake::new();
    let dir = tempfile::tempdir().unwrap();
    let root = gvfs_nfs::testing::file_attrs(0, 1);
    let j = Arc::new(Journal::with_min_compact(dir.path(), 2048).unwrap());
    let core = Core::new(fake.clone(), b"root", &root, Duration::from_secs(1), None)
        .with_journal(j.clone());
    let cx = CallContext::default();
    let keep = lock(&core.inodes).remember(b"kept", 5).unwrap();
    let h = core.add_open(keep, &cx).unwrap();
    for i in 0..2000_u64 {
        let fh = i.to_le_bytes();
        let ino = lock(&core.inodes).remember(&fh, 100 + i).unwrap();
        core.forget(ino, 1);
    }
    assert!(j.len() < 4096, "compacted: {} bytes", j.len());
    let t = crate::journal::replay(&j.path()).unwrap();
    assert!(t.generation > 1);
    assert_eq!(t.nodes.keys().copied().collect::<Vec<_>>(), vec![keep]);
    assert_eq!(t.opens.keys().copied().collect::<Vec<_>>(), vec![h]);
}
