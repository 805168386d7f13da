//! READ, WRITE and COMMIT, driven through `NfsService::call`.

use nfs3_types::nfs3::*;
use tempfile::TempDir;

use crate::dir::testing::{Fixture, mode, root, unchecked};

#[tokio::test]
async fn create_write_read_round_trip() {
    let f = Fixture::new().await;
    let (fh, attr) = f
        .create(&root(), &f.root, "file", unchecked(0o644))
        .await
        .unwrap();
    assert_eq!(attr.type_, ftype3::NF3REG);
    assert_eq!(attr.mode, 0o644);
    assert_eq!(attr.size, 0);
    assert!(fh.data.len() <= 64);

    let w = f
        .write(&root(), &fh, 0, b"hello world", stable_how::FILE_SYNC)
        .await
        .unwrap();
    assert_eq!(w.count, 11);
    assert_eq!(w.committed, stable_how::FILE_SYNC);
    let Nfs3Option::Some(before) = w.file_wcc.before else {
        panic!("no pre-op attributes")
    };
    let Nfs3Option::Some(after) = w.file_wcc.after else {
        panic!("no post-op attributes")
    };
    assert_eq!((before.size, after.size), (0, 11));

    assert_eq!(
        f.read(&root(), &fh, 0, 100).await.unwrap(),
        (b"hello world".to_vec(), true)
    );
    assert_eq!(
        f.read(&root(), &fh, 6, 5).await.unwrap(),
        (b"world".to_vec(), true)
    );
    assert_eq!(
        f.read(&root(), &fh, 0, 5).await.unwrap(),
        (b"hello".to_vec(), false)
    );
    assert_eq!(f.read(&root(), &fh, 50, 5).await.unwrap(), (vec![], true));
    assert_eq!(
        std::fs::read(f.tmp.path().join("file")).unwrap(),
        b"hello world"
    );

    // A READ larger than rtmax is cut to 1 MiB.
    let big = vec![7u8; 1 << 20];
    f.write(&root(), &fh, 0, &big, stable_how::UNSTABLE)
        .await
        .unwrap();
    f.write(&root(), &fh, 1 << 20, &big, stable_how::UNSTABLE)
        .await
        .unwrap();
    let (data, eof) = f.read(&root(), &fh, 0, 4 << 20).await.unwrap();
    assert_eq!((data.len(), eof), (1 << 20, false));

    let (found, _) = f.lookup(&root(), &f.root, "file").await.unwrap();
    assert_eq!(found, fh);
    assert_eq!(
        f.lookup(&root(), &f.root, "nope").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    assert_eq!(
        f.read(&root(), &f.root, 0, 10).await.unwrap_err(),
        nfsstat3::NFS3ERR_ISDIR
    );
    assert_eq!(
        f.write(&root(), &f.root, 0, b"x", stable_how::UNSTABLE)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ISDIR
    );
}

#[tokio::test]
async fn unstable_write_then_commit() {
    let f = Fixture::new().await;
    let fh = f.create_file(&f.root, "f").await;
    let w = f
        .write(&root(), &fh, 0, b"abc", stable_how::UNSTABLE)
        .await
        .unwrap();
    assert_eq!(w.committed, stable_how::UNSTABLE);
    let w2 = f
        .write(&root(), &fh, 3, b"def", stable_how::DATA_SYNC)
        .await
        .unwrap();
    assert_eq!(w2.verf, w.verf, "one verifier per instance");
    assert_ne!(w2.committed, stable_how::UNSTABLE);
    let ok = f.commit(&fh).await.unwrap();
    assert_eq!(ok.verf, w.verf);
    assert_eq!(std::fs::read(f.tmp.path().join("f")).unwrap(), b"abcdef");

    let again = Fixture::open(f.tmp.path(), TempDir::new().unwrap()).await;
    let w3 = again
        .write(&root(), &fh, 0, b"A", stable_how::UNSTABLE)
        .await
        .unwrap();
    assert_ne!(w3.verf, w.verf, "a new instance has a new verifier");
}

#[tokio::test]
async fn directories_cannot_be_linked_truncated_but_can_be_committed() {
    let f = Fixture::new().await;
    let (d, _) = f.mkdir(&root(), &f.root, "d").await.unwrap();
    let file = f.create_file(&f.root, "file").await;
    std::os::unix::fs::symlink("nowhere", f.tmp.path().join("s")).unwrap();
    let (sym, _) = f.lookup(&root(), &f.root, "s").await.unwrap();
    // LINK of a directory: BADTYPE, whatever the name.
    for n in ["new", "file", "d", "."] {
        assert_eq!(
            f.link(&d, &f.root, n).await.unwrap_err(),
            nfsstat3::NFS3ERR_BADTYPE,
            "{n}"
        );
    }
    assert_eq!(
        f.link(&d, &file, "new").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOTDIR
    );
    assert_eq!(
        f.link(&file, &f.root, "d").await.unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );

    // SETATTR of a size: only regular files have one.
    let size = |n| sattr3 {
        size: Nfs3Option::Some(n),
        ..sattr3::default()
    };
    for fh in [&d, &sym, &f.root] {
        assert_eq!(
            f.setattr(&root(), fh, size(0), None).await.unwrap_err(),
            nfsstat3::NFS3ERR_BADTYPE
        );
    }
    f.setattr(&root(), &d, mode(0o700), None).await.unwrap();
    f.setattr(&root(), &file, size(3), None).await.unwrap();

    // COMMIT of a directory flushes it; of a symlink, there is nothing.
    let w = f
        .write(&root(), &file, 0, b"x", stable_how::UNSTABLE)
        .await
        .unwrap();
    for dir in [&d, &f.root] {
        let ok = f.commit(dir).await.unwrap();
        assert_eq!(ok.verf, w.verf);
        let (Nfs3Option::Some(_), Nfs3Option::Some(after)) =
            (ok.file_wcc.before, ok.file_wcc.after)
        else {
            panic!("COMMIT of a directory without wcc_data")
        };
        assert_eq!(after.type_, ftype3::NF3DIR);
    }
    assert_eq!(f.commit(&sym).await.unwrap_err(), nfsstat3::NFS3ERR_INVAL);
    assert_eq!(f.commit(&file).await.unwrap().verf, w.verf);
}
