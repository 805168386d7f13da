//! The `dir:` upstream driven through `NfsService::call`, as the front end
//! drives it, against a temporary directory.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

use gvfs_nfs::rpc::{AuthUnix, Credentials};
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use tempfile::TempDir;

use super::DirUpstream;

macro_rules! reply {
    ($reply:expr, $variant:ident) => {
        match $reply {
            NfsReply::$variant(Nfs3Result::Ok(ok)) => Ok(ok),
            NfsReply::$variant(Nfs3Result::Err((s, _))) => Err(s),
            other => panic!("unexpected reply to {:?}", other.proc_()),
        }
    };
}

/// Calls the procedure `$proc` of the fixture `$f` with `$args` as `$c`:
/// the reply's body on success, its status otherwise.
macro_rules! call {
    ($f:expr, $c:expr, $proc:ident($args:expr)) => {{
        let r = $f.call($c, NfsRequest::$proc($args)).await;
        reply!(r, $proc)
    }};
}

fn cx(uid: u32, gid: u32) -> CallContext {
    CallContext::with_cred(Credentials::unix(uid, gid))
}

fn root() -> CallContext {
    cx(0, 0)
}

fn am_root() -> bool {
    super::process_is_root()
}

fn name(n: &str) -> filename3<'static> {
    filename3(Opaque::owned(n.as_bytes().to_vec()))
}

/// The entry `n` of the directory `dir`.
fn at(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

/// The handle and attributes a procedure that makes an object must give.
fn made(obj: post_op_fh3, attr: post_op_attr, what: &str) -> (nfs_fh3, fattr3) {
    match (obj, attr) {
        (Nfs3Option::Some(fh), Nfs3Option::Some(a)) => (fh, a),
        _ => panic!("{what} without handle or attributes"),
    }
}

fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(m),
        ..sattr3::default()
    }
}

struct Fixture {
    tmp: TempDir,
    up: DirUpstream,
    root: nfs_fh3,
}

impl Fixture {
    /// An export of a fresh temporary directory.
    async fn new() -> Self {
        let tmp = TempDir::new().unwrap();
        let export = tmp.path().to_path_buf();
        Self::open(&export, tmp).await
    }

    /// An export of `export`; `tmp` is kept alive (and reachable as
    /// `f.tmp`) for as long as the fixture.
    async fn open(export: &std::path::Path, tmp: TempDir) -> Self {
        let up = DirUpstream::open(export).unwrap();
        let root = up.root(&root()).await.unwrap();
        Self { tmp, up, root }
    }

    async fn call(&self, c: &CallContext, req: NfsRequest) -> NfsReply {
        self.up.call(c, req).await.unwrap()
    }

    async fn lookup(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
    ) -> Result<(nfs_fh3, fattr3), nfsstat3> {
        call!(self, c, Lookup(LOOKUP3args { what: at(dir, n) })).map(|ok| {
            let Nfs3Option::Some(a) = ok.obj_attributes else {
                panic!("LOOKUP without attributes")
            };
            (ok.object, a)
        })
    }

    async fn create(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
        how: createhow3,
    ) -> Result<(nfs_fh3, fattr3), nfsstat3> {
        call!(
            self,
            c,
            Create(CREATE3args {
                where_: at(dir, n),
                how,
            })
        )
        .map(|ok| made(ok.obj, ok.obj_attributes, "CREATE"))
    }

    async fn mkdir(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
    ) -> Result<(nfs_fh3, fattr3), nfsstat3> {
        call!(
            self,
            c,
            Mkdir(MKDIR3args {
                where_: at(dir, n),
                attributes: mode(0o755),
            })
        )
        .map(|ok| made(ok.obj, ok.obj_attributes, "MKDIR"))
    }

    /// A symlink `n` in `dir` to `target`, made by `c`.
    async fn symlink(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
        target: &[u8],
    ) -> Result<(nfs_fh3, fattr3), nfsstat3> {
        call!(
            self,
            c,
            Symlink(SYMLINK3args {
                where_: at(dir, n),
                symlink: symlinkdata3 {
                    symlink_attributes: sattr3::default(),
                    symlink_data: nfspath3(Opaque::owned(target.to_vec())),
                },
            })
        )
        .map(|ok| made(ok.obj, ok.obj_attributes, "SYMLINK"))
    }

    async fn mknod(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
        what: mknoddata3,
    ) -> Result<(nfs_fh3, fattr3), nfsstat3> {
        call!(
            self,
            c,
            Mknod(MKNOD3args {
                where_: at(dir, n),
                what,
            })
        )
        .map(|ok| made(ok.obj, ok.obj_attributes, "MKNOD"))
    }

    async fn readlink(&self, c: &CallContext, fh: &nfs_fh3) -> Result<Vec<u8>, nfsstat3> {
        call!(
            self,
            c,
            Readlink(READLINK3args {
                symlink: fh.clone(),
            })
        )
        .map(|ok| ok.data.0.to_vec())
    }

    /// A hard link `n` in `dir` to `fh`, made by root.
    async fn link(&self, fh: &nfs_fh3, dir: &nfs_fh3, n: &str) -> Result<LINK3resok, nfsstat3> {
        call!(
            self,
            &root(),
            Link(LINK3args {
                file: fh.clone(),
                link: at(dir, n),
            })
        )
    }

    /// A regular file `n` in `dir`, made by root with mode 0644.
    async fn create_file(&self, dir: &nfs_fh3, n: &str) -> nfs_fh3 {
        let (fh, _) = self
            .create(&root(), dir, n, unchecked(0o644))
            .await
            .unwrap();
        fh
    }

    /// A regular file `n` in `dir` (see `create_file`) holding `data`,
    /// written through.
    async fn file_with(&self, dir: &nfs_fh3, n: &str, data: &[u8]) -> nfs_fh3 {
        let fh = self.create_file(dir, n).await;
        self.write(&root(), &fh, 0, data, stable_how::FILE_SYNC)
            .await
            .unwrap();
        fh
    }

    async fn write(
        &self,
        c: &CallContext,
        fh: &nfs_fh3,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Result<WRITE3resok, nfsstat3> {
        call!(
            self,
            c,
            Write(WRITE3args {
                file: fh.clone(),
                offset,
                count: data.len() as u32,
                stable,
                data: Opaque::owned(data.to_vec()),
            })
        )
    }

    async fn commit(&self, fh: &nfs_fh3) -> Result<COMMIT3resok, nfsstat3> {
        call!(
            self,
            &root(),
            Commit(COMMIT3args {
                file: fh.clone(),
                offset: 0,
                count: 0,
            })
        )
    }

    async fn read(
        &self,
        c: &CallContext,
        fh: &nfs_fh3,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        call!(
            self,
            c,
            Read(READ3args {
                file: fh.clone(),
                offset,
                count,
            })
        )
        .map(|ok| {
            assert_eq!(ok.count as usize, ok.data.len());
            (ok.data.to_vec(), ok.eof)
        })
    }

    async fn getattr(&self, fh: &nfs_fh3) -> Result<fattr3, nfsstat3> {
        call!(self, &root(), Getattr(GETATTR3args { object: fh.clone() }))
            .map(|ok| ok.obj_attributes)
    }

    async fn setattr(
        &self,
        c: &CallContext,
        fh: &nfs_fh3,
        s: sattr3,
        guard: Option<nfstime3>,
    ) -> Result<SETATTR3resok, nfsstat3> {
        call!(
            self,
            c,
            Setattr(SETATTR3args {
                object: fh.clone(),
                new_attributes: s,
                guard: match guard {
                    Some(t) => Nfs3Option::Some(t),
                    None => Nfs3Option::None,
                },
            })
        )
    }

    async fn remove(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
    ) -> Result<REMOVE3resok, nfsstat3> {
        call!(self, c, Remove(REMOVE3args { object: at(dir, n) }))
    }

    async fn rename(
        &self,
        from: &nfs_fh3,
        f: &str,
        to: &nfs_fh3,
        t: &str,
    ) -> Result<RENAME3resok, nfsstat3> {
        call!(
            self,
            &root(),
            Rename(RENAME3args {
                from: at(from, f),
                to: at(to, t),
            })
        )
    }

    async fn readdir(
        &self,
        dir: &nfs_fh3,
        cookie: u64,
        cookieverf: cookieverf3,
        count: u32,
    ) -> Result<READDIR3resok<'static>, nfsstat3> {
        call!(
            self,
            &root(),
            Readdir(READDIR3args {
                dir: dir.clone(),
                cookie,
                cookieverf,
                count,
            })
        )
    }

    /// Every entry of `dir` by READDIR pages of `count` bytes; `between`
    /// runs after each page.
    async fn readdir_all(
        &self,
        dir: &nfs_fh3,
        count: u32,
        mut between: impl AsyncFnMut(usize),
    ) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let (mut cookie, mut verf) = (0, cookieverf3::default());
        for page in 0.. {
            let ok = self.readdir(dir, cookie, verf, count).await.unwrap();
            assert_ne!(ok.cookieverf, cookieverf3::default());
            verf = ok.cookieverf;
            let mut size = 0;
            for e in &ok.reply.entries.0 {
                assert!(e.cookie > cookie, "cookies increase");
                cookie = e.cookie;
                size += 24 + e.name.len().div_ceil(4) * 4;
                out.push((String::from_utf8(e.name.0.to_vec()).unwrap(), e.fileid));
            }
            assert!(
                size + 108 <= count as usize,
                "reply of {size} bytes exceeds count"
            );
            if ok.reply.eof {
                break;
            }
            assert!(!ok.reply.entries.0.is_empty(), "no progress");
            between(page).await;
        }
        out
    }
}

fn unchecked(m: u32) -> createhow3 {
    createhow3::UNCHECKED(mode(m))
}

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

#[tokio::test]
async fn handles_survive_restart_and_renames() {
    let f = Fixture::new().await;
    let (a, _) = f.mkdir(&root(), &f.root, "a").await.unwrap();
    let (b, _) = f.mkdir(&root(), &a, "b").await.unwrap();
    let file = f.file_with(&b, "f", b"payload").await;

    // Rename of an ancestor through NFS.
    f.rename(&f.root, "a", &f.root, "a2").await.unwrap();
    assert_eq!(f.read(&root(), &file, 0, 100).await.unwrap().0, b"payload");
    assert_eq!(f.getattr(&b).await.unwrap().type_, ftype3::NF3DIR);

    // A new instance on the same directory, after a rename behind its back.
    std::fs::rename(f.tmp.path().join("a2"), f.tmp.path().join("a3")).unwrap();
    let g = Fixture::open(f.tmp.path(), TempDir::new().unwrap()).await;
    assert_eq!(g.root, f.root, "the root handle is stable");
    assert_eq!(g.read(&root(), &file, 0, 100).await.unwrap().0, b"payload");
    assert_eq!(g.getattr(&a).await.unwrap().type_, ftype3::NF3DIR);
    let (found, _) = g.lookup(&root(), &b, "f").await.unwrap();
    assert_eq!(found, file);
    // The first instance finds it too, though its index is out of date.
    std::fs::rename(f.tmp.path().join("a3"), f.tmp.path().join("a4")).unwrap();
    assert_eq!(f.getattr(&file).await.unwrap().size, 7);
    let (dotdot, _) = f.lookup(&root(), &b, "..").await.unwrap();
    assert_eq!(dotdot, a);
}

#[tokio::test]
async fn stale_and_bad_handles() {
    let f = Fixture::new().await;
    let fh = f.create_file(&f.root, "f").await;
    f.write(&root(), &fh, 0, b"x", stable_how::UNSTABLE)
        .await
        .unwrap();
    let (d, _) = f.mkdir(&root(), &f.root, "d").await.unwrap();
    f.remove(&root(), &f.root, "f").await.unwrap();
    assert_eq!(f.getattr(&fh).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);
    assert_eq!(
        f.read(&root(), &fh, 0, 1).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    assert_eq!(
        f.remove(&root(), &f.root, "f").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );

    // Removed behind the proxy's back, seen by a fresh instance.
    std::fs::remove_dir(f.tmp.path().join("d")).unwrap();
    let fresh = Fixture::open(f.tmp.path(), TempDir::new().unwrap()).await;
    assert_eq!(
        fresh.getattr(&d).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    assert_eq!(f.getattr(&d).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);

    for bad in [vec![], vec![1, 2, 3], vec![0; 64]] {
        let fh = nfs_fh3 {
            data: Opaque::owned(bad),
        };
        assert_eq!(
            f.getattr(&fh).await.unwrap_err(),
            nfsstat3::NFS3ERR_BADHANDLE
        );
    }
    // A handle of another export is stale.
    let other = Fixture::new().await;
    let theirs = other.create_file(&other.root, "f").await;
    assert_eq!(
        f.getattr(&theirs).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
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

#[tokio::test]
async fn setattr_truncate_times_and_guard() {
    let f = Fixture::new().await;
    let fh = f.file_with(&f.root, "f", b"0123456789").await;
    let attr = f.getattr(&fh).await.unwrap();
    let wrong = nfstime3 {
        seconds: attr.ctime.seconds.wrapping_add(1),
        nseconds: attr.ctime.nseconds,
    };
    let truncate = sattr3 {
        size: Nfs3Option::Some(4),
        ..sattr3::default()
    };
    assert_eq!(
        f.setattr(&root(), &fh, truncate.clone(), Some(wrong))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_NOT_SYNC
    );
    assert_eq!(f.getattr(&fh).await.unwrap().size, 10);
    let ok = f
        .setattr(&root(), &fh, truncate, Some(attr.ctime))
        .await
        .unwrap();
    let Nfs3Option::Some(after) = ok.obj_wcc.after else {
        panic!("no post-op attributes")
    };
    assert_eq!(after.size, 4);
    assert_eq!(std::fs::read(f.tmp.path().join("f")).unwrap(), b"0123");

    let when = nfstime3 {
        seconds: 1_000_000_000,
        nseconds: 123,
    };
    let times = sattr3 {
        mode: Nfs3Option::Some(0o4755),
        atime: set_atime::SET_TO_CLIENT_TIME(when),
        mtime: set_mtime::SET_TO_CLIENT_TIME(when),
        ..sattr3::default()
    };
    f.setattr(&root(), &fh, times, None).await.unwrap();
    let attr = f.getattr(&fh).await.unwrap();
    assert_eq!((attr.mode, attr.atime, attr.mtime), (0o4755, when, when));
    let now = sattr3 {
        mtime: set_mtime::SET_TO_SERVER_TIME,
        ..sattr3::default()
    };
    f.setattr(&root(), &fh, now, None).await.unwrap();
    assert!(f.getattr(&fh).await.unwrap().mtime.seconds > when.seconds);
    assert_eq!(
        f.setattr(
            &root(),
            &f.root,
            sattr3 {
                size: Nfs3Option::Some(0),
                ..sattr3::default()
            },
            None
        )
        .await
        .unwrap_err(),
        nfsstat3::NFS3ERR_BADTYPE
    );
}

#[tokio::test]
async fn fsinfo_fsstat_pathconf() {
    let f = Fixture::new().await;
    let ok = call!(
        f,
        &root(),
        Fsinfo(FSINFO3args {
            fsroot: f.root.clone(),
        })
    )
    .unwrap();
    assert_eq!(
        (ok.rtmax, ok.rtpref, ok.wtmax, ok.wtpref),
        (1 << 20, 1 << 20, 1 << 20, 1 << 20)
    );
    assert_eq!(ok.dtpref, 64 * 1024);
    assert_eq!(
        ok.time_delta,
        nfstime3 {
            seconds: 0,
            nseconds: 1
        }
    );
    assert_eq!(
        ok.properties,
        FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
    );
    assert!(ok.maxfilesize >= 1 << 40);
    let Nfs3Option::Some(attr) = ok.obj_attributes else {
        panic!("no attributes")
    };
    assert_eq!(attr.type_, ftype3::NF3DIR);

    let ok = call!(
        f,
        &root(),
        Fsstat(FSSTAT3args {
            fsroot: f.root.clone(),
        })
    )
    .unwrap();
    assert!(ok.tbytes > 0 && ok.tbytes >= ok.fbytes && ok.fbytes >= ok.abytes);

    let ok = call!(
        f,
        &root(),
        Pathconf(PATHCONF3args {
            object: f.root.clone(),
        })
    )
    .unwrap();
    assert_eq!(ok.name_max, 255);
    assert!(ok.no_trunc && ok.case_preserving && !ok.case_insensitive);

    let r = f
        .call(&root(), NfsRequest::Null(nfs3_types::xdr_codec::Void))
        .await;
    assert!(matches!(r, NfsReply::Null(_)));
    assert!(f.up.describe().starts_with("dir:/"));
}

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
