//! The `dir:` upstream as a whole: what it refuses to serve, and that
//! nothing outside the exported directory is reachable.

use gvfs_nfs::{NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use tempfile::TempDir;

use super::DirUpstream;
use crate::dir::testing::{Fixture, mode, root, unchecked};

#[tokio::test]
async fn open_refuses_what_cannot_be_served() {
    let tmp = TempDir::new().unwrap();
    let missing = tmp.path().join("missing");
    let e = DirUpstream::open(&missing).unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains("No such file"), "{e}");
    let file = tmp.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let e = DirUpstream::open(&file).unwrap_err().to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[tokio::test]
async fn names_cannot_escape_the_root() {
    let outer = TempDir::new().unwrap();
    std::fs::write(outer.path().join("secret"), b"s").unwrap();
    let export = outer.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::os::unix::fs::symlink(outer.path(), export.join("out")).unwrap();
    let f = Fixture::open(&export, outer).await;

    let (dotdot, _) = f.lookup(&root(), &f.root, "..").await.unwrap();
    assert_eq!(dotdot, f.root, "the root is its own parent");
    let (dot, _) = f.lookup(&root(), &f.root, ".").await.unwrap();
    assert_eq!(dot, f.root);
    for bad in ["../secret", "out/secret", "/etc", "", "a\0b"] {
        assert_eq!(
            f.lookup(&root(), &f.root, bad).await.unwrap_err(),
            nfsstat3::NFS3ERR_ACCES,
            "{bad:?}"
        );
        assert!(
            f.create(&root(), &f.root, bad, unchecked(0o644))
                .await
                .is_err(),
            "{bad:?}"
        );
    }
    assert_eq!(
        f.lookup(&root(), &f.root, &"n".repeat(256))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_NAMETOOLONG
    );
    for dots in [".", ".."] {
        assert_eq!(
            f.create(&root(), &f.root, dots, unchecked(0o644))
                .await
                .unwrap_err(),
            nfsstat3::NFS3ERR_EXIST
        );
        assert_eq!(
            f.remove(&root(), &f.root, dots).await.unwrap_err(),
            nfsstat3::NFS3ERR_ISDIR
        );
    }

    // The symlink is an object of its own, never followed.
    let (link, attr) = f.lookup(&root(), &f.root, "out").await.unwrap();
    assert_eq!(attr.type_, ftype3::NF3LNK);
    assert_eq!(
        f.lookup(&root(), &link, "secret").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOTDIR
    );
    assert_eq!(
        f.create(&root(), &link, "new", unchecked(0o644))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_NOTDIR
    );
    assert_eq!(
        f.read(&root(), &link, 0, 10).await.unwrap_err(),
        nfsstat3::NFS3ERR_INVAL
    );

    // A directory swapped for a symlink behind the proxy's back is stale,
    // not followed.
    let (d, _) = f.mkdir(&root(), &f.root, "d").await.unwrap();
    std::fs::remove_dir(export.join("d")).unwrap();
    std::os::unix::fs::symlink(f.tmp.path(), export.join("d")).unwrap();
    assert_eq!(
        f.lookup(&root(), &d, "secret").await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    fn arb_name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(
                prop_oneof![Just(b'.'), Just(b'/'), Just(b'a'), Just(0u8)],
                0..8
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Arbitrary names and handles never panic, and nothing appears
        /// outside the export.
        #[test]
        fn arbitrary_names_and_handles(names in prop::collection::vec(arb_name(), 1..6),
                                       handle in prop::collection::vec(any::<u8>(), 0..=64)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let outer = TempDir::new().unwrap();
                let export = outer.path().join("export");
                std::fs::create_dir(&export).unwrap();
                let up = DirUpstream::open(&export).unwrap();
                let root_fh = up.root(&root()).await.unwrap();
                let bogus = nfs_fh3 { data: Opaque::owned(handle) };
                for n in &names {
                    let what = |dir: &nfs_fh3| diropargs3 { dir: dir.clone(), name: filename3(Opaque::owned(n.clone())) };
                    for dir in [&root_fh, &bogus] {
                        let reqs = vec![
                            NfsRequest::Lookup(LOOKUP3args { what: what(dir) }),
                            NfsRequest::Create(CREATE3args { where_: what(dir), how: unchecked(0o644) }),
                            NfsRequest::Mkdir(MKDIR3args { where_: what(dir), attributes: mode(0o755) }),
                            NfsRequest::Symlink(SYMLINK3args { where_: what(dir), symlink: symlinkdata3 {
                                symlink_attributes: sattr3::default(),
                                symlink_data: nfspath3(Opaque::owned(n.clone())) } }),
                            NfsRequest::Rename(RENAME3args { from: what(dir), to: what(&root_fh) }),
                            NfsRequest::Link(LINK3args { file: dir.clone(), link: what(&root_fh) }),
                            NfsRequest::Remove(REMOVE3args { object: what(dir) }),
                            NfsRequest::Rmdir(RMDIR3args { object: what(dir) }),
                            NfsRequest::Readdirplus(READDIRPLUS3args { dir: dir.clone(), cookie: 0,
                                cookieverf: cookieverf3::default(), dircount: 0, maxcount: 0 }),
                            NfsRequest::Read(READ3args { file: dir.clone(), offset: u64::MAX, count: u32::MAX }),
                            NfsRequest::Write(WRITE3args { file: dir.clone(), offset: u64::MAX, count: u32::MAX,
                                stable: stable_how::FILE_SYNC, data: Opaque::owned(vec![1]) }),
                        ];
                        for req in reqs {
                            up.call(&root(), req).await.unwrap();
                        }
                    }
                }
                let outside: Vec<_> = std::fs::read_dir(outer.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
                assert_eq!(outside, vec![std::ffi::OsString::from("export")]);
            });
        }
    }
}
