//! The operations against a fake stack that records the calls it gets.

use std::sync::Mutex;

use gvfs_nfs::{BoxFuture, NfsProc, ServiceError};

use super::*;

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
            // Every name is the file the tests remember.
            NfsRequest::Lookup(_) => NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                object: fh3(b"file"),
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
