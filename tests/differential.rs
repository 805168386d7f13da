//! Differential fidelity: one seeded random workload of NFSv3 operations is
//! applied directly to nfs-ganesha and, in lock step, through a chain of
//! three gvfs proxies to a second nfs-ganesha. Every reply status must match,
//! every payload that both servers should agree on must match, and at the
//! end the two export trees must be identical.
//!
//! The same workload also runs against a proxy serving the `dir:` origin
//! instead of the chain; there the only differences allowed are the ganesha
//! bugs listed in `DIR_ORIGIN_EQUIVALENCES`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::{Credentials, NfsReply, NfsRequest};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::proxy::chain;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OPS: usize = 2500;
const NAMES: [&str; 6] = ["a", "b", "c", "dir", "x.img", "long-name-0123456789"];

struct Pair {
    direct: NfsClient,
    chained: NfsClient,
    /// Replies seen per (procedure, status), to show the workload did
    /// exercise both success and failure paths.
    seen: std::sync::Mutex<BTreeMap<(String, String), usize>>,
    /// Known ganesha bugs the other side need not copy (empty: none).
    accepted: &'static [Equivalence],
}

/// A reply of nfs-ganesha's that is a bug of ganesha's, and the answer the
/// other side gives instead: (procedure, ganesha's status, ours), accepted
/// as equivalent for that procedure only.
struct Equivalence {
    procedure: &'static str,
    ganesha: nfsstat3,
    ours: nfsstat3,
    /// Why ganesha is wrong.
    reason: &'static str,
    /// Whether ganesha's side effect must be undone to keep the two trees
    /// comparable.
    undo: Option<Undo>,
}

/// A side effect of a ganesha bug, undone on ganesha's side.
#[derive(Clone, Copy)]
enum Undo {
    /// CREATE followed the symbolic link it was asked to create over and
    /// made (or opened) the link's target.
    CreateThroughSymlink,
}

/// Where the `dir:` origin, which follows knfsd and RFC 1813 there, is
/// allowed to differ from nfs-ganesha (V5, FSAL_VFS).
const DIR_ORIGIN_EQUIVALENCES: &[Equivalence] = &[
    Equivalence {
        procedure: "COMMIT",
        ganesha: nfsstat3::NFS3ERR_SERVERFAULT,
        ours: nfsstat3::NFS3ERR_INVAL,
        reason: "ganesha fails to open a symlink to fsync it; knfsd answers INVAL (no data to commit)",
        undo: None,
    },
    Equivalence {
        procedure: "CREATE",
        ganesha: nfsstat3::NFS3_OK,
        ours: nfsstat3::NFS3ERR_BADTYPE,
        reason: "UNCHECKED over a symlink ganesha has not cached follows the link and makes its \
                 target (cached, ganesha itself answers BADTYPE)",
        undo: Some(Undo::CreateThroughSymlink),
    },
];

fn name(n: &str) -> filename3<'static> {
    filename3::from(n.as_bytes().to_vec())
}

fn remove(dir: nfs_fh3, n: &str) -> NfsRequest {
    NfsRequest::Remove(REMOVE3args {
        object: diropargs3 { dir, name: name(n) },
    })
}

fn sattr(mode: Option<u32>, size: Option<u64>) -> sattr3 {
    sattr3 {
        mode: mode.map_or(set_mode3::None, set_mode3::Some),
        size: size.map_or(set_size3::None, set_size3::Some),
        ..sattr3::default()
    }
}

/// The parts of a reply both servers must agree on: its status and, on
/// success, a summary of the payload that does not depend on timing or on
/// which export directory served it.
fn summary(r: &NfsReply) -> String {
    let st = r.status();
    let body = match r {
        NfsReply::Getattr(Nfs3Result::Ok(ok)) => attr_summary(&ok.obj_attributes),
        NfsReply::Lookup(Nfs3Result::Ok(ok)) => match &ok.obj_attributes {
            Nfs3Option::Some(a) => attr_summary(a),
            Nfs3Option::None => String::new(),
        },
        NfsReply::Read(Nfs3Result::Ok(ok)) => {
            format!(
                "count={} eof={} sum={:x}",
                ok.count,
                ok.eof,
                checksum(&ok.data)
            )
        }
        NfsReply::Write(Nfs3Result::Ok(ok)) => format!("count={}", ok.count),
        NfsReply::Readlink(Nfs3Result::Ok(ok)) => String::from_utf8_lossy(&ok.data.0).into_owned(),
        NfsReply::Access(Nfs3Result::Ok(ok)) => format!("access={:#x}", ok.access),
        _ => String::new(),
    };
    format!("{st:?} {body}")
}

fn attr_summary(a: &fattr3) -> String {
    let size = if a.type_ == ftype3::NF3DIR { 0 } else { a.size };
    format!(
        "type={:?} mode={:o} nlink={} size={size}",
        a.type_, a.mode, a.nlink
    )
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}

impl Pair {
    /// `direct` when `c` is the direct client, else `chained`.
    fn pick(&self, c: &NfsClient, direct: &nfs_fh3, chained: &nfs_fh3) -> nfs_fh3 {
        if std::ptr::eq(c, &self.direct) {
            direct.clone()
        } else {
            chained.clone()
        }
    }

    /// Resolves `path` on both sides; both must agree whether it exists.
    async fn resolve(&self, path: &str) -> Result<Option<(nfs_fh3, nfs_fh3)>> {
        let a = self.direct.resolve(path).await?;
        let b = self.chained.resolve(path).await?;
        match (a, b) {
            (Some(a), Some(b)) => Ok(Some((a, b))),
            (None, None) => Ok(None),
            (a, b) => bail!(
                "{path}: exists directly: {}, through the chain: {}",
                a.is_some(),
                b.is_some()
            ),
        }
    }

    /// Sends the request built by `make` (given each side's handles) to
    /// both and compares the replies.
    async fn both(
        &self,
        what: &str,
        make: impl Fn(&NfsClient) -> NfsRequest,
    ) -> Result<(NfsReply, NfsReply)> {
        let a = self.direct.call(make(&self.direct)).await?;
        let b = self.chained.call(make(&self.chained)).await?;
        self.record(&a);
        let (sa, sb) = (summary(&a), summary(&b));
        if sa != sb && self.accepts(what, &a, &b).is_some() {
            return Ok((a, b));
        }
        if std::env::var("GVFS_DIFF_KEEP_GOING").is_ok() && sa != sb {
            eprintln!("DIVERGE {what}: direct replied {sa}, the chain replied {sb}");
            return Ok((a, b));
        }
        ensure!(
            sa == sb,
            "{what}: direct replied {sa}, the chain replied {sb}"
        );
        Ok((a, b))
    }

    /// The accepted ganesha bug, if any, by which alone ganesha's reply `a`
    /// and the other side's `b` to `what` differ (said on stderr).
    fn accepts(&self, what: &str, a: &NfsReply, b: &NfsReply) -> Option<&'static Equivalence> {
        let known = self.accepted.iter().find(|e| {
            a.proc_().name() == e.procedure && a.status() == e.ganesha && b.status() == e.ours
        });
        if let Some(e) = known {
            eprintln!(
                "accepted {what}: ganesha {:?}, the other side {:?}: {}",
                e.ganesha, e.ours, e.reason
            );
        }
        known
    }

    /// Undoes, on ganesha's side, its CREATE UNCHECKED of `n` in `parent`,
    /// which the other side refused because `n` is a symbolic link: ganesha
    /// followed the link and made its target (when that is in the export,
    /// it is removed again), and may since take `n` for the file it made
    /// (then the link is made anew, as the other side still has it).
    async fn undo_create_through_symlink(&self, parent: &str, n: &str) -> Result<()> {
        let path = join(parent, n);
        let ours = self
            .chained
            .resolve(&path)
            .await?
            .with_context(|| format!("{path} is gone from the other side"))?;
        let target = match self
            .chained
            .call(NfsRequest::Readlink(READLINK3args { symlink: ours }))
            .await?
        {
            NfsReply::Readlink(Nfs3Result::Ok(ok)) => {
                String::from_utf8_lossy(&ok.data.0).into_owned()
            }
            other => bail!(
                "{path} is no symlink on the other side: {:?}",
                other.status()
            ),
        };
        // The target's path in the export, as the kernel resolved it from
        // the link's directory; above the root it is outside the export.
        let mut at: Vec<&str> = parent.split('/').filter(|c| !c.is_empty()).collect();
        let mut inside = true;
        for c in target.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if c == ".." {
                inside &= at.pop().is_some();
            } else {
                at.push(c);
            }
        }
        if let (true, Some(made)) = (inside, at.pop()) {
            ensure!(
                made.starts_with("target-") && !NAMES.contains(&made),
                "CREATE through {path} made {made:?}, a name the workload uses"
            );
            let dir = at.join("/");
            let in_dir = join(&dir, made);
            ensure!(
                self.chained.resolve(&in_dir).await?.is_none(),
                "{in_dir} exists on the other side too"
            );
            if let Some(dir_fh) = self.direct.resolve(&dir).await? {
                let r = self.direct.call(remove(dir_fh, made)).await?;
                ensure!(
                    matches!(r.status(), nfsstat3::NFS3_OK | nfsstat3::NFS3ERR_NOENT),
                    "removing {in_dir}, made through {path}: {:?}",
                    r.status()
                );
                eprintln!("undone: ganesha made {in_dir} through {path}");
            }
        }
        if self.getattrs(&path).await? {
            return Ok(());
        }
        let dir_fh = self
            .direct
            .resolve(parent)
            .await?
            .with_context(|| format!("{parent} is gone from ganesha"))?;
        let r = self.direct.call(remove(dir_fh.clone(), n)).await?;
        ensure!(
            matches!(r.status(), nfsstat3::NFS3_OK | nfsstat3::NFS3ERR_NOENT),
            "removing {path} on ganesha: {:?}",
            r.status()
        );
        let r = self
            .direct
            .call(NfsRequest::Symlink(SYMLINK3args {
                where_: diropargs3 {
                    dir: dir_fh,
                    name: name(n),
                },
                symlink: symlinkdata3 {
                    symlink_attributes: sattr(Some(0o777), None),
                    symlink_data: nfspath3::from(target.as_bytes().to_vec()),
                },
            }))
            .await?;
        ensure!(
            r.status() == nfsstat3::NFS3_OK,
            "making {path} anew on ganesha: {:?}",
            r.status()
        );
        ensure!(
            self.getattrs(&path).await?,
            "{path} still differs on ganesha after making it anew"
        );
        eprintln!("undone: ganesha took {path} for the file it made");
        Ok(())
    }

    /// Whether both sides give `path` the same attributes.
    async fn getattrs(&self, path: &str) -> Result<bool> {
        let mut got = Vec::new();
        for c in [&self.direct, &self.chained] {
            got.push(match c.resolve(path).await? {
                Some(object) => {
                    summary(&c.call(NfsRequest::Getattr(GETATTR3args { object })).await?)
                }
                None => "missing".to_string(),
            });
        }
        Ok(got[0] == got[1])
    }

    fn record(&self, r: &NfsReply) {
        let key = (r.proc_().name().to_string(), format!("{:?}", r.status()));
        *self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    /// Both directory listings of `path`, compared as sets of names.
    async fn listing(&self, path: &str, plus: bool) -> Result<()> {
        let Some(_) = self.resolve(path).await? else {
            return Ok(());
        };
        let mut names = Vec::new();
        for c in [&self.direct, &self.chained] {
            let dir = c.resolve(path).await?.context("directory vanished")?;
            names.push(list(c, &dir, plus).await?);
        }
        ensure!(
            names[0] == names[1],
            "readdir{} {path}: {:?} vs {:?}",
            if plus { "plus" } else { "" },
            names[0],
            names[1]
        );
        Ok(())
    }
}

async fn list(c: &NfsClient, dir: &nfs_fh3, plus: bool) -> Result<Vec<String>> {
    let mut cookie = 0;
    let mut verf = cookieverf3::default();
    let mut names = Vec::new();
    for _ in 0..1000 {
        let req = if plus {
            NfsRequest::Readdirplus(READDIRPLUS3args {
                dir: dir.clone(),
                cookie,
                cookieverf: verf,
                dircount: 512,
                maxcount: 4096,
            })
        } else {
            NfsRequest::Readdir(READDIR3args {
                dir: dir.clone(),
                cookie,
                cookieverf: verf,
                count: 512,
            })
        };
        let (entries, eof): (Vec<(String, u64)>, bool) = match c.call(req).await? {
            NfsReply::Readdir(Nfs3Result::Ok(ok)) => {
                verf = ok.cookieverf;
                (
                    ok.reply
                        .entries
                        .0
                        .iter()
                        .map(|e| (String::from_utf8_lossy(&e.name.0).into_owned(), e.cookie))
                        .collect(),
                    ok.reply.eof,
                )
            }
            NfsReply::Readdirplus(Nfs3Result::Ok(ok)) => {
                verf = ok.cookieverf;
                (
                    ok.reply
                        .entries
                        .0
                        .iter()
                        .map(|e| (String::from_utf8_lossy(&e.name.0).into_owned(), e.cookie))
                        .collect(),
                    ok.reply.eof,
                )
            }
            other => bail!("readdir failed: {:?}", other.status()),
        };
        for (n, c) in entries {
            cookie = c;
            if n != "." && n != ".." {
                names.push(n);
            }
        }
        if eof {
            names.sort();
            return Ok(names);
        }
    }
    bail!("readdir did not reach eof")
}

/// Picks a path: a known directory plus (maybe) a name from the pool.
fn pick(rng: &mut StdRng, dirs: &[String]) -> (String, String) {
    let parent = dirs[rng.gen_range(0..dirs.len())].clone();
    let n = NAMES[rng.gen_range(0..NAMES.len())].to_string();
    (parent, n)
}

fn join(parent: &str, n: &str) -> String {
    if parent.is_empty() {
        n.to_string()
    } else {
        format!("{parent}/{n}")
    }
}

async fn step(pair: &Pair, rng: &mut StdRng, dirs: &mut Vec<String>, i: usize) -> Result<()> {
    let (parent, n) = pick(rng, dirs);
    let path = join(&parent, &n);
    let op = rng.gen_range(0..100);
    let Some((pa, pb)) = pair.resolve(&parent).await? else {
        // The parent was removed or renamed away; forget it.
        dirs.retain(|d| d != &parent);
        if dirs.is_empty() {
            dirs.push(String::new());
        }
        return Ok(());
    };
    let side = |c: &NfsClient| pair.pick(c, &pa, &pb);
    let what = format!("op {i} ({op}) on {path}");
    match op {
        0..=9 => {
            let mode = [0o644, 0o600, 0o755][rng.gen_range(0..3)];
            let how = match rng.gen_range(0..3) {
                0 => createhow3::UNCHECKED(sattr(Some(mode), None)),
                1 => createhow3::GUARDED(sattr(Some(mode), None)),
                _ => createhow3::EXCLUSIVE(createverf3(rng.r#gen())),
            };
            let how2 = match &how {
                createhow3::UNCHECKED(s) => createhow3::UNCHECKED(s.clone()),
                createhow3::GUARDED(s) => createhow3::GUARDED(s.clone()),
                createhow3::EXCLUSIVE(v) => createhow3::EXCLUSIVE(*v),
            };
            let a = pair
                .direct
                .call(NfsRequest::Create(CREATE3args {
                    where_: diropargs3 {
                        dir: pa.clone(),
                        name: name(&n),
                    },
                    how,
                }))
                .await?;
            let b = pair
                .chained
                .call(NfsRequest::Create(CREATE3args {
                    where_: diropargs3 {
                        dir: pb.clone(),
                        name: name(&n),
                    },
                    how: how2,
                }))
                .await?;
            pair.record(&a);
            if a.status() != b.status()
                && let Some(e) = pair.accepts(&what, &a, &b)
            {
                if let Some(Undo::CreateThroughSymlink) = e.undo {
                    pair.undo_create_through_symlink(&parent, &n).await?;
                }
                return Ok(());
            }
            if std::env::var("GVFS_DIFF_KEEP_GOING").is_ok() && a.status() != b.status() {
                eprintln!(
                    "DIVERGE {what}: create {:?} vs {:?}",
                    a.status(),
                    b.status()
                );
                return Ok(());
            }
            ensure!(
                a.status() == b.status(),
                "{what}: create {:?} vs {:?}",
                a.status(),
                b.status()
            );
        }
        10..=29 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let offset = if rng.gen_bool(0.3) {
                0
            } else {
                rng.gen_range(0..300_000u64)
            };
            let len = rng.gen_range(1..70_000usize);
            let seed: u64 = rng.r#gen();
            let data = gvfs_testbed::data::random_bytes(seed, len);
            let stable = [
                stable_how::UNSTABLE,
                stable_how::DATA_SYNC,
                stable_how::FILE_SYNC,
            ][rng.gen_range(0..3)];
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            pair.both(&what, |c| {
                NfsRequest::Write(WRITE3args {
                    file: fh(c),
                    offset,
                    count: len as u32,
                    stable,
                    data: Opaque::owned(data.clone()),
                })
            })
            .await?;
        }
        30..=44 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let offset = rng.gen_range(0..320_000u64);
            let count = rng.gen_range(1..100_000u32);
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            pair.both(&what, |c| {
                NfsRequest::Read(READ3args {
                    file: fh(c),
                    offset,
                    count,
                })
            })
            .await?;
        }
        45..=51 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            let s = if rng.gen_bool(0.6) {
                sattr(None, Some(rng.gen_range(0..400_000u64)))
            } else {
                sattr(
                    Some([0o644, 0o640, 0o700, 0o755][rng.gen_range(0..4)]),
                    None,
                )
            };
            pair.both(&what, |c| {
                NfsRequest::Setattr(SETATTR3args {
                    object: fh(c),
                    new_attributes: s.clone(),
                    guard: sattrguard3::None,
                })
            })
            .await?;
        }
        52..=57 => {
            let (p2, n2) = pick(rng, dirs);
            let Some((qa, qb)) = pair.resolve(&p2).await? else {
                return Ok(());
            };
            let to = |c: &NfsClient| pair.pick(c, &qa, &qb);
            let (r, _) = pair
                .both(&what, |c| {
                    NfsRequest::Rename(RENAME3args {
                        from: diropargs3 {
                            dir: side(c),
                            name: name(&n),
                        },
                        to: diropargs3 {
                            dir: to(c),
                            name: name(&n2),
                        },
                    })
                })
                .await?;
            if r.status() == nfsstat3::NFS3_OK {
                let (from, dest) = (path.clone(), join(&p2, &n2));
                // Moving a directory moves every known path below it.
                for d in dirs.iter_mut() {
                    if *d == from || d.starts_with(&format!("{from}/")) {
                        *d = format!("{dest}{}", &d[from.len()..]);
                    }
                }
            }
        }
        58..=61 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let (p2, n2) = pick(rng, dirs);
            let Some((qa, qb)) = pair.resolve(&p2).await? else {
                return Ok(());
            };
            let d = |c: &NfsClient| {
                if std::ptr::eq(c, &pair.direct) {
                    (fa.clone(), qa.clone())
                } else {
                    (fb.clone(), qb.clone())
                }
            };
            pair.both(&what, |c| {
                NfsRequest::Link(LINK3args {
                    file: d(c).0,
                    link: diropargs3 {
                        dir: d(c).1,
                        name: name(&n2),
                    },
                })
            })
            .await?;
        }
        62..=65 => {
            let target = format!("../target-{}", rng.gen_range(0..5));
            pair.both(&what, |c| {
                NfsRequest::Symlink(SYMLINK3args {
                    where_: diropargs3 {
                        dir: side(c),
                        name: name(&n),
                    },
                    symlink: symlinkdata3 {
                        symlink_attributes: sattr(Some(0o777), None),
                        symlink_data: nfspath3::from(target.as_bytes().to_vec()),
                    },
                })
            })
            .await?;
        }
        66..=68 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            pair.both(&what, |c| {
                NfsRequest::Readlink(READLINK3args { symlink: fh(c) })
            })
            .await?;
        }
        69..=73 => pair.listing(&parent, rng.gen_bool(0.5)).await?,
        74..=79 => {
            pair.both(&what, |c| {
                NfsRequest::Remove(REMOVE3args {
                    object: diropargs3 {
                        dir: side(c),
                        name: name(&n),
                    },
                })
            })
            .await?;
        }
        80..=83 => {
            let (r, _) = pair
                .both(&what, |c| {
                    NfsRequest::Rmdir(RMDIR3args {
                        object: diropargs3 {
                            dir: side(c),
                            name: name(&n),
                        },
                    })
                })
                .await?;
            if r.status() == nfsstat3::NFS3_OK {
                dirs.retain(|d| *d != path);
            }
        }
        84..=89 => {
            let (r, _) = pair
                .both(&what, |c| {
                    NfsRequest::Mkdir(MKDIR3args {
                        where_: diropargs3 {
                            dir: side(c),
                            name: name(&n),
                        },
                        attributes: sattr(Some(0o755), None),
                    })
                })
                .await?;
            if r.status() == nfsstat3::NFS3_OK && path.matches('/').count() < 3 {
                dirs.push(path.clone());
            }
        }
        90..=93 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            let access = rng.gen_range(0..64u32);
            pair.both(&what, |c| {
                NfsRequest::Access(ACCESS3args {
                    object: fh(c),
                    access,
                })
            })
            .await?;
        }
        94..=95 => {
            pair.both(&what, |c| {
                NfsRequest::Fsstat(FSSTAT3args { fsroot: side(c) })
            })
            .await?;
        }
        96..=97 => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            pair.both(&what, |c| {
                NfsRequest::Commit(COMMIT3args {
                    file: fh(c),
                    offset: 0,
                    count: 0,
                })
            })
            .await?;
        }
        _ => {
            let Some((fa, fb)) = pair.resolve(&path).await? else {
                return Ok(());
            };
            let fh = |c: &NfsClient| pair.pick(c, &fa, &fb);
            pair.both(&what, |c| {
                NfsRequest::Getattr(GETATTR3args { object: fh(c) })
            })
            .await?;
        }
    }
    Ok(())
}

/// A description of a tree: path -> (kind, mode, size, content checksum or
/// link target).
fn snapshot(root: &Path) -> Result<BTreeMap<String, String>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            let rel = p.strip_prefix(root)?.display().to_string();
            let m = std::fs::symlink_metadata(&p)?;
            let mode = m.permissions().mode() & 0o7777;
            let desc = if m.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&p)?.display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                format!(
                    "file {mode:o} nlink={} size={} sum={:x}",
                    m.nlink(),
                    m.len(),
                    checksum(&std::fs::read(&p)?)
                )
            };
            out.insert(rel, desc);
        }
    }
    Ok(out)
}

/// The workload's seed: `GVFS_DIFF_SEED`, or a fixed default.
fn default_seed() -> u64 {
    std::env::var("GVFS_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261121u64)
}

/// Runs the workload seeded with `seed` against ganesha directly and
/// against `chained` (an NFS front at `front`), then compares the trees in
/// `direct_dir` and `chained_dir`. Replies may differ only as `accepted`
/// allows.
async fn run_workload(
    direct: &Ganesha,
    front: SocketAddr,
    chained_dir: &Path,
    accepted: &'static [Equivalence],
    seed: u64,
) -> Result<()> {
    let cred = Credentials::unix(0, 0);
    let give_up = Duration::from_secs(60);
    let pair = Pair {
        direct: NfsClient::mount(
            direct.nfs_addr(),
            SocketAddr::new(direct.ip(), direct.mount_port()),
            "/export",
            cred.clone(),
            give_up,
        )
        .await?,
        chained: NfsClient::mount(front, front, "/export", cred, give_up).await?,
        seen: Default::default(),
        accepted,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut dirs = vec![String::new()];
    for i in 0..OPS {
        step(&pair, &mut rng, &mut dirs, i)
            .await
            .with_context(|| format!("seed {seed}, step {i}"))?;
    }
    let seen = pair.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    eprintln!("replies by procedure and status: {seen:?}");
    for p in [
        "CREATE", "WRITE", "READ", "SETATTR", "RENAME", "LINK", "SYMLINK", "READLINK", "REMOVE",
        "RMDIR", "MKDIR", "ACCESS", "COMMIT", "GETATTR",
    ] {
        let ok = seen
            .get(&(p.to_string(), "NFS3_OK".to_string()))
            .copied()
            .unwrap_or(0);
        let failed: usize = seen
            .iter()
            .filter(|((q, st), _)| q == p && st != "NFS3_OK")
            .map(|(_, n)| n)
            .sum();
        ensure!(ok > 0, "the workload never ran {p} successfully");
        ensure!(
            failed > 0
                || [
                    "WRITE", "READ", "ACCESS", "COMMIT", "GETATTR", "READLINK", "SETATTR"
                ]
                .contains(&p),
            "the workload never saw {p} fail"
        );
    }
    let (a, b) = (snapshot(direct.export_dir())?, snapshot(chained_dir)?);
    ensure!(
        a.len() > 5,
        "the workload left almost nothing behind: {a:?}"
    );
    if a != b {
        for (k, v) in &a {
            if b.get(k) != Some(v) {
                eprintln!("differs: {k}: direct {v:?}, other {:?}", b.get(k));
            }
        }
        for k in b.keys().filter(|k| !a.contains_key(*k)) {
            eprintln!("only on the other side: {k}");
        }
        bail!("final trees differ (seed {seed})");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_workload_matches_ganesha_through_a_three_proxy_chain() -> Result<()> {
    let direct = Ganesha::start()?;
    let behind = Ganesha::start()?;
    let proxies = chain(&behind.upstream_url(), 3, |a| a.upstream_timeout(30))?;
    let front = proxies.last().context("no proxy")?.addr();
    run_workload(&direct, front, behind.export_dir(), &[], default_seed()).await
}

/// Runs the workload seeded with `seed` against ganesha and against a
/// proxy serving `dir:` of a fresh directory.
async fn dir_origin_workload(seed: u64) -> Result<()> {
    let direct = Ganesha::start()?;
    let origin = tempfile::tempdir()?;
    let proxy = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    run_workload(
        &direct,
        proxy.addr(),
        origin.path(),
        DIR_ORIGIN_EQUIVALENCES,
        seed,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_workload_on_the_dir_origin_matches_ganesha() -> Result<()> {
    dir_origin_workload(default_seed()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_workloads_with_other_seeds_on_the_dir_origin_match_ganesha() -> Result<()> {
    for seed in 1..=5 {
        dir_origin_workload(seed).await?;
    }
    Ok(())
}
