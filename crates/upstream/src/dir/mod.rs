//! The embedded origin, `dir:PATH`: a local directory served as an NFSv3
//! export (RFC 1813) without any NFS server.
//!
//! - [`DirUpstream`] is the [`NfsService`]; every call runs on tokio's
//!   blocking pool, one `spawn_blocking` per call.
//! - `handle`: 28-byte file handles naming an inode and its birth time, so
//!   they survive renames and restarts of the proxy.
//! - `index` and `resolve`: from a handle to a directory entry, through an
//!   in-memory inode index checked against the disk on every use, and a
//!   bounded walk of the export when the index does not know.
//! - `perm`: the caller's permission checks (the proxy usually runs as
//!   root, so the kernel makes none for it).
//! - `object`, `data`, `namespace`, `readdir`: the procedures.
//! - `fdcache`: open descriptors kept for READ/WRITE/COMMIT.
//! - `status`: errno to `nfsstat3`, in one function.
//!
//! Nothing outside the exported directory is reachable: names are single
//! components ("." and ".." are handled here, never by the filesystem),
//! every lookup is relative to an open directory descriptor and never
//! follows a symbolic link.

mod attr;
mod data;
mod fdcache;
mod handle;
mod index;
mod name;
mod namespace;
mod object;
mod perm;
mod readdir;
mod resolve;
mod status;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use gvfs_nfs::nfs3_types::nfs3::{nfs_fh3, post_op_attr, wcc_data};
use gvfs_nfs::nfs3_types::xdr_codec::Void;
use gvfs_nfs::{BoxFuture, CallContext, NfsReply, NfsRequest, NfsService, ServiceError};
use nfs3_types::nfs3::Nfs3Option;
use rustix::fs::{Access, Mode, OFlags};

use self::attr::{Attr, stat_fd};
use self::fdcache::OpenFiles;
use self::handle::FileKey;
use self::index::Index;
use self::perm::Caller;

/// Largest READ or WRITE payload (FSINFO rtmax and wtmax).
const MAX_IO: u32 = 1 << 20;

/// Open regular files kept for READ/WRITE/COMMIT.
const OPEN_FILES: usize = 256;

/// Why a directory cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// The directory does not exist or cannot be opened.
    #[error("cannot open dir: upstream {path}: {cause}")]
    Open {
        /// The directory.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The path names something other than a directory.
    #[error("dir: upstream {path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory cannot be listed or searched by this process.
    #[error("dir: upstream {path} is not readable and searchable by this process: {cause}")]
    Unreadable {
        /// The directory.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The blocking task running a call stopped before it answered (it
    /// panicked, or the runtime is shutting down).
    #[error("dir: upstream {proc} call stopped before it answered: {cause}")]
    Stopped {
        /// The procedure.
        proc: &'static str,
        /// The task's end.
        #[source]
        cause: tokio::task::JoinError,
    },
}

/// Serves a local directory as an NFSv3 export: the embedded origin.
#[derive(Debug, Clone)]
pub struct DirUpstream {
    export: Arc<Export>,
}

/// Everything one export shares between calls.
#[derive(Debug)]
struct Export {
    path: PathBuf,
    /// The root directory, opened read-only.
    root_fd: OwnedFd,
    root: FileKey,
    /// Stamped into handles; also the fsid and the cookie verifier.
    export_id: u64,
    /// Changes with every instance: unstable writes of an earlier one may
    /// be lost (RFC 1813 section 3.3.7).
    write_verf: [u8; 8],
    /// Whether the process may chown (runs as root): then what callers
    /// create is given to them.
    as_root: bool,
    link_max: u32,
    name_max: u32,
    index: Index,
    files: OpenFiles,
    /// Serialises walks of the export that look for lost handles.
    walk: std::sync::Mutex<()>,
}

impl DirUpstream {
    /// Opens `root` for serving. It must exist, be a directory, and be
    /// readable and searchable by this process.
    pub fn open(root: &Path) -> Result<Self, DirError> {
        Export::open(root).map(|e| Self {
            export: Arc::new(e),
        })
    }
}

impl NfsService for DirUpstream {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        let export = Arc::clone(&self.export);
        let caller = Caller::from_cred(&cx.cred);
        Box::pin(async move {
            if let NfsRequest::Null(_) = req {
                return Ok(NfsReply::Null(Void));
            }
            let p = req.proc_();
            tokio::task::spawn_blocking(move || export.dispatch(&caller, req))
                .await
                .map_err(|cause| {
                    ServiceError::layer(DirError::Stopped {
                        proc: p.name(),
                        cause,
                    })
                })
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        let fh = self.export.handle(self.export.root);
        Box::pin(async move { Ok(fh) })
    }

    fn describe(&self) -> String {
        format!("dir:{}", self.export.path.display())
    }
}

/// A directory descriptor: the export root's (borrowed) or one opened for
/// a call.
#[derive(Debug)]
enum DirFd<'a> {
    Borrowed(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Borrowed(b) => *b,
            Self::Owned(o) => o.as_fd(),
        }
    }
}

/// A file found from a handle: the directory entry naming it. The export
/// root is named "." in itself.
#[derive(Debug)]
struct Node<'a> {
    dir: DirFd<'a>,
    name: Vec<u8>,
    attr: Attr,
}

/// A directory found from a handle and opened (`O_PATH`) for `*at` calls.
#[derive(Debug)]
struct DirNode<'a> {
    fd: DirFd<'a>,
    attr: Attr,
}

impl Node<'_> {
    /// Fresh attributes of the entry.
    fn restat(&self) -> std::io::Result<Attr> {
        attr::stat_at(self.dir.as_fd(), &self.name)
    }
}

impl DirNode<'_> {
    /// `name` in this directory as a node with attributes `attr`.
    fn child(&self, name: &[u8], attr: Attr) -> Node<'_> {
        Node {
            dir: DirFd::Borrowed(self.fd.as_fd()),
            name: name.to_vec(),
            attr,
        }
    }
}

impl Export {
    fn open(root: &Path) -> Result<Self, DirError> {
        let path = root.to_path_buf();
        let meta = std::fs::metadata(root).map_err(|cause| DirError::Open {
            path: path.clone(),
            cause,
        })?;
        if !meta.is_dir() {
            return Err(DirError::NotADirectory { path });
        }
        rustix::fs::access(root, Access::READ_OK | Access::EXEC_OK).map_err(|e| {
            DirError::Unreadable {
                path: path.clone(),
                cause: e.into(),
            }
        })?;
        let root_fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| DirError::Open {
            path: path.clone(),
            cause: e.into(),
        })?;
        let unreadable = |cause: std::io::Error| DirError::Unreadable {
            path: path.clone(),
            cause,
        };
        let root_attr = stat_fd(root_fd.as_fd()).map_err(unreadable)?;
        let probe = rustix::fs::openat(
            &root_fd,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| unreadable(e.into()))?;
        let mut listing = rustix::fs::Dir::new(probe).map_err(|e| unreadable(e.into()))?;
        if let Some(Err(e)) = listing.read() {
            return Err(unreadable(e.into()));
        }
        let statfs = rustix::fs::fstatfs(&root_fd).map_err(|e| unreadable(e.into()))?;
        // knfsd's PATHCONF answer: ext2/3/4 allow 32000 links, others "at
        // least 255".
        const EXT_SUPER_MAGIC: i64 = 0xEF53;
        let link_max = if statfs.f_type as i64 == EXT_SUPER_MAGIC {
            32_000
        } else {
            255
        };
        let name_max = u32::try_from(statfs.f_namelen)
            .unwrap_or(255)
            .clamp(1, name::MAX_NAME as u32);
        let root_key = root_attr.key();
        let export_id = mix64(root_key.ino ^ mix64(root_key.generation ^ 0x6776_6673)).max(1);
        Ok(Self {
            path: std::fs::canonicalize(root).unwrap_or(path),
            root_fd,
            root: root_key,
            export_id,
            write_verf: new_write_verifier(),
            as_root: process_is_root(),
            link_max,
            name_max,
            index: Index::new(root_key.ino),
            files: OpenFiles::new(OPEN_FILES),
            walk: std::sync::Mutex::new(()),
        })
    }

    fn dispatch(&self, c: &Caller, req: NfsRequest) -> NfsReply {
        match req {
            NfsRequest::Null(_) => NfsReply::Null(Void),
            NfsRequest::Getattr(a) => NfsReply::Getattr(self.getattr(a)),
            NfsRequest::Setattr(a) => NfsReply::Setattr(self.setattr(c, a)),
            NfsRequest::Lookup(a) => NfsReply::Lookup(self.lookup(c, a)),
            NfsRequest::Access(a) => NfsReply::Access(self.access(c, a)),
            NfsRequest::Readlink(a) => NfsReply::Readlink(self.readlink(a)),
            NfsRequest::Read(a) => NfsReply::Read(self.read(c, a)),
            NfsRequest::Write(a) => NfsReply::Write(self.write(c, a)),
            NfsRequest::Create(a) => NfsReply::Create(self.create(c, a)),
            NfsRequest::Mkdir(a) => NfsReply::Mkdir(self.mkdir(c, a)),
            NfsRequest::Symlink(a) => NfsReply::Symlink(self.symlink(c, a)),
            NfsRequest::Mknod(a) => NfsReply::Mknod(self.mknod(c, a)),
            NfsRequest::Remove(a) => NfsReply::Remove(self.remove(c, a)),
            NfsRequest::Rmdir(a) => NfsReply::Rmdir(self.rmdir(c, a)),
            NfsRequest::Rename(a) => NfsReply::Rename(self.rename(c, a)),
            NfsRequest::Link(a) => NfsReply::Link(self.link(c, a)),
            NfsRequest::Readdir(a) => NfsReply::Readdir(self.readdir(c, a)),
            NfsRequest::Readdirplus(a) => NfsReply::Readdirplus(self.readdirplus(c, a)),
            NfsRequest::Fsstat(a) => NfsReply::Fsstat(self.fsstat(a)),
            NfsRequest::Fsinfo(a) => NfsReply::Fsinfo(self.fsinfo(a)),
            NfsRequest::Pathconf(a) => NfsReply::Pathconf(self.pathconf(a)),
            NfsRequest::Commit(a) => NfsReply::Commit(self.commit(c, a)),
        }
    }

    fn handle(&self, key: FileKey) -> nfs_fh3 {
        handle::encode(self.export_id, key)
    }

    fn post(&self, a: Option<&Attr>) -> post_op_attr {
        match a {
            Some(a) => Nfs3Option::Some(a.fattr(self.export_id)),
            None => Nfs3Option::None,
        }
    }

    fn wcc(&self, pre: Option<&Attr>, post: Option<&Attr>) -> wcc_data {
        wcc_data {
            before: match pre {
                Some(a) => Nfs3Option::Some(a.wcc()),
                None => Nfs3Option::None,
            },
            after: self.post(post),
        }
    }

    /// The owner of what `c` creates in `dir`: the caller, with the group
    /// of a set-group-id directory (as Linux does).
    fn new_owner(&self, c: &Caller, dir: &Attr) -> (u32, u32) {
        let gid = if dir.mode & attr::S_ISGID != 0 {
            dir.gid
        } else {
            c.gid
        };
        (c.uid, gid)
    }
}

/// A 64-bit finaliser (splitmix64): spreads every input bit over the output.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A write verifier no other instance (in this or any other process, now
/// or after a restart) is likely to have: start time, pid, instance count.
fn new_write_verifier() -> [u8; 8] {
    static INSTANCES: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
    let v = nanos
        .wrapping_add(u64::from(std::process::id()) << 40)
        .wrapping_add(mix64(n));
    v.to_be_bytes()
}

fn process_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
