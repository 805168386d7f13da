//! The mode-bit checks, alone and as other users see them through
//! `NfsService::call`.

use std::os::unix::fs::MetadataExt;

use gvfs_nfs::CallContext;
use gvfs_nfs::rpc::AuthUnix;
use nfs3_types::nfs3::*;

use super::*;
use crate::dir::attr::{S_IFDIR, S_IFREG};
use crate::dir::testing::{Fixture, am_root, call, cx, mode, root, unchecked};

fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
    Attr {
        ino: 5,
        generation: 0,
        mode,
        nlink: 1,
        uid,
        gid,
        size: 0,
        blocks: 0,
        rdev: (0, 0),
        atime: nfstime3::default(),
        mtime: nfstime3::default(),
        ctime: nfstime3::default(),
    }
}

#[test]
fn owner_group_other_bits() {
    let f = attr(S_IFREG | 0o640, 1000, 100);
    let owner = Caller::from_cred(&Credentials::unix(1000, 1));
    let member = Caller::from_cred(&Credentials::unix(2000, 100));
    let other = Caller::from_cred(&Credentials::unix(3000, 3000));
    assert!(owner.may(&f, R | W));
    assert!(!owner.may(&f, X));
    assert!(member.may(&f, R));
    assert!(!member.may(&f, W));
    assert!(!other.may(&f, R));
    assert!(!Caller::from_cred(&Credentials::None).may(&f, R));
}

#[test]
fn root_needs_an_x_bit_to_execute_files() {
    let root = Caller::from_cred(&Credentials::unix(0, 0));
    let f = attr(S_IFREG, 1000, 1000);
    assert!(root.may(&f, R | W));
    assert!(!root.may(&f, X));
    assert!(root.may(&attr(S_IFREG | 0o001, 1, 1), X));
    assert!(root.may(&attr(S_IFDIR, 1, 1), R | W | X));
}

#[test]
fn access_on_a_directory() {
    let d = attr(S_IFDIR | 0o755, 1000, 1000);
    let other = Caller::from_cred(&Credentials::unix(2000, 2000));
    assert_eq!(other.access3(&d, 0x3f), ACCESS3_READ | ACCESS3_LOOKUP);
    let owner = Caller::from_cred(&Credentials::unix(1000, 1000));
    assert_eq!(
        owner.access3(&d, 0x3f),
        ACCESS3_READ | ACCESS3_LOOKUP | ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE
    );
    assert_eq!(owner.access3(&d, ACCESS3_READ), ACCESS3_READ);
}

#[tokio::test]
async fn access_and_permissions_for_other_users() {
    let f = Fixture::new().await;
    if !am_root() {
        return;
    }
    let path = f.tmp.path().join("private");
    std::fs::write(&path, b"data").unwrap();
    std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let (fh, _) = f.lookup(&root(), &f.root, "private").await.unwrap();
    let access = async |c: &CallContext| {
        call!(
            f,
            c,
            Access(ACCESS3args {
                object: fh.clone(),
                access: 0x3f,
            })
        )
        .unwrap()
        .access
    };
    assert_eq!(access(&cx(2000, 2000)).await, 0);
    let member = CallContext::with_cred(Credentials::Unix(AuthUnix {
        uid: 2000,
        gid: 2000,
        gids: vec![1000],
        ..AuthUnix::default()
    }));
    assert_eq!(access(&member).await, ACCESS3_READ);
    assert_eq!(
        access(&cx(1000, 1000)).await,
        ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND
    );
    assert_eq!(
        access(&root()).await,
        ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND
    );
    assert_eq!(
        access(&CallContext::default()).await,
        0,
        "AUTH_NONE is nobody"
    );

    assert_eq!(
        f.read(&cx(2000, 2000), &fh, 0, 10).await.unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    assert_eq!(f.read(&member, &fh, 0, 10).await.unwrap().0, b"data");
    assert_eq!(
        f.write(&member, &fh, 0, b"x", stable_how::UNSTABLE)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    assert_eq!(
        f.setattr(&member, &fh, mode(0o777), None)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_PERM
    );
    assert_eq!(
        f.create(&cx(2000, 2000), &f.root, "nope", unchecked(0o644))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ACCES,
        "the root directory is not writable by others"
    );
    // The owner may chmod; giving the file away needs root.
    f.setattr(&cx(1000, 1000), &fh, mode(0o600), None)
        .await
        .unwrap();
    let give = sattr3 {
        uid: Nfs3Option::Some(2000),
        ..sattr3::default()
    };
    assert_eq!(
        f.setattr(&cx(1000, 1000), &fh, give.clone(), None)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_PERM
    );
    f.setattr(&root(), &fh, give, None).await.unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), 2000);

    // In a sticky directory only the owner of an entry (or of the
    // directory) may remove it.
    let (tmp, _) = f.mkdir(&root(), &f.root, "tmp").await.unwrap();
    f.setattr(&root(), &tmp, mode(0o1777), None).await.unwrap();
    f.setattr(&root(), &f.root, mode(0o755), None)
        .await
        .unwrap();
    f.create(&cx(1000, 1000), &tmp, "mine", unchecked(0o666))
        .await
        .unwrap();
    assert_eq!(
        f.remove(&cx(2000, 2000), &tmp, "mine").await.unwrap_err(),
        nfsstat3::NFS3ERR_PERM
    );
    f.remove(&cx(1000, 1000), &tmp, "mine").await.unwrap();
}
