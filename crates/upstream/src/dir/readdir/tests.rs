//! The cookie and size arithmetic of READDIR and READDIRPLUS, and both
//! procedures driven through `NfsService::call`.

use std::collections::HashMap;

use nfs3_types::xdr_codec::Pack;

use super::*;
use crate::dir::testing::{Fixture, call, root, unchecked};

#[test]
fn cookies_are_stable_and_clear_of_the_dots() {
    assert_eq!(name_cookie(b"disk.img"), name_cookie(b"disk.img"));
    assert_ne!(name_cookie(b"a"), name_cookie(b"b"));
    for i in 0..10_000u32 {
        let c = name_cookie(format!("f{i}").as_bytes());
        assert!((FIRST_NAME_COOKIE..1 << 63).contains(&c));
    }
}

#[test]
fn size_estimates_match_the_encoding() {
    let e = entry3 {
        fileid: 1,
        name: filename3(Opaque::owned(b"hello".to_vec())),
        cookie: 9,
    };
    assert_eq!(entry3_size(5), 4 + e.packed_size());
    let attr = fattr3 {
        type_: ftype3::NF3REG,
        mode: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        size: 0,
        used: 0,
        rdev: specdata3::default(),
        fsid: 0,
        fileid: 0,
        atime: nfstime3::default(),
        mtime: nfstime3::default(),
        ctime: nfstime3::default(),
    };
    assert_eq!(attr.packed_size(), FATTR3_SIZE);
    let p = entryplus3 {
        fileid: 1,
        name: filename3(Opaque::owned(b"hello".to_vec())),
        cookie: 9,
        name_attributes: Nfs3Option::Some(attr),
        name_handle: Nfs3Option::Some(super::super::handle::encode(
            1,
            super::super::handle::FileKey {
                ino: 1,
                generation: 2,
            },
        )),
    };
    assert_eq!(entryplus3_size(5), 4 + p.packed_size());
}

#[test]
fn a_page_never_splits_a_cookie() {
    let e = |cookie| Entry {
        cookie,
        name: vec![b'x'],
        ino: 1,
        kind: Kind::Child,
    };
    let entries = [e(3), e(5), e(5), e(7)];
    let mut n = 0;
    let (p, eof) = page(&entries, 0, |_, _| {
        n += 1;
        n <= 2
    })
    .expect("one entry fits");
    assert_eq!((p.len(), eof), (1, false));
    let (p, eof) = page(&entries, 3, |_, _| true).expect("all fit");
    assert_eq!((p.len(), eof), (3, true));
    assert_eq!(
        page(&entries, 0, |_, _| false).map(|(p, _)| p.len()),
        Err(Fail(nfsstat3::NFS3ERR_TOOSMALL))
    );
    let (p, eof) = page(&entries, 7, |_, _| false).expect("nothing left");
    assert_eq!((p.len(), eof), (0, true));
}

#[tokio::test]
async fn readdir_pages_see_every_name_once_while_the_directory_changes() {
    let f = Fixture::new().await;
    let (d, _) = f.mkdir(&root(), &f.root, "big").await.unwrap();
    let dir = f.tmp.path().join("big");
    for i in 0..300 {
        std::fs::write(dir.join(format!("file-{i:03}")), b"").unwrap();
    }
    let before: Vec<String> = (0..300).map(|i| format!("file-{i:03}")).collect();
    let seen = f
        .readdir_all(&d, 1024, async |page| {
            // Entries come and go between pages, through NFS and behind its
            // back.
            std::fs::write(dir.join(format!("new-{page}")), b"").unwrap();
            f.create(&root(), &d, &format!("nfs-{page}"), unchecked(0o644))
                .await
                .unwrap();
            if page == 3 {
                std::fs::remove_file(dir.join("new-0")).unwrap();
            }
        })
        .await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (n, _) in &seen {
        *counts.entry(n.as_str()).or_default() += 1;
    }
    assert!(counts.values().all(|&c| c == 1), "a name came twice");
    for n in &before {
        assert_eq!(counts.get(n.as_str()), Some(&1), "{n} missing");
    }
    assert_eq!(counts.get("."), Some(&1));
    assert_eq!(counts.get(".."), Some(&1));
    let (_, fattr) = f.lookup(&root(), &d, "file-007").await.unwrap();
    assert!(seen.contains(&("file-007".to_string(), fattr.fileid)));

    // Too small for a single entry.
    assert_eq!(
        f.readdir(&d, 0, cookieverf3::default(), 100)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_TOOSMALL
    );
}

#[tokio::test]
async fn readdirplus_gives_handles_and_attributes() {
    let f = Fixture::new().await;
    let (sub, _) = f.mkdir(&root(), &f.root, "sub").await.unwrap();
    for i in 0..50 {
        let (fh, _) = f
            .create(&root(), &sub, &format!("f{i}"), unchecked(0o600))
            .await
            .unwrap();
        f.write(&root(), &fh, 0, &vec![1; i], stable_how::UNSTABLE)
            .await
            .unwrap();
    }
    let mut cookie = 0;
    let mut names = Vec::new();
    loop {
        let ok = call!(
            f,
            &root(),
            Readdirplus(READDIRPLUS3args {
                dir: sub.clone(),
                cookie,
                cookieverf: cookieverf3::default(),
                dircount: 512,
                maxcount: 4096,
            })
        )
        .unwrap();
        for e in ok.reply.entries.0 {
            cookie = e.cookie;
            let n = String::from_utf8(e.name.0.to_vec()).unwrap();
            let (Nfs3Option::Some(fh), Nfs3Option::Some(attr)) = (e.name_handle, e.name_attributes)
            else {
                panic!("{n} without handle or attributes")
            };
            assert_eq!(attr.fileid, e.fileid);
            let now = f.getattr(&fh).await.unwrap();
            assert_eq!(now.fileid, attr.fileid);
            if let Some(i) = n.strip_prefix('f') {
                assert_eq!(attr.size, i.parse::<u64>().unwrap());
            }
            if n == ".." {
                assert_eq!(fh, f.root);
            }
            if n == "." {
                assert_eq!(fh, sub);
            }
            names.push(n);
        }
        if ok.reply.eof {
            break;
        }
    }
    assert_eq!(names.len(), 52);
}
