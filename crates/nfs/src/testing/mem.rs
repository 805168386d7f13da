//! An in-memory NFSv3 server for layers' unit tests: files by handle in one
//! root directory, UNSTABLE writes lost on a simulated reboot (which
//! changes the write verifier), call counters and an optional READ delay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::{BoxFuture, CallContext, NfsProc, NfsReply, NfsRequest, NfsService, ServiceError};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;

/// The handle of the one directory (the export's root).
pub const ROOT: &[u8] = b"root";

#[derive(Debug, Default)]
struct File {
    data: Vec<u8>,
    /// What survives a reboot.
    stable: Vec<u8>,
    mtime: u32,
    fileid: u64,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<Vec<u8>, File>,
    names: HashMap<Vec<u8>, Vec<u8>>,
    verifier: u64,
    calls: HashMap<NfsProc, u64>,
    reboot_before_commit: u32,
    clock: u32,
    /// SETATTR is answered NFS3ERR_ACCES (a caller upstream refuses).
    refuse_setattr: bool,
    /// ACCESS grants no writing to this uid.
    read_only_uid: Option<u32>,
}

/// The in-memory server.
#[derive(Debug, Default)]
pub struct MemNfs {
    state: Mutex<State>,
    read_delay: Mutex<Duration>,
    /// Delays READ replies after their bytes were read (a reply on its
    /// way while other calls change the file).
    read_late: Mutex<Duration>,
    write_delay: Mutex<Duration>,
    writes_in_flight: AtomicU64,
    max_writes_in_flight: AtomicU64,
}

fn fh3(fh: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(fh.to_vec()),
    }
}

fn attrs(f: &File) -> fattr3 {
    fattr3 {
        fileid: f.fileid,
        ..super::attrs::file_attrs(f.data.len() as u64, f.mtime)
    }
}

fn wcc(before: Option<wcc_attr>, f: Option<&File>) -> wcc_data {
    wcc_data {
        before: before.map_or(Nfs3Option::None, Nfs3Option::Some),
        after: f.map_or(Nfs3Option::None, |f| Nfs3Option::Some(attrs(f))),
    }
}

fn wcc_before(f: &File) -> wcc_attr {
    let a = attrs(f);
    wcc_attr {
        size: a.size,
        mtime: a.mtime,
        ctime: a.ctime,
    }
}

fn put(buf: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if buf.len() < offset + data.len() {
        buf.resize(offset + data.len(), 0);
    }
    buf[offset..offset + data.len()].copy_from_slice(data);
}

impl MemNfs {
    /// An empty server.
    pub fn new() -> Arc<MemNfs> {
        Arc::new(MemNfs::default())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates (or replaces) `name` holding `data`; returns its handle.
    pub fn create(&self, name: &str, data: &[u8]) -> Vec<u8> {
        let mut st = self.st();
        let fh = format!("fh-{name}").into_bytes();
        st.clock += 1;
        let (clock, id) = (st.clock, st.files.len() as u64 + 10);
        st.files.insert(
            fh.clone(),
            File {
                data: data.to_vec(),
                stable: data.to_vec(),
                mtime: clock,
                fileid: id,
            },
        );
        st.names.insert(name.as_bytes().to_vec(), fh.clone());
        fh
    }

    /// What `fh` holds now (unstable writes included); empty if absent.
    pub fn data(&self, fh: &[u8]) -> Vec<u8> {
        self.st()
            .files
            .get(fh)
            .map(|f| f.data.clone())
            .unwrap_or_default()
    }

    /// Grants `uid` no writing from now on (ACCESS answers without MODIFY
    /// or EXTEND).
    pub fn read_only_for(&self, uid: u32) {
        self.st().read_only_uid = Some(uid);
    }

    /// Refuses every SETATTR from now on.
    pub fn refuse_setattr(&self) {
        self.st().refuse_setattr = true;
    }

    fn refused(p: NfsProc) -> NfsReply {
        NfsReply::error(p, nfsstat3::NFS3ERR_ACCES)
    }

    /// Whether a file has handle `fh`.
    pub fn exists(&self, fh: &[u8]) -> bool {
        self.st().files.contains_key(fh)
    }

    /// Changes a file as another client would.
    pub fn set_data(&self, fh: &[u8], data: &[u8]) {
        let mut st = self.st();
        st.clock += 1;
        let clock = st.clock;
        if let Some(f) = st.files.get_mut(fh) {
            f.data = data.to_vec();
            f.stable = data.to_vec();
            f.mtime = clock;
        }
    }

    /// How many calls of `p` were answered.
    pub fn calls(&self, p: NfsProc) -> u64 {
        self.st().calls.get(&p).copied().unwrap_or(0)
    }

    /// Delays every READ before it reads.
    pub fn set_read_delay(&self, d: Duration) {
        *self.read_delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Delays every READ reply after its bytes were read.
    pub fn set_read_late(&self, d: Duration) {
        *self.read_late.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Delays every WRITE, so concurrent ones overlap.
    pub fn set_write_delay(&self, d: Duration) {
        *self.write_delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// The most WRITEs that were in flight at once.
    pub fn max_writes_in_flight(&self) -> u64 {
        self.max_writes_in_flight.load(Ordering::SeqCst)
    }

    /// The next COMMIT finds the server rebooted: uncommitted writes are
    /// lost and the verifier changed.
    pub fn reboot_before_next_commit(&self) {
        self.st().reboot_before_commit += 1;
    }

    fn verf(st: &State) -> writeverf3 {
        writeverf3(st.verifier.wrapping_add(0x5151).to_le_bytes())
    }

    fn handle(&self, req: NfsRequest, cx_uid: Option<u32>) -> NfsReply {
        let mut st = self.st();
        *st.calls.entry(req.proc_()).or_default() += 1;
        let stale = |p| NfsReply::error(p, nfsstat3::NFS3ERR_STALE);
        match req {
            NfsRequest::Getattr(a) => match st.files.get(a.object.data.as_ref()) {
                Some(f) => NfsReply::Getattr(Nfs3Result::Ok(GETATTR3resok {
                    obj_attributes: attrs(f),
                })),
                None => stale(NfsProc::Getattr),
            },
            NfsRequest::Lookup(a) => {
                let name = a.what.name.as_ref().to_vec();
                match st
                    .names
                    .get(&name)
                    .and_then(|fh| st.files.get(fh).map(|f| (fh, f)))
                {
                    Some((fh, f)) => NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                        object: fh3(fh),
                        obj_attributes: Nfs3Option::Some(attrs(f)),
                        dir_attributes: Nfs3Option::None,
                    })),
                    None => NfsReply::error(NfsProc::Lookup, nfsstat3::NFS3ERR_NOENT),
                }
            }
            NfsRequest::Read(a) => match st.files.get(a.file.data.as_ref()) {
                Some(f) => {
                    let start = (a.offset as usize).min(f.data.len());
                    let end = (start + a.count as usize).min(f.data.len());
                    NfsReply::Read(Nfs3Result::Ok(READ3resok {
                        file_attributes: Nfs3Option::Some(attrs(f)),
                        count: (end - start) as u32,
                        eof: end == f.data.len(),
                        data: Opaque::owned(f.data[start..end].to_vec()),
                    }))
                }
                None => stale(NfsProc::Read),
            },
            NfsRequest::Write(a) => {
                st.clock += 1;
                let (clock, verf) = (st.clock, MemNfs::verf(&st));
                match st.files.get_mut(a.file.data.as_ref()) {
                    Some(f) => {
                        let before = wcc_before(f);
                        let n = (a.count as usize).min(a.data.len());
                        put(&mut f.data, a.offset as usize, &a.data[..n]);
                        if a.stable != stable_how::UNSTABLE {
                            put(&mut f.stable, a.offset as usize, &a.data[..n]);
                        }
                        f.mtime = clock;
                        NfsReply::Write(Nfs3Result::Ok(WRITE3resok {
                            file_wcc: wcc(Some(before), Some(f)),
                            count: n as u32,
                            committed: a.stable,
                            verf,
                        }))
                    }
                    None => stale(NfsProc::Write),
                }
            }
            NfsRequest::Commit(a) => {
                if st.reboot_before_commit > 0 {
                    st.reboot_before_commit -= 1;
                    st.verifier += 1;
                    for f in st.files.values_mut() {
                        f.data = f.stable.clone();
                    }
                }
                let verf = MemNfs::verf(&st);
                match st.files.get_mut(a.file.data.as_ref()) {
                    Some(f) => {
                        f.stable = f.data.clone();
                        NfsReply::Commit(Nfs3Result::Ok(COMMIT3resok {
                            file_wcc: wcc(None, Some(f)),
                            verf,
                        }))
                    }
                    None => stale(NfsProc::Commit),
                }
            }
            NfsRequest::Setattr(_) if st.refuse_setattr => MemNfs::refused(NfsProc::Setattr),
            NfsRequest::Access(a) => match st.files.get(a.object.data.as_ref()) {
                Some(f) => {
                    let writer = cx_uid != st.read_only_uid;
                    let granted = if writer {
                        a.access
                    } else {
                        a.access & !(ACCESS3_MODIFY | ACCESS3_EXTEND)
                    };
                    NfsReply::Access(Nfs3Result::Ok(ACCESS3resok {
                        obj_attributes: Nfs3Option::Some(attrs(f)),
                        access: granted,
                    }))
                }
                None => stale(NfsProc::Access),
            },
            NfsRequest::Setattr(a) => {
                st.clock += 1;
                let clock = st.clock;
                match st.files.get_mut(a.object.data.as_ref()) {
                    Some(f) => {
                        let before = wcc_before(f);
                        if let Nfs3Option::Some(size) = a.new_attributes.size {
                            f.data.resize(size as usize, 0);
                            f.stable.resize(size as usize, 0);
                        }
                        f.mtime = match a.new_attributes.mtime {
                            set_mtime::SET_TO_CLIENT_TIME(t) => t.seconds,
                            _ => clock,
                        };
                        NfsReply::Setattr(Nfs3Result::Ok(SETATTR3resok {
                            obj_wcc: wcc(Some(before), Some(f)),
                        }))
                    }
                    None => stale(NfsProc::Setattr),
                }
            }
            NfsRequest::Remove(a) => {
                let name = a.object.name.as_ref().to_vec();
                match st.names.remove(&name) {
                    Some(fh) => {
                        st.files.remove(&fh);
                        NfsReply::Remove(Nfs3Result::Ok(REMOVE3resok {
                            dir_wcc: wcc_data::default(),
                        }))
                    }
                    None => NfsReply::error(NfsProc::Remove, nfsstat3::NFS3ERR_NOENT),
                }
            }
            NfsRequest::Link(a) => {
                let fh = a.file.data.to_vec();
                match st.files.get(&fh) {
                    Some(f) => {
                        let file_attributes = Nfs3Option::Some(attrs(f));
                        st.names.insert(a.link.name.as_ref().to_vec(), fh);
                        NfsReply::Link(Nfs3Result::Ok(LINK3resok {
                            file_attributes,
                            linkdir_wcc: wcc_data::default(),
                        }))
                    }
                    None => stale(NfsProc::Link),
                }
            }
            other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOTSUPP),
        }
    }
}

impl NfsService for MemNfs {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            if req.proc_() == NfsProc::Read {
                let d = *self.read_delay.lock().unwrap_or_else(|e| e.into_inner());
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
            }
            if req.proc_() == NfsProc::Write {
                let d = *self.write_delay.lock().unwrap_or_else(|e| e.into_inner());
                let now = self.writes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_writes_in_flight.fetch_max(now, Ordering::SeqCst);
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
                self.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            let is_read = req.proc_() == NfsProc::Read;
            let reply = self.handle(req, cx.cred.uid());
            let late = *self.read_late.lock().unwrap_or_else(|e| e.into_inner());
            if is_read && !late.is_zero() {
                tokio::time::sleep(late).await;
            }
            Ok(reply)
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async move { Ok(fh3(ROOT)) })
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}
