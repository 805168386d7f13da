//! One soak client: a loop of NFS operations on files with known contents,
//! every byte read checked against a model of what the file must hold.
//!
//! Each client owns a directory `cNN` and the files it creates there (names
//! `cNN-NNNNNN`, never reused), and keeps their contents in memory; no other
//! client touches them, so the model is exact, listings included (a
//! listing of the directory must hold exactly the client's files). The
//! clients share no directory they change: nfs-ganesha 5.9 itself answers
//! some READDIRPLUS calls on a directory others are creating and removing
//! files in with NFS3ERR_STALE or NFS3ERR_JUKEBOX (about 0.2% of them when
//! asked directly), which would blame the proxies for the origin's race.
//! All clients also read the shared files, whose contents are
//! [`crate::data`]'s function of a seed. A client is either a *fixture*
//! client (the project's async NFS client: READ, WRITE UNSTABLE or
//! FILE_SYNC, COMMIT, CREATE, REMOVE, SETATTR of the size, GETATTR,
//! READDIRPLUS; a listing must hold every own file and no removed one) or a
//! *libnfs* client, which reads whole files with `nfs-cat`, creates them
//! with `nfs-cp`, lists the directory with `nfs-ls` and does the rest
//! (writes, removes: libnfs-utils has no `rm`) through the fixture
//! (`workload/libnfs.rs`).
//!
//! A write the server acknowledged as UNSTABLE is remembered with its write
//! verifier; a COMMIT (or a later UNSTABLE reply) with another verifier
//! means the server may have lost it, so the client writes the whole file
//! again, as RFC 1813 (section 3.3.21) asks of a client, and counts a
//! verifier change. A file whose state is unknown after a failed call is
//! *tainted*: counted, and no longer checked.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use gvfs_nfs::nfs3_types::nfs3::{
    COMMIT3args, CREATE3args, GETATTR3args, MKDIR3args, MKDIR3resok, Nfs3Option, Nfs3Result,
    READ3args, READDIRPLUS3args, REMOVE3args, SETATTR3args, WRITE3args, cookieverf3, createhow3,
    diropargs3, filename3, nfs_fh3, sattr3, sattrguard3, set_mode3, set_size3, stable_how,
};
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::{NfsReply, NfsRequest};

use crate::data::fill_at;
use crate::nfsclient::NfsClient;

mod plan;
use plan::mix;
pub use plan::{ClientKind, Op, Plan, Rng, SharedFile, Tally};

mod libnfs;

/// Most bytes one WRITE call carries.
const MAX_WRITE_CALL: usize = 256 << 10;
/// Most bytes one READ call asks for.
const MAX_READ_CALL: u32 = 256 << 10;
/// Most READDIRPLUS replies one listing may take.
const MAX_LIST_PAGES: usize = 1000;

/// What the UNSTABLE replies to a run of WRITEs said.
#[derive(Debug, Default, Clone, Copy)]
struct Unstable {
    /// The last reply's verifier (none when every reply was stable).
    verf: Option<[u8; 8]>,
    /// The verifier changed from one reply to another.
    changed: bool,
}

/// A client's file and what it must hold.
#[derive(Debug)]
struct OwnedFile {
    name: String,
    fh: nfs_fh3,
    data: Vec<u8>,
    /// The verifier of the last UNSTABLE WRITE or COMMIT reply.
    verf: Option<[u8; 8]>,
    /// Written UNSTABLE since the last COMMIT.
    unstable: bool,
    /// Its state is unknown after a failed call: not checked any more.
    tainted: bool,
}

/// What a client leaves: its counts, the files it must have left at the
/// origin (with their contents; `None` when tainted) and the names it
/// removed (which must be gone).
#[derive(Debug, Default)]
pub struct ClientEnd {
    /// Its counts.
    pub tally: Tally,
    /// Its files and their expected contents.
    pub files: Vec<(String, Option<Vec<u8>>)>,
    /// Names it removed.
    pub removed: Vec<String>,
}

/// One client of the soak.
pub struct Client {
    id: usize,
    kind: ClientKind,
    nfs: NfsClient,
    /// Its directory's name in the export's root, and handle.
    dir: String,
    dir_fh: nfs_fh3,
    /// Names whose existence is unknown after a failed call (tainted files,
    /// a failed `nfs-cp`): a listing may or may not hold them.
    uncertain: HashSet<String>,
    plan: Arc<Plan>,
    rng: Rng,
    files: Vec<OwnedFile>,
    removed: Vec<String>,
    created: u64,
    op_no: u64,
    tally: Tally,
    progress: Arc<AtomicU64>,
}

/// How many bytes of `got` differ from `want` at the same offsets, plus
/// those of `got` past `want`'s end.
fn differing(want: &[u8], got: &[u8]) -> u64 {
    let same_len = want.len().min(got.len());
    let diff = want[..same_len]
        .iter()
        .zip(&got[..same_len])
        .filter(|(a, b)| a != b)
        .count();
    (diff + got.len().saturating_sub(want.len())) as u64
}

impl Client {
    /// Client `id` of `kind`, on the connection `nfs`, with its directory
    /// made (MKDIR `cNN` in the export's root); `progress` counts the
    /// operations of all clients as they happen.
    pub async fn start(
        id: usize,
        kind: ClientKind,
        nfs: NfsClient,
        plan: Arc<Plan>,
        progress: Arc<AtomicU64>,
    ) -> Result<Self> {
        let seed = plan.seed ^ (id as u64).wrapping_mul(0xA076_1D64_78BD_642F);
        let dir = format!("c{id:02}");
        let reply = nfs
            .call(NfsRequest::Mkdir(MKDIR3args {
                where_: diropargs3 {
                    dir: nfs.root.clone(),
                    name: filename3::from(dir.as_bytes().to_vec()),
                },
                attributes: sattr3 {
                    mode: set_mode3::Some(0o755),
                    ..sattr3::default()
                },
            }))
            .await?;
        let dir_fh = match reply {
            NfsReply::Mkdir(Nfs3Result::Ok(MKDIR3resok {
                obj: Nfs3Option::Some(fh),
                ..
            })) => fh,
            other => nfs
                .lookup(&nfs.root.clone(), &dir)
                .await?
                .with_context(|| format!("MKDIR {dir}: {:?}", other.status()))?,
        };
        Ok(Self {
            id,
            kind,
            nfs,
            dir,
            dir_fh,
            uncertain: HashSet::new(),
            plan,
            rng: Rng::new(seed),
            files: Vec::new(),
            removed: Vec::new(),
            created: 0,
            op_no: 0,
            tally: Tally::default(),
            progress,
        })
    }

    /// The path of own file `name` below the export's root.
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    /// Runs operations until `deadline`, then commits every file.
    pub async fn run(mut self, deadline: Instant) -> ClientEnd {
        while Instant::now() < deadline {
            let op = self.pick();
            self.op_no += 1;
            let r = self.run_op(op).await;
            *self.tally.ops.entry(op.name()).or_default() += 1;
            self.progress.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = r {
                *self.tally.errors.entry(op.name()).or_default() += 1;
                let msg = format!("client {} {}: {e:#}", self.id, op.name());
                self.tally.note(msg);
            }
        }
        for i in 0..self.files.len() {
            if self.files[i].unstable
                && !self.files[i].tainted
                && let Err(e) = self.commit(i).await
            {
                *self.tally.errors.entry(Op::Commit.name()).or_default() += 1;
                self.tally
                    .note(format!("client {} final COMMIT: {e:#}", self.id));
            }
        }
        let dir = self.dir;
        ClientEnd {
            tally: self.tally,
            files: self
                .files
                .into_iter()
                .map(|f| (format!("{dir}/{}", f.name), (!f.tainted).then_some(f.data)))
                .collect(),
            removed: self
                .removed
                .into_iter()
                .map(|r| format!("{dir}/{r}"))
                .collect(),
        }
    }

    fn pick(&mut self) -> Op {
        let healthy = self.files.iter().filter(|f| !f.tainted).count();
        let create = match self.kind {
            ClientKind::Fixture => Op::Create,
            ClientKind::Libnfs => Op::NfsCp,
        };
        if healthy < self.plan.files_per_client.div_ceil(2) {
            return create;
        }
        let mix = mix(self.kind);
        let total: u32 = mix.iter().map(|(_, w)| w).sum();
        let mut x = self.rng.below(u64::from(total)) as u32;
        let mut op = mix[0].0;
        for &(o, w) in mix {
            if x < w {
                op = o;
                break;
            }
            x -= w;
        }
        if matches!(op, Op::Create | Op::NfsCp) && self.files.len() >= self.plan.files_per_client {
            return Op::Remove;
        }
        op
    }

    /// A random file that is not tainted (there is one: see `pick`).
    fn pick_file(&mut self) -> Result<usize> {
        let healthy: Vec<usize> = (0..self.files.len())
            .filter(|&i| !self.files[i].tainted)
            .collect();
        if healthy.is_empty() {
            bail!("no file to work on");
        }
        Ok(healthy[self.rng.below(healthy.len() as u64) as usize])
    }

    async fn run_op(&mut self, op: Op) -> Result<()> {
        let file = if op.needs_file() {
            Some(self.pick_file()?)
        } else {
            None
        };
        let taint_on_error = matches!(op, Op::Write | Op::Commit | Op::Remove | Op::Truncate);
        let r = match (op, file) {
            (Op::Read, Some(i)) => self.read_own(i).await,
            (Op::ReadShared, _) => self.read_shared().await,
            (Op::Write, Some(i)) => self.write_range(i).await,
            (Op::Commit, Some(i)) => self.commit(i).await,
            (Op::Create, _) => self.create().await,
            (Op::Remove, Some(i)) => self.remove(i).await,
            (Op::Truncate, Some(i)) => self.truncate(i).await,
            (Op::Getattr, Some(i)) => self.getattr(i).await,
            (Op::NfsCat, Some(i)) => self.cat_own(i).await,
            (Op::NfsCatShared, _) => self.cat_shared().await,
            (Op::NfsCp, _) => self.copy_in().await,
            (Op::Readdirplus, _) => self.list().await,
            (Op::NfsLs, _) => self.list_with_nfs_ls().await,
            (_, None) => bail!("no file to work on"),
        };
        if r.is_err()
            && taint_on_error
            && let Some(i) = file
            && let Some(f) = self.files.get_mut(i)
            && !f.tainted
        {
            f.tainted = true;
            self.uncertain.insert(f.name.clone());
            self.tally.tainted_files += 1;
        }
        r
    }

    fn content_seed(&self) -> u64 {
        self.plan.seed ^ ((self.id as u64) << 48) ^ self.op_no.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A size for a write or a new file: small and unaligned often, up to
    /// `max` now and then.
    fn some_size(&mut self, max: usize) -> usize {
        let cap = match self.rng.below(100) {
            0..50 => 4096,
            50..85 => 64 << 10,
            _ => max,
        };
        1 + self.rng.below(cap.min(max).max(1) as u64) as usize
    }

    /// READs `count` bytes at `offset` of `fh`, checking each reply against
    /// `want` (the whole file's contents).
    async fn read_check(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        count: u64,
        want: impl Fn(u64, usize) -> Vec<u8>,
        size: u64,
    ) -> Result<()> {
        let end = (offset + count).min(size);
        let mut pos = offset;
        while pos < offset + count {
            let ask = (offset + count - pos).min(u64::from(MAX_READ_CALL)) as u32;
            let reply = self
                .nfs
                .call(NfsRequest::Read(READ3args {
                    file: fh.clone(),
                    offset: pos,
                    count: ask,
                }))
                .await?;
            let NfsReply::Read(Nfs3Result::Ok(ok)) = reply else {
                bail!("READ at {pos}: {:?}", reply.status());
            };
            let got = ok.data.as_ref();
            let expect_len = end.saturating_sub(pos).min(got.len() as u64) as usize;
            let wrong = differing(&want(pos, expect_len), got);
            self.tally.bytes_read += got.len() as u64;
            if wrong > 0 {
                self.tally.wrong_bytes += wrong;
                bail!(
                    "READ at {pos} of {} bytes: {wrong} wrong bytes (file size {size})",
                    got.len()
                );
            }
            pos += got.len() as u64;
            if ok.eof {
                if pos < end {
                    bail!("READ: end of file at {pos}, the file has {size} bytes");
                }
                break;
            }
            if got.is_empty() {
                if pos < end {
                    bail!("READ at {pos}: no data and no end of file (size {size})");
                }
                break;
            }
        }
        Ok(())
    }

    async fn read_own(&mut self, i: usize) -> Result<()> {
        let f = &self.files[i];
        let (fh, data) = (f.fh.clone(), f.data.clone());
        let size = data.len() as u64;
        let offset = self.rng.below(size + 1);
        let count = 1 + self.rng.below(u64::from(MAX_READ_CALL) * 2);
        self.read_check(
            &fh,
            offset,
            count,
            |pos, n| data[pos as usize..pos as usize + n].to_vec(),
            size,
        )
        .await
        .with_context(|| self.files[i].name.clone())
    }

    fn pick_shared(&mut self) -> Result<SharedFile> {
        let n = self.plan.shared.len() as u64;
        if n == 0 {
            bail!("no shared files");
        }
        Ok(self.plan.shared[self.rng.below(n) as usize].clone())
    }

    async fn read_shared(&mut self) -> Result<()> {
        let s = self.pick_shared()?;
        let fh = self
            .nfs
            .lookup(&self.nfs.root.clone(), &s.name)
            .await?
            .with_context(|| format!("{} not found", s.name))?;
        let offset = self.rng.below(s.size + 1);
        let count = 1 + self.rng.below(1 << 20);
        let seed = s.seed;
        self.read_check(
            &fh,
            offset,
            count,
            |pos, n| {
                let mut b = vec![0; n];
                fill_at(seed, pos, &mut b);
                b
            },
            s.size,
        )
        .await
        .with_context(|| s.name.clone())
    }

    /// WRITEs `bytes` at `offset`; returns the verifier of the UNSTABLE
    /// replies, and whether it changed between two of them.
    async fn write_all(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        bytes: &[u8],
        stable: stable_how,
    ) -> Result<Unstable> {
        let mut done = 0;
        let mut out = Unstable::default();
        while done < bytes.len() {
            let n = (bytes.len() - done).min(MAX_WRITE_CALL);
            let reply = self
                .nfs
                .call(NfsRequest::Write(WRITE3args {
                    file: fh.clone(),
                    offset: offset + done as u64,
                    count: n as u32,
                    stable,
                    data: Opaque::owned(bytes[done..done + n].to_vec()),
                }))
                .await?;
            let NfsReply::Write(Nfs3Result::Ok(ok)) = reply else {
                bail!("WRITE at {}: {:?}", offset + done as u64, reply.status());
            };
            if ok.count == 0 {
                bail!("WRITE at {}: nothing written", offset + done as u64);
            }
            done += (ok.count as usize).min(n);
            self.tally.bytes_written += u64::from(ok.count);
            if ok.committed == stable_how::UNSTABLE {
                out.changed |= out.verf.is_some_and(|v| v != ok.verf.0);
                out.verf = Some(ok.verf.0);
            }
        }
        Ok(out)
    }

    /// Notes what an UNSTABLE write left; a verifier other than the one of
    /// the file's earlier unstable writes means they may be lost: the whole
    /// file is written again.
    async fn note_unstable(&mut self, i: usize, w: Unstable) -> Result<()> {
        let Some(verf) = w.verf else {
            return Ok(());
        };
        let f = &mut self.files[i];
        let changed = w.changed || (f.unstable && f.verf.is_some_and(|v| v != verf));
        f.verf = Some(verf);
        f.unstable = true;
        if changed {
            self.tally.verifier_changes += 1;
            self.rewrite(i).await?;
        }
        Ok(())
    }

    /// Writes the whole file again, FILE_SYNC.
    async fn rewrite(&mut self, i: usize) -> Result<()> {
        let (fh, data) = (self.files[i].fh.clone(), self.files[i].data.clone());
        self.write_all(&fh, 0, &data, stable_how::FILE_SYNC).await?;
        self.files[i].unstable = false;
        Ok(())
    }

    async fn write_range(&mut self, i: usize) -> Result<()> {
        let max = self.plan.max_file;
        let len = self.files[i].data.len();
        let mut offset = if self.rng.chance(30) {
            len
        } else {
            self.rng.below(len as u64 + 1) as usize
        };
        if self.rng.chance(50) {
            offset &= !4095;
        }
        if offset >= max {
            offset = self.rng.below(max as u64) as usize;
        }
        let n = self.some_size(max - offset);
        let mut bytes = vec![0; n];
        fill_at(self.content_seed(), 0, &mut bytes);
        let stable = if self.rng.chance(15) {
            stable_how::FILE_SYNC
        } else {
            stable_how::UNSTABLE
        };
        let fh = self.files[i].fh.clone();
        let w = self
            .write_all(&fh, offset as u64, &bytes, stable)
            .await
            .with_context(|| format!("{} at {offset}, {n} bytes", self.files[i].name))?;
        let data = &mut self.files[i].data;
        if data.len() < offset + n {
            data.resize(offset + n, 0);
        }
        data[offset..offset + n].copy_from_slice(&bytes);
        self.note_unstable(i, w).await
    }

    async fn commit(&mut self, i: usize) -> Result<()> {
        let reply = self
            .nfs
            .call(NfsRequest::Commit(COMMIT3args {
                file: self.files[i].fh.clone(),
                offset: 0,
                count: 0,
            }))
            .await?;
        let NfsReply::Commit(Nfs3Result::Ok(ok)) = reply else {
            bail!("COMMIT {}: {:?}", self.files[i].name, reply.status());
        };
        let f = &mut self.files[i];
        let changed = f.unstable && f.verf.is_some_and(|v| v != ok.verf.0);
        f.verf = Some(ok.verf.0);
        if changed {
            self.tally.verifier_changes += 1;
            self.rewrite(i).await?;
        }
        self.files[i].unstable = false;
        Ok(())
    }

    fn new_name(&mut self) -> String {
        self.created += 1;
        format!("c{:02}-{:06}", self.id, self.created)
    }

    async fn create(&mut self) -> Result<()> {
        let name = self.new_name();
        let reply = self
            .nfs
            .call(NfsRequest::Create(CREATE3args {
                where_: diropargs3 {
                    dir: self.dir_fh.clone(),
                    name: filename3::from(name.as_bytes().to_vec()),
                },
                how: createhow3::GUARDED(sattr3 {
                    mode: set_mode3::Some(0o644),
                    ..sattr3::default()
                }),
            }))
            .await?;
        let fh = match reply {
            NfsReply::Create(Nfs3Result::Ok(ok)) => match ok.obj {
                Nfs3Option::Some(fh) => fh,
                Nfs3Option::None => self
                    .nfs
                    .lookup(&self.dir_fh.clone(), &name)
                    .await?
                    .with_context(|| format!("{name} not found after CREATE"))?,
            },
            other => {
                // The call may have made the file even so (a reply lost).
                self.uncertain.insert(name.clone());
                bail!("CREATE {name}: {:?}", other.status())
            }
        };
        let size = if self.rng.chance(30) {
            0
        } else {
            self.some_size(self.plan.max_file)
        };
        let mut data = vec![0; size];
        fill_at(self.content_seed(), 0, &mut data);
        self.files.push(OwnedFile {
            name: name.clone(),
            fh: fh.clone(),
            data: Vec::new(),
            verf: None,
            unstable: false,
            tainted: false,
        });
        let i = self.files.len() - 1;
        match self.write_all(&fh, 0, &data, stable_how::UNSTABLE).await {
            Ok(w) => {
                self.files[i].data = data;
                self.note_unstable(i, w).await
            }
            Err(e) => {
                self.files[i].tainted = true;
                self.uncertain.insert(name.clone());
                self.tally.tainted_files += 1;
                Err(e.context(format!("first WRITE of {name}")))
            }
        }
    }

    async fn remove(&mut self, i: usize) -> Result<()> {
        let name = self.files[i].name.clone();
        let reply = self
            .nfs
            .call(NfsRequest::Remove(REMOVE3args {
                object: diropargs3 {
                    dir: self.dir_fh.clone(),
                    name: filename3::from(name.as_bytes().to_vec()),
                },
            }))
            .await?;
        if !matches!(reply, NfsReply::Remove(Nfs3Result::Ok(_))) {
            bail!("REMOVE {name}: {:?}", reply.status());
        }
        self.files.remove(i);
        self.removed.push(name);
        Ok(())
    }

    async fn truncate(&mut self, i: usize) -> Result<()> {
        let size = self.rng.below(self.plan.max_file as u64 + 1);
        let reply = self
            .nfs
            .call(NfsRequest::Setattr(SETATTR3args {
                object: self.files[i].fh.clone(),
                new_attributes: sattr3 {
                    size: set_size3::Some(size),
                    ..sattr3::default()
                },
                guard: sattrguard3::None,
            }))
            .await?;
        if !matches!(reply, NfsReply::Setattr(Nfs3Result::Ok(_))) {
            bail!(
                "SETATTR {} size {size}: {:?}",
                self.files[i].name,
                reply.status()
            );
        }
        self.files[i].data.resize(size as usize, 0);
        Ok(())
    }

    async fn getattr(&mut self, i: usize) -> Result<()> {
        let reply = self
            .nfs
            .call(NfsRequest::Getattr(GETATTR3args {
                object: self.files[i].fh.clone(),
            }))
            .await?;
        let NfsReply::Getattr(Nfs3Result::Ok(ok)) = reply else {
            bail!("GETATTR {}: {:?}", self.files[i].name, reply.status());
        };
        let (got, want) = (ok.obj_attributes.size, self.files[i].data.len() as u64);
        if got != want {
            bail!(
                "GETATTR {}: size {got}, expected {want}",
                self.files[i].name
            );
        }
        Ok(())
    }

    /// Checks a listing of the client's directory: it holds every healthy
    /// own file, and nothing else but `.`, `..` and names whose existence
    /// is unknown.
    fn check_listing(&self, names: &HashSet<Vec<u8>>, how: &str) -> Result<()> {
        for f in self.files.iter().filter(|f| !f.tainted) {
            if !names.contains(f.name.as_bytes()) {
                bail!("{how}: {} is not listed ({} names)", f.name, names.len());
            }
        }
        let own: HashSet<&[u8]> = self.files.iter().map(|f| f.name.as_bytes()).collect();
        for n in names {
            let known = own.contains(n.as_slice())
                || n == b"."
                || n == b".."
                || self.uncertain.contains(String::from_utf8_lossy(n).as_ref());
            if !known {
                bail!(
                    "{how}: {:?} is listed, which is not there (removed: {})",
                    String::from_utf8_lossy(n),
                    self.removed.iter().any(|r| r.as_bytes() == n.as_slice())
                );
            }
        }
        Ok(())
    }

    async fn list(&mut self) -> Result<()> {
        let mut names = HashSet::new();
        let (mut cookie, mut verf) = (0, cookieverf3::default());
        for page in 0.. {
            if page > MAX_LIST_PAGES {
                bail!("READDIRPLUS: more than {MAX_LIST_PAGES} pages");
            }
            let reply = self
                .nfs
                .call(NfsRequest::Readdirplus(READDIRPLUS3args {
                    dir: self.dir_fh.clone(),
                    cookie,
                    cookieverf: verf,
                    dircount: 8192,
                    maxcount: 32768,
                }))
                .await?;
            let NfsReply::Readdirplus(Nfs3Result::Ok(ok)) = reply else {
                bail!("READDIRPLUS at cookie {cookie}: {:?}", reply.status());
            };
            verf = ok.cookieverf;
            for e in &ok.reply.entries.0 {
                names.insert(e.name.0.as_ref().to_vec());
                cookie = e.cookie;
            }
            if ok.reply.eof {
                break;
            }
            if ok.reply.entries.0.is_empty() {
                bail!("READDIRPLUS at cookie {cookie}: no entries and no end");
            }
        }
        self.check_listing(&names, "READDIRPLUS")
    }
}

#[cfg(test)]
mod tests;
