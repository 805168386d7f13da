//! MOUNT version 3 (RFC 1813 appendix I): MNT hands out the root handle of
//! the layer stack for the one export this proxy serves (or of a directory
//! below it); DUMP, UMNT, UMNTALL and EXPORT keep and show the mount list.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use gvfs_nfs::layer::Counter;
use gvfs_nfs::nfs3_types::nfs3::{LOOKUP3args, Nfs3Result, diropargs3, filename3, nfs_fh3};
use gvfs_nfs::rpc::{ReplyStatus, flavor};
use gvfs_nfs::xdr::{self, XdrReader};
use gvfs_nfs::{BoxFuture, CallContext, NfsReply, NfsRequest, NfsService, ServiceError};

use super::program::{Answer, Call, FrontCounters, Program};

pub use gvfs_nfs::proc::MOUNT_PROGRAM;

/// Longest path MOUNT accepts (MNTPATHLEN).
const MNTPATHLEN: usize = 1024;
/// Most entries kept in the mount list shown by DUMP.
const MAX_MOUNT_ENTRIES: usize = 1024;

use gvfs_nfs::proc::mount_procs as procs;

const MNT3ERR_NOENT: u32 = 2;
const MNT3ERR_NOTDIR: u32 = 20;

/// Who has mounted what, for DUMP. Advisory only, as in RFC 1813.
#[derive(Debug, Default)]
struct MountTable {
    entries: Mutex<Vec<(String, Vec<u8>)>>,
}

impl MountTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Vec<u8>)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, host: String, dir: Vec<u8>) {
        let mut e = self.lock();
        if !e.iter().any(|(h, d)| *h == host && *d == dir) && e.len() < MAX_MOUNT_ENTRIES {
            e.push((host, dir));
        }
    }
}

fn host_of(cx: &CallContext) -> String {
    cx.peer
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
        .to_string()
}

/// MOUNT v3 for one export of the layer stack.
pub struct MountProgram {
    service: Arc<dyn NfsService>,
    export: String,
    mounts: MountTable,
}

impl MountProgram {
    /// Mounts of `export` (e.g. `/export`) and directories below it,
    /// served by `service`.
    pub fn new(service: Arc<dyn NfsService>, export: String) -> Self {
        Self {
            service,
            export,
            mounts: MountTable::default(),
        }
    }

    async fn call(&self, call: Call<'_>) -> Answer {
        let Call { hdr, cx, args, .. } = call;
        let mut out = Vec::new();
        match hdr.proc_ {
            procs::NULL => {}
            procs::MNT => {
                let Some(path) = dirpath(args) else {
                    return Answer::Refused(ReplyStatus::GarbageArgs);
                };
                match self.mnt(cx, path).await {
                    Ok(fh) => {
                        self.mounts.add(host_of(cx), path.to_vec());
                        xdr::put_u32(&mut out, 0);
                        xdr::put_opaque(&mut out, &fh.data);
                        xdr::put_u32(&mut out, 2);
                        xdr::put_u32(&mut out, flavor::UNIX);
                        xdr::put_u32(&mut out, flavor::NONE);
                    }
                    Err(status) => xdr::put_u32(&mut out, status),
                }
            }
            procs::DUMP => {
                for (host, dir) in self.mounts.lock().iter() {
                    xdr::put_u32(&mut out, 1);
                    xdr::put_opaque(&mut out, host.as_bytes());
                    xdr::put_opaque(&mut out, dir);
                }
                xdr::put_u32(&mut out, 0);
            }
            procs::UMNT => {
                let Some(path) = dirpath(args) else {
                    return Answer::Refused(ReplyStatus::GarbageArgs);
                };
                let host = host_of(cx);
                self.mounts
                    .lock()
                    .retain(|(h, d)| !(*h == host && d == path));
            }
            procs::UMNTALL => {
                let host = host_of(cx);
                self.mounts.lock().retain(|(h, _)| *h != host);
            }
            procs::EXPORT => {
                xdr::put_u32(&mut out, 1);
                xdr::put_opaque(&mut out, self.export.as_bytes());
                xdr::put_u32(&mut out, 0); // no group restriction
                xdr::put_u32(&mut out, 0);
            }
            _ => return Answer::Refused(ReplyStatus::ProcUnavail),
        }
        Answer::Results(out)
    }

    /// The handle for `path`: the export's root, or a directory below it
    /// reached by LOOKUPs through the stack.
    async fn mnt(&self, cx: &CallContext, path: &[u8]) -> Result<nfs_fh3, u32> {
        let export = self.export.trim_end_matches('/').as_bytes();
        let path_trimmed = trim_trailing_slashes(path);
        let rest = if path_trimmed == export || (export.is_empty() && path_trimmed.is_empty()) {
            &[][..]
        } else if path_trimmed.starts_with(export) && path_trimmed.get(export.len()) == Some(&b'/')
        {
            &path_trimmed[export.len() + 1..]
        } else {
            return Err(MNT3ERR_NOENT);
        };
        let mut fh = self.service.root(cx).await.map_err(|e| mount_error(&e))?;
        for name in rest.split(|b| *b == b'/').filter(|n| !n.is_empty()) {
            let req = NfsRequest::Lookup(LOOKUP3args {
                what: diropargs3 {
                    dir: fh,
                    name: filename3::from(name.to_vec()),
                },
            });
            match self.service.call(cx, req).await {
                Ok(NfsReply::Lookup(Nfs3Result::Ok(ok))) => {
                    let is_dir = match &ok.obj_attributes {
                        gvfs_nfs::nfs3_types::nfs3::Nfs3Option::Some(a) => {
                            a.type_ == gvfs_nfs::nfs3_types::nfs3::ftype3::NF3DIR
                        }
                        gvfs_nfs::nfs3_types::nfs3::Nfs3Option::None => true,
                    };
                    if !is_dir {
                        return Err(MNT3ERR_NOTDIR);
                    }
                    fh = ok.object;
                }
                Ok(other) => return Err(lookup_to_mountstat(other.status() as u32)),
                Err(e) => return Err(mount_error(&e)),
            }
        }
        Ok(fh)
    }
}

impl Program for MountProgram {
    fn number(&self) -> u32 {
        MOUNT_PROGRAM
    }

    fn versions(&self) -> RangeInclusive<u32> {
        3..=3
    }

    fn advertised(&self) -> Option<u32> {
        Some(3)
    }

    fn calls_counter<'c>(&self, counters: &'c FrontCounters) -> Option<&'c Counter> {
        Some(&counters.mount_calls)
    }

    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(self.call(call))
    }
}

/// A failed LOOKUP on the way to a mounted directory as MOUNT says it:
/// the statuses the two protocols share keep their numbers (RFC 1813,
/// mountstat3 and nfsstat3), any other is an I/O error.
fn lookup_to_mountstat(status: u32) -> u32 {
    match status {
        1 | 2 | 5 | 13 | 20 | 22 | 63 | 10004 | 10006 => status,
        _ => 5,
    }
}

fn mount_error(e: &ServiceError) -> u32 {
    tracing::warn!(error = %e, "MNT failed below the front end");
    e.mountstat() as u32
}

fn trim_trailing_slashes(mut p: &[u8]) -> &[u8] {
    while p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    if p == b"/" { &[] } else { p }
}

/// Decodes a `dirpath` argument.
fn dirpath(args: &[u8]) -> Option<&[u8]> {
    let mut r = XdrReader::new(args);
    let p = r.opaque(MNTPATHLEN).ok()?;
    r.rest().is_empty().then_some(p)
}
