//! Fixtures for the tests of the `dir:` upstream: an export of a temporary
//! directory driven through `NfsService::call`, as the front end drives it.

use gvfs_nfs::rpc::Credentials;
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use tempfile::TempDir;

use super::DirUpstream;

macro_rules! reply {
    ($reply:expr, $variant:ident) => {
        match $reply {
            ::gvfs_nfs::NfsReply::$variant(::nfs3_types::nfs3::Nfs3Result::Ok(ok)) => Ok(ok),
            ::gvfs_nfs::NfsReply::$variant(::nfs3_types::nfs3::Nfs3Result::Err((s, _))) => Err(s),
            other => panic!("unexpected reply to {:?}", other.proc_()),
        }
    };
}

/// Calls the procedure `$proc` of the fixture `$f` with `$args` as `$c`:
/// the reply's body on success, its status otherwise.
macro_rules! call {
    ($f:expr, $c:expr, $proc:ident($args:expr)) => {{
        let r = $f.call($c, ::gvfs_nfs::NfsRequest::$proc($args)).await;
        $crate::dir::testing::reply!(r, $proc)
    }};
}

pub(super) use {call, reply};

pub(super) fn cx(uid: u32, gid: u32) -> CallContext {
    CallContext::with_cred(Credentials::unix(uid, gid))
}

pub(super) fn root() -> CallContext {
    cx(0, 0)
}

pub(super) fn am_root() -> bool {
    super::process_is_root()
}

fn name(n: &str) -> filename3<'static> {
    filename3(Opaque::owned(n.as_bytes().to_vec()))
}

/// The entry `n` of the directory `dir`.
pub(super) fn at(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
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

pub(super) fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(m),
        ..sattr3::default()
    }
}

pub(super) struct Fixture {
    pub(super) tmp: TempDir,
    pub(super) up: DirUpstream,
    pub(super) root: nfs_fh3,
}

impl Fixture {
    /// An export of a fresh temporary directory.
    pub(super) async fn new() -> Self {
        let tmp = TempDir::new().unwrap();
        let export = tmp.path().to_path_buf();
        Self::open(&export, tmp).await
    }

    /// An export of `export`; `tmp` is kept alive (and reachable as
    /// `f.tmp`) for as long as the fixture.
    pub(super) async fn open(export: &std::path::Path, tmp: TempDir) -> Self {
        let up = DirUpstream::open(export).unwrap();
        let root = up.root(&root()).await.unwrap();
        Self { tmp, up, root }
    }

    pub(super) async fn call(&self, c: &CallContext, req: NfsRequest) -> NfsReply {
        self.up.call(c, req).await.unwrap()
    }

    pub(super) async fn lookup(
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

    pub(super) async fn create(
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

    pub(super) async fn mkdir(
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
    pub(super) async fn symlink(
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

    pub(super) async fn mknod(
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

    pub(super) async fn readlink(
        &self,
        c: &CallContext,
        fh: &nfs_fh3,
    ) -> Result<Vec<u8>, nfsstat3> {
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
    pub(super) async fn link(
        &self,
        fh: &nfs_fh3,
        dir: &nfs_fh3,
        n: &str,
    ) -> Result<LINK3resok, nfsstat3> {
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
    pub(super) async fn create_file(&self, dir: &nfs_fh3, n: &str) -> nfs_fh3 {
        let (fh, _) = self
            .create(&root(), dir, n, unchecked(0o644))
            .await
            .unwrap();
        fh
    }

    /// A regular file `n` in `dir` (see `create_file`) holding `data`,
    /// written through.
    pub(super) async fn file_with(&self, dir: &nfs_fh3, n: &str, data: &[u8]) -> nfs_fh3 {
        let fh = self.create_file(dir, n).await;
        self.write(&root(), &fh, 0, data, stable_how::FILE_SYNC)
            .await
            .unwrap();
        fh
    }

    pub(super) async fn write(
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

    pub(super) async fn commit(&self, fh: &nfs_fh3) -> Result<COMMIT3resok, nfsstat3> {
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

    pub(super) async fn read(
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

    pub(super) async fn getattr(&self, fh: &nfs_fh3) -> Result<fattr3, nfsstat3> {
        call!(self, &root(), Getattr(GETATTR3args { object: fh.clone() }))
            .map(|ok| ok.obj_attributes)
    }

    pub(super) async fn setattr(
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

    pub(super) async fn remove(
        &self,
        c: &CallContext,
        dir: &nfs_fh3,
        n: &str,
    ) -> Result<REMOVE3resok, nfsstat3> {
        call!(self, c, Remove(REMOVE3args { object: at(dir, n) }))
    }

    pub(super) async fn rename(
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

    pub(super) async fn readdir(
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
    pub(super) async fn readdir_all(
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

pub(super) fn unchecked(m: u32) -> createhow3 {
    createhow3::UNCHECKED(mode(m))
}
