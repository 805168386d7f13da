//! CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and LINK, driven
//! through `NfsService::call`.

use std::os::unix::fs::MetadataExt;

use gvfs_nfs::CallContext;
use nfs3_types::nfs3::*;

use crate::dir::testing::at;
use crate::dir::testing::{Fixture, am_root, call, cx, mode, root, unchecked};

#[tokio::test]
async fn exclusive_create_semantics() {
    let f = Fixture::new().await;
    let a = createverf3(*b"verifier");
    let b = createverf3(*b"another!");
    let (fh, _) = f
        .create(&root(), &f.root, "x", createhow3::EXCLUSIVE(a))
        .await
        .unwrap();
    let (again, _) = f
        .create(&root(), &f.root, "x", createhow3::EXCLUSIVE(a))
        .await
        .unwrap();
    assert_eq!(again, fh, "a retransmission succeeds");
    assert_eq!(
        f.create(&root(), &f.root, "x", createhow3::EXCLUSIVE(b))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );
    assert_eq!(
        f.create(&root(), &f.root, "x", createhow3::GUARDED(mode(0o600)))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );
    // Once written, even the same verifier is refused.
    f.write(&root(), &fh, 0, b"data", stable_how::FILE_SYNC)
        .await
        .unwrap();
    assert_eq!(
        f.create(&root(), &f.root, "x", createhow3::EXCLUSIVE(a))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );
    // UNCHECKED on an existing file applies only a size of 0.
    let create_again = async |m, size| {
        let s = sattr3 {
            mode: Nfs3Option::Some(m),
            size: Nfs3Option::Some(size),
            ..sattr3::default()
        };
        let (same, attr) = f
            .create(&root(), &f.root, "x", createhow3::UNCHECKED(s))
            .await
            .unwrap();
        assert_eq!(same, fh);
        attr
    };
    let attr = create_again(0o644, 2).await;
    assert_eq!((attr.size, attr.mode), (4, 0o600));
    assert_eq!(create_again(0o600, 0).await.size, 0);
    f.mkdir(&root(), &f.root, "d").await.unwrap();
    assert_eq!(
        f.create(&root(), &f.root, "d", unchecked(0o644))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ISDIR
    );
}

#[tokio::test]
async fn create_without_a_mode_and_over_other_kinds() {
    let f = Fixture::new().await;
    // No mode given (always so for EXCLUSIVE): 0600, as nfs-ganesha.
    let (ex, attr) = f
        .create(
            &root(),
            &f.root,
            "ex",
            createhow3::EXCLUSIVE(createverf3(*b"verifier")),
        )
        .await
        .unwrap();
    assert_eq!((attr.type_, attr.mode), (ftype3::NF3REG, 0o600));
    assert_eq!(f.getattr(&ex).await.unwrap().mode, 0o600);
    let (_, attr) = f
        .create(
            &root(),
            &f.root,
            "plain",
            createhow3::UNCHECKED(sattr3::default()),
        )
        .await
        .unwrap();
    assert_eq!(attr.mode, 0o600);

    // An existing directory or symlink: UNCHECKED says what it is in the
    // way (ISDIR, BADTYPE); GUARDED and EXCLUSIVE say EXIST.
    f.mkdir(&root(), &f.root, "d").await.unwrap();
    std::os::unix::fs::symlink("nowhere", f.tmp.path().join("s")).unwrap();
    for (n, unchecked_says) in [
        ("d", nfsstat3::NFS3ERR_ISDIR),
        ("s", nfsstat3::NFS3ERR_BADTYPE),
    ] {
        assert_eq!(
            f.create(&root(), &f.root, n, unchecked(0o644))
                .await
                .unwrap_err(),
            unchecked_says,
            "{n}"
        );
        assert_eq!(
            f.create(&root(), &f.root, n, createhow3::GUARDED(mode(0o644)))
                .await
                .unwrap_err(),
            nfsstat3::NFS3ERR_EXIST,
            "{n}"
        );
        assert_eq!(
            f.create(
                &root(),
                &f.root,
                n,
                createhow3::EXCLUSIVE(createverf3(*b"verifier"))
            )
            .await
            .unwrap_err(),
            nfsstat3::NFS3ERR_EXIST,
            "{n}"
        );
    }
    assert!(
        std::fs::symlink_metadata(f.tmp.path().join("s"))
            .unwrap()
            .is_symlink()
    );
}

#[tokio::test]
async fn created_objects_belong_to_the_caller() {
    let f = Fixture::new().await;
    if !am_root() {
        return;
    }
    let user = cx(1000, 1000);
    let (d, _) = f.mkdir(&root(), &f.root, "home").await.unwrap();
    f.setattr(&root(), &d, mode(0o777), None).await.unwrap();
    let (_, fattr) = f.create(&user, &d, "file", unchecked(0o640)).await.unwrap();
    assert_eq!((fattr.uid, fattr.gid, fattr.mode), (1000, 1000, 0o640));
    let (sub, dattr) = f.mkdir(&user, &d, "dir").await.unwrap();
    assert_eq!((dattr.uid, dattr.gid, dattr.mode), (1000, 1000, 0o755));
    let (link, _) = f.symlink(&user, &sub, "link", b"../file").await.unwrap();
    let base = f.tmp.path().join("home");
    for p in [base.join("file"), base.join("dir"), base.join("dir/link")] {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "{}", p.display());
    }
    assert_eq!(f.readlink(&user, &link).await.unwrap(), b"../file");

    // AUTH_NONE creates as nobody.
    let (_, nattr) = f
        .create(&CallContext::default(), &d, "anon", unchecked(0o600))
        .await
        .unwrap();
    assert_eq!((nattr.uid, nattr.gid), (65534, 65534));
}

#[tokio::test]
async fn symlink_link_and_mknod() {
    let f = Fixture::new().await;
    let fh = f.file_with(&f.root, "target", b"linked").await;
    let (sym, _) = f
        .symlink(&root(), &f.root, "sym", b"/does/not/matter")
        .await
        .unwrap();
    assert_eq!(
        f.readlink(&root(), &sym).await.unwrap(),
        b"/does/not/matter"
    );
    assert_eq!(
        f.readlink(&root(), &fh).await.unwrap_err(),
        nfsstat3::NFS3ERR_INVAL
    );

    let ok = f.link(&fh, &f.root, "hard").await.unwrap();
    let Nfs3Option::Some(attr) = ok.file_attributes else {
        panic!("no attributes")
    };
    assert_eq!(attr.nlink, 2);
    let (hard, _) = f.lookup(&root(), &f.root, "hard").await.unwrap();
    assert_eq!(hard, fh, "one inode, one handle");
    f.remove(&root(), &f.root, "target").await.unwrap();
    assert_eq!(f.read(&root(), &fh, 0, 100).await.unwrap().0, b"linked");

    let fifo = || mknoddata3::NF3FIFO(mode(0o600));
    // A TempDir is 0700: others may not create in it.
    assert_eq!(
        f.mknod(&cx(1000, 1000), &f.root, "fifo", fifo())
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    let (_, attr) = f.mknod(&root(), &f.root, "fifo", fifo()).await.unwrap();
    assert_eq!((attr.type_, attr.mode), (ftype3::NF3FIFO, 0o600));
    let (fifo_fh, _) = f.lookup(&root(), &f.root, "fifo").await.unwrap();
    let sock = mknoddata3::NF3SOCK(mode(0o640));
    let (_, attr) = f.mknod(&root(), &f.root, "sock", sock).await.unwrap();
    assert_eq!((attr.type_, attr.mode), (ftype3::NF3SOCK, 0o640));
    assert_eq!(
        f.read(&root(), &fifo_fh, 0, 1).await.unwrap_err(),
        nfsstat3::NFS3ERR_INVAL
    );
    if am_root() {
        f.setattr(&root(), &f.root, mode(0o777), None)
            .await
            .unwrap();
        let null = mknoddata3::NF3CHR(devicedata3 {
            dev_attributes: mode(0o666),
            spec: specdata3 {
                specdata1: 1,
                specdata2: 3,
            },
        });
        assert_eq!(
            f.mknod(&cx(1000, 1000), &f.root, "null", null)
                .await
                .unwrap_err(),
            nfsstat3::NFS3ERR_PERM
        );
    }
    assert_eq!(
        f.mknod(&root(), &f.root, "reg", mknoddata3::default)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_BADTYPE
    );
}

#[tokio::test]
async fn rename_over_existing_and_rmdir() {
    let f = Fixture::new().await;
    let a = f.file_with(&f.root, "a", b"AAA").await;
    let b = f.file_with(&f.root, "b", b"B").await;
    let ok = f.rename(&f.root, "a", &f.root, "b").await.unwrap();
    assert!(ok.fromdir_wcc.before.is_some() && ok.todir_wcc.after.is_some());
    assert_eq!(f.getattr(&b).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);
    let (now_b, _) = f.lookup(&root(), &f.root, "b").await.unwrap();
    assert_eq!(now_b, a);
    assert_eq!(f.read(&root(), &a, 0, 10).await.unwrap().0, b"AAA");
    assert_eq!(
        f.rename(&f.root, "a", &f.root, "c").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    for (from, to) in [(".", "c"), ("..", "c"), ("b", "."), ("b", "..")] {
        assert_eq!(
            f.rename(&f.root, from, &f.root, to).await.unwrap_err(),
            nfsstat3::NFS3ERR_INVAL,
            "{from} -> {to}"
        );
    }

    let (d, _) = f.mkdir(&root(), &f.root, "d").await.unwrap();
    f.create_file(&d, "inside").await;
    let rmdir = async |n: &str| {
        call!(
            f,
            &root(),
            Rmdir(RMDIR3args {
                object: at(&f.root, n),
            })
        )
    };
    assert_eq!(rmdir("d").await.unwrap_err(), nfsstat3::NFS3ERR_NOTEMPTY);
    assert_eq!(rmdir("b").await.unwrap_err(), nfsstat3::NFS3ERR_NOTDIR);
    // RFC 1813 section 3.3.13's answers for servers that refuse the dots.
    assert_eq!(rmdir(".").await.unwrap_err(), nfsstat3::NFS3ERR_INVAL);
    assert_eq!(rmdir("..").await.unwrap_err(), nfsstat3::NFS3ERR_EXIST);
    assert_eq!(
        f.remove(&root(), &f.root, "d").await.unwrap_err(),
        nfsstat3::NFS3ERR_ISDIR
    );
    f.remove(&root(), &d, "inside").await.unwrap();
    let ok = rmdir("d").await.unwrap();
    assert!(ok.dir_wcc.before.is_some() && ok.dir_wcc.after.is_some());
    assert_eq!(f.getattr(&d).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);
}
