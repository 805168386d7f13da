//! Opening a store: bank files, headers, and rebuilding the index from the
//! tag tables after a clean or unclean shutdown (see the parent module's
//! crash-safety rules).

use super::*;
use crate::format::{CUT_MARK_AT, CUT_MARK_LEN, decode_cut_mark, encode_cut_mark};

pub(super) fn new_verifier(old: &[[u8; 8]]) -> [u8; 8] {
    let state = std::collections::hash_map::RandomState::new();
    let mut salt = 0u64;
    loop {
        let mut h = state.build_hasher();
        h.write_u64(salt);
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        h.write_u32(std::process::id());
        let v = h.finish().to_le_bytes();
        if v != [0; 8] && !old.contains(&v) {
            return v;
        }
        salt += 1;
    }
}

/// A geometry as the proxy's options that make it.
fn as_options(g: &Geometry) -> String {
    format!(
        "--cache-size {} --cache-banks {} --cache-ways {} --block-size {}",
        size_option(g.capacity()),
        g.banks(),
        g.ways(),
        size_option(u64::from(g.block_size()))
    )
}

/// Bytes in the largest unit that divides them (`4G`, `64K`, `1000`).
fn size_option(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// What a store keeps beside its banks, when it has a directory.
#[derive(Debug, Default)]
struct Kept {
    quarantine: Option<Quarantine>,
    writers: Writers,
    /// The directory held a cache before.
    existed: bool,
}

/// How one bank is recovered.
#[derive(Debug, Clone, Copy)]
pub(super) struct BankCheck {
    /// Check every valid sub-block against its CRC.
    verify: bool,
    /// Bytes of the bank file that were there on open: a sub-block past
    /// them is lost whatever its tag says.
    sound_len: u64,
    /// The header said dirty writes were not synced (or was unreadable).
    unsynced: bool,
    /// The header said the bank was closed cleanly.
    closed_cleanly: bool,
    /// An unsynced bank after a system crash: writes may have landed in
    /// any order and torn anywhere (see [`judge`]).
    lenient: bool,
}

/// What recovery does with a sub-block whose bytes do not match its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The newest write to it never landed: the bytes are as the frame's
    /// older tag describes them; go back to that.
    Revert,
    /// Keep the bytes, dirty and committed: a committed sub-block was being
    /// overwritten, the client resends the overwrite, the rest of its bytes
    /// are the committed ones.
    KeepTorn,
    /// Back to the committed extent the older tag names, with the bytes
    /// there now (a committed partial sub-block merged with upstream's
    /// bytes, then torn).
    CommittedExtent(u32, u32),
    /// Bytes that cannot be vouched for: dropped (clean ones are fetched
    /// again; dirty ones are lost, set aside and reported).
    Drop,
}

/// Decides what recovery does with sub-block `sb` of `tag` (the newest)
/// whose bytes `data` (the whole sub-block) do not match its CRC; `older`
/// is the frame's other tag when it names the same block, and `other_torn`
/// says the other slot failed its own checksum (a torn tag write).
///
/// Every write in place writes the tag before the data, and a dirty
/// rewrite takes the sub-block's committed bit away in that tag until the
/// next sync. So after the process alone died (the system's page cache
/// kept every write, in order, at most the last one cut short at a page),
/// a sub-block's bytes are those its newest tag describes or those from
/// before the newest write to it. The latter match the older tag when that
/// write was the first since the last sync. Otherwise the tags show a
/// rewrite since the sync (or the slot that recorded it was being written),
/// and a sub-block committed at the last sync is kept as it is: the client
/// resends its uncommitted overwrites, the rest of its bytes are the
/// committed ones. Anything else is rot. After a system crash an unsynced
/// bank's writes may have landed in any order, so a committed sub-block is
/// kept whatever its bytes: data the client committed is not given up on a
/// guess.
fn judge(
    tag: &Tag,
    older: Option<&Tag>,
    other_torn: bool,
    sb: u32,
    data: &[u8],
    check: BankCheck,
) -> Verdict {
    let i = sb as usize;
    let range_of = |t: &Tag| t.span(sb, data.len());
    if let Some(o) = older
        && let Some((a, b)) = range_of(o)
        && data
            .get(a..b)
            .is_some_and(|bytes| crc32fast::hash(bytes) == o.crcs[i])
        // After a system crash, going back must not make dirty data clean:
        // the older tag may predate a write-back of it.
        && !(check.lenient && tag.dirty.contains(sb) && !o.dirty.contains(sb))
    {
        return Verdict::Revert;
    }
    let older_committed = older.is_some_and(|o| o.committed.contains(sb));
    let committed = tag.dirty.contains(sb) && (tag.committed.contains(sb) || older_committed);
    // Kept committed: whole, unless only the older tag's extent was
    // committed (a clean fill merged around it since).
    let keep = || match older {
        Some(o)
            if !tag.committed.contains(sb)
                && o.partial.contains(sb)
                && o.committed.contains(sb)
                && !tag.partial.contains(sb) =>
        {
            let (a, b) = o.extents[i];
            Verdict::CommittedExtent(a, b)
        }
        _ => Verdict::KeepTorn,
    };
    if check.lenient {
        return if committed { keep() } else { Verdict::Drop };
    }
    let rewritten = other_torn
        || older.is_some_and(|o| {
            o.valid.contains(sb) != tag.valid.contains(sb)
                || o.partial.contains(sb) != tag.partial.contains(sb)
                || o.extents[i] != tag.extents[i]
                || o.crcs[i] != tag.crcs[i]
                || (o.committed.contains(sb) && !tag.committed.contains(sb))
        });
    if check.unsynced && committed && rewritten {
        return keep();
    }
    Verdict::Drop
}

/// The length a bank's cut mark records, if it has one.
fn read_cut_mark(storage: &dyn Storage, len: u64) -> Result<Option<u64>> {
    if len < CUT_MARK_AT + CUT_MARK_LEN as u64 {
        return Ok(None);
    }
    let mut b = [0u8; CUT_MARK_LEN];
    storage
        .read_at(&mut b, CUT_MARK_AT)
        .ctx("reading a bank's cut mark")?;
    Ok(decode_cut_mark(&b))
}

/// Reserves the disk space of every bank file, so that no later write into
/// one can fail for want of space (a full disk must not lose what the cache
/// acknowledged). A filesystem that cannot reserve space is accepted. When
/// there is no room, the bank files this open `created` are emptied again,
/// so a failed start leaves the disk as it found it.
fn reserve_space(banks: &[Bank], created: &[bool], len: u64) -> Result<()> {
    let nospc = rustix::io::Errno::NOSPC.raw_os_error();
    for bank in banks {
        match bank.storage.allocate(len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => return Ok(()),
            Err(e) => {
                for (bank, _) in banks.iter().zip(created).filter(|(_, new)| **new) {
                    let _ = bank.storage.set_len(0);
                }
                return if e.raw_os_error() == Some(nospc) {
                    Err(Error::NoSpaceForBanks {
                        needed: len * banks.len() as u64,
                    })
                } else {
                    Err(e).ctx("reserving space for a bank file")
                };
            }
        }
    }
    Ok(())
}

/// The running system's boot id (`/proc/sys/kernel/random/boot_id`), to
/// tell a crash of the proxy alone from one of the whole system.
#[derive(Debug)]
struct BootId(Option<String>);

const BOOT_ID_FILE: &str = "boot-id";

impl BootId {
    fn read() -> BootId {
        BootId(
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string()),
        )
    }

    /// What an unclean shutdown of the cache in `dir` may have done: only
    /// the process died if the system has not restarted since it was
    /// opened.
    fn unclean_shutdown_in(&self, dir: &Path) -> UncleanShutdown {
        let last = std::fs::read_to_string(dir.join(BOOT_ID_FILE)).ok();
        match (&self.0, last) {
            (Some(now), Some(last)) if last.trim() == now => UncleanShutdown::ProcessOnly,
            _ => UncleanShutdown::SystemCrash,
        }
    }

    /// Records this boot as the one the cache in `dir` is open in.
    fn record_in(&self, dir: &Path) {
        let Some(id) = &self.0 else { return };
        let tmp = dir.join(format!("{BOOT_ID_FILE}.tmp"));
        let written = std::fs::write(&tmp, id)
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, dir.join(BOOT_ID_FILE)));
        if let Err(e) = written {
            tracing::warn!("block cache: could not record the boot id: {e}");
        }
    }
}

impl BlockStore {
    /// Opens (creating as needed) the bank files `DIR/bank-NNN.gvfs`, and
    /// holds `DIR/lock` while open: a second process is refused.
    pub fn open_dir(
        dir: &Path,
        geometry: Geometry,
        options: OpenOptions,
    ) -> Result<(BlockStore, RecoveryReport)> {
        std::fs::create_dir_all(dir).ctx("creating the cache directory")?;
        // One process per cache directory: two would each believe they
        // own every frame.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .ctx("opening the cache directory's lock file")?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::DirInUse {
                    dir: dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).ctx("locking the cache directory");
            }
        }
        let mut storages: Vec<Box<dyn Storage>> = Vec::new();
        for b in 0..geometry.banks() {
            let path = dir.join(format!("bank-{b:03}.gvfs"));
            storages.push(Box::new(
                FileStorage::open(&path).ctx("opening a bank file")?,
            ));
        }
        // Whether the system restarted since this directory was last
        // opened decides what an unclean shutdown may have done.
        let boot = BootId::read();
        let mut options = options;
        if options.unclean == UncleanShutdown::Unknown {
            options.unclean = boot.unclean_shutdown_in(dir);
        }
        let kept = Kept {
            quarantine: Some(Quarantine::in_dir(dir)),
            writers: Writers::load(dir),
            // Recorded by every open: a cache was here, even if every bank
            // file is gone.
            existed: dir.join(BOOT_ID_FILE).exists(),
        };
        let (mut store, report) = BlockStore::open_with(storages, geometry, options, kept)?;
        boot.record_in(dir);
        store._dir_lock = Some(lock);
        Ok((store, report))
    }

    /// Opens a cache over one storage per bank, recovering the index from
    /// the tag tables (the cache is warm after a restart) and repairing what
    /// a crash left behind. See the module docs for the verifier rule.
    pub fn open(
        storages: Vec<Box<dyn Storage>>,
        geometry: Geometry,
        options: OpenOptions,
    ) -> Result<(BlockStore, RecoveryReport)> {
        BlockStore::open_with(storages, geometry, options, Kept::default())
    }

    fn open_with(
        storages: Vec<Box<dyn Storage>>,
        geometry: Geometry,
        options: OpenOptions,
        kept: Kept,
    ) -> Result<(BlockStore, RecoveryReport)> {
        if storages.len() != geometry.banks() as usize {
            return Err(Error::BankCountMismatch {
                expected: geometry.banks(),
                given: storages.len(),
            });
        }
        let layout = BankLayout::new(&geometry);
        let mut report = RecoveryReport::default();
        let mut old_verifiers: Vec<[u8; 8]> = Vec::new();
        let mut max_epoch = 0u64;
        let mut change = false;
        let mut banks = Vec::new();
        let mut checks = Vec::new();
        let mut created = Vec::new();
        let mut cut = Vec::new();
        for (b, storage) in storages.into_iter().enumerate() {
            let b32 = b as u32;
            let len = storage.len().ctx("reading a bank's length")?;
            let mut header_ok = None;
            created.push(len == 0);
            if len == 0 {
                report.banks_created += 1;
            } else {
                let mut buf = [0u8; HEADER_LEN];
                let decoded = if len >= HEADER_LEN as u64 {
                    storage.read_at(&mut buf, 0).ctx("reading a bank header")?;
                    Header::decode(&buf)
                } else {
                    Err(HeaderError::Corrupt)
                };
                match decoded {
                    Ok(h) if !h.matches(&geometry, b32) => {
                        let found = Geometry::from_parts(
                            h.banks,
                            h.ways,
                            h.block_size,
                            h.sub_block_size,
                            h.sets_per_bank,
                        )
                        .map(|g| as_options(&g))
                        .unwrap_or_else(|e| format!("an invalid geometry ({e})"));
                        return Err(Error::GeometryMismatch {
                            bank: b32,
                            found,
                            wanted: as_options(&geometry),
                        });
                    }
                    Ok(h) => header_ok = Some(h),
                    Err(HeaderError::Version(version)) => {
                        return Err(Error::UnsupportedFormatVersion { bank: b32, version });
                    }
                    Err(HeaderError::Blank | HeaderError::Corrupt) => {
                        report.headers_lost += 1;
                        change = true;
                        tracing::warn!(bank = b, "bank header unreadable; recovering from tags");
                    }
                }
            }
            // Shorter than its layout but not empty: cut off (a full disk, a
            // copy that stopped), now or before a start that did not finish.
            // Nothing past the cut can be trusted.
            let mark = read_cut_mark(storage.as_ref(), len)?;
            let cut_now = len != 0 && len < layout.file_len();
            let truncated = cut_now || mark.is_some();
            let sound_len = mark.unwrap_or(len).min(len);
            if cut_now && mark.is_none() {
                storage
                    .write_at(&encode_cut_mark(len), CUT_MARK_AT)
                    .ctx("marking a bank file cut short")?;
                storage.sync().ctx("marking a bank file cut short")?;
            }
            cut.push(truncated);
            if truncated {
                report.banks_truncated += 1;
                change = true;
                tracing::error!(
                    bank = b,
                    len,
                    expected = layout.file_len(),
                    "bank file is shorter than it should be: whatever was cached past its end, \
                     dirty data included, is lost"
                );
            }
            let len = sound_len;
            if len < layout.file_len() {
                storage
                    .set_len(layout.file_len())
                    .ctx("sizing a bank file")?;
            }
            let unsynced = header_ok.is_none_or(|h| h.sync == SyncState::DirtyUnsynced);
            let header_says_verify = match header_ok {
                Some(h) => {
                    old_verifiers.push(h.verifier);
                    max_epoch = max_epoch.max(h.epoch);
                    if h.sync == SyncState::DirtyUnsynced {
                        report.unsynced_banks += 1;
                        change = true;
                    }
                    if h.shutdown != Shutdown::Clean {
                        report.unclean_banks += 1;
                    }
                    h.shutdown != Shutdown::Clean || options.verify_data == VerifyData::Always
                }
                None => len != 0,
            };
            checks.push(BankCheck {
                verify: truncated || header_says_verify,
                sound_len: if truncated { sound_len } else { u64::MAX },
                lenient: unsynced && options.unclean != UncleanShutdown::ProcessOnly,
                unsynced,
                closed_cleanly: header_ok.is_some_and(|h| h.shutdown == Shutdown::Clean),
            });
            banks.push(Bank {
                storage,
                header: Header::new(&geometry, b32, [0; 8], 0),
                unsynced_io: true,
            });
        }
        reserve_space(&banks, &created, layout.file_len())?;
        old_verifiers.dedup();
        report.new_cache = old_verifiers.is_empty() && !kept.existed;
        // A bank file created anew beside banks that have headers (or in a
        // directory that held a cache) was deleted: whatever it held is
        // gone, dirty data included.
        if !report.new_cache && report.banks_created > 0 {
            report.banks_lost = report.banks_created;
            change = true;
            tracing::error!(
                banks_lost = report.banks_lost,
                "bank files of this cache are missing and were created empty: whatever they \
                 held, dirty data included, is lost; the write verifier changes so clients \
                 resend what they have not committed"
            );
        }
        if old_verifiers.len() > 1 {
            change = true;
        }
        let frames = (0..geometry.total_frames())
            .map(|_| Frame::empty(geometry.sub_blocks_per_block()))
            .collect();
        let mut inner = Inner {
            geo: geometry,
            layout,
            banks,
            frames,
            index: BTreeMap::new(),
            touched: BTreeSet::new(),
            clock: 1,
            seq: 1,
            stats: CacheStats {
                capacity: geometry.capacity(),
                ..CacheStats::default()
            },
            poisoned: false,
            closed: false,
            scratch: Vec::new(),
            quarantine: kept.quarantine,
            writers: kept.writers,
            on_drop: DropHook::default(),
        };
        // What recovery reads must be durable before it writes over it: a
        // tag a killed process left in the page cache may be the newest
        // copy, and recovery rewrites the other slot.
        for bank in &inner.banks {
            bank.storage.sync().ctx("syncing a bank before recovery")?;
        }
        for (b, check) in checks.into_iter().enumerate() {
            inner.recover_bank(b, check, &mut report)?;
        }
        if report.corrupt_tags > 0
            || report.dirty_sub_blocks_lost > 0
            || report.torn_committed_kept > 0
            || report.unlanded_writes_reverted > 0
        {
            change = true;
        }
        if report.dirty_sub_blocks_lost > 0 || report.corrupt_tags > 0 {
            tracing::error!(
                dirty_sub_blocks_lost = report.dirty_sub_blocks_lost,
                corrupt_tags = report.corrupt_tags,
                "block cache recovery dropped data that may have been dirty; \
                 the write verifier changes so clients resend uncommitted writes"
            );
        }
        let verifier = match old_verifiers.as_slice() {
            [v] if !change => *v,
            _ => new_verifier(&old_verifiers),
        };
        report.verifier_changed = !report.new_cache && change;
        inner.stats.corrupt_clean_dropped = report.clean_sub_blocks_dropped;
        inner.stats.dirty_sub_blocks_lost = report.dirty_sub_blocks_lost;
        inner.stats.banks_lost = u64::from(report.banks_lost + report.banks_truncated);
        inner.stats.verifier_changes = u64::from(report.verifier_changed);
        // New headers, then a sync: repairs become durable, then recovered
        // dirty data is recorded as committed (it is on disk now).
        for b in 0..inner.banks.len() {
            let mut h = Header::new(&geometry, b as u32, verifier, max_epoch + 1);
            h.shutdown = Shutdown::Open;
            h.sync = SyncState::Synced;
            inner.write_header(b, h)?;
        }
        inner.sync()?;
        // Only now, with the repairs durable, may a cut be forgotten.
        for (bank, _) in inner.banks.iter().zip(&cut).filter(|(_, c)| **c) {
            bank.storage
                .write_at(&[0u8; CUT_MARK_LEN], CUT_MARK_AT)
                .ctx("clearing a bank's cut mark")?;
            bank.storage.sync().ctx("clearing a bank's cut mark")?;
        }
        if report.verifier_changed {
            tracing::warn!(?report, "block cache opened with a new write verifier");
        } else {
            tracing::info!(?report, "block cache opened");
        }
        Ok((
            BlockStore {
                inner: Mutex::new(inner),
                _dir_lock: None,
            },
            report,
        ))
    }
}

impl Inner {
    /// Rebuilds the index from one bank's tag table.
    fn recover_bank(
        &mut self,
        b: usize,
        check: BankCheck,
        report: &mut RecoveryReport,
    ) -> Result<()> {
        let frames = self.layout.frames;
        let tag_len = self.layout.tag_len;
        let ways = self.ways() as u64;
        let sets_per_bank = self.geo.sets_per_bank();
        let sbs = self.geo.sub_block_size() as usize;
        const CHUNK: u64 = 1024;
        let mut table = Vec::new();
        let mut block_buf = vec![0u8; self.geo.block_size() as usize];
        for chunk_start in (0..frames).step_by(CHUNK as usize) {
            let n = CHUNK.min(frames - chunk_start);
            table.resize(2 * n as usize * tag_len, 0);
            self.banks[b]
                .storage
                .read_at(&mut table, self.layout.tag_offset(chunk_start, 0))
                .ctx("reading a tag table")?;
            for i in 0..n as usize {
                let fib = chunk_start + i as u64;
                let id = ((b as u64 * sets_per_bank + fib / ways) * ways + fib % ways) as usize;
                let slots = [
                    Tag::decode(&self.layout, &table[2 * i * tag_len..(2 * i + 1) * tag_len]),
                    Tag::decode(
                        &self.layout,
                        &table[(2 * i + 1) * tag_len..(2 * i + 2) * tag_len],
                    ),
                ];
                let newest = match (&slots[0], &slots[1]) {
                    (Ok(a), Ok(b)) => u8::from(b.generation > a.generation),
                    (Ok(_), _) => 0,
                    (_, Ok(_)) => 1,
                    (Err(TagError::Empty), Err(TagError::Empty)) => continue,
                    (Err(TagError::Corrupt), Err(TagError::Corrupt)) => {
                        // Both copies bad: whatever was durable here is lost.
                        report.corrupt_tags += 1;
                        self.frames[id].durable_slot = 0;
                        self.write_tag(id)?;
                        continue;
                    }
                    // A torn first tag write next to a never-written slot:
                    // nothing durable was ever here.
                    _ => {
                        report.torn_tag_writes += 1;
                        let corrupt =
                            u8::from(slots[1].is_err() && slots[1] != Err(TagError::Empty));
                        self.frames[id].durable_slot = 1 - corrupt;
                        self.write_tag(id)?;
                        continue;
                    }
                };
                let other_torn = slots[usize::from(1 - newest)] == Err(TagError::Corrupt);
                if other_torn {
                    // Erased, so that a later clean open does not take an
                    // old torn write for rot.
                    let off = self.layout.tag_offset(fib, 1 - newest);
                    self.banks[b]
                        .storage
                        .write_at(&vec![0u8; tag_len], off)
                        .ctx("erasing a torn tag")?;
                    self.banks[b].unsynced_io = true;
                }
                let Ok(mut tag) = slots[usize::from(newest)].clone() else {
                    continue;
                };
                if other_torn && check.closed_cleanly {
                    // No tag write was in flight in a bank closed cleanly: the
                    // bad slot is rot, and it may have been the newer one, so
                    // the other may describe a state long gone (dirty data
                    // since written back). The frame goes; what its tag
                    // calls dirty is set aside and reported lost.
                    report.corrupt_tags += 1;
                    if !tag.dirty.is_empty() {
                        let (bank, off) = self.data_pos(id, 0);
                        self.banks[bank]
                            .storage
                            .read_at(&mut block_buf, off)
                            .ctx("reading frame data")?;
                        for sb in tag.dirty.iter() {
                            report.dirty_sub_blocks_lost += 1;
                            let i = sb as usize;
                            let (a, b) = tag.span(sb, sbs).unwrap_or((0, sbs));
                            let offset =
                                tag.block * u64::from(self.geo.block_size()) + (i * sbs + a) as u64;
                            if let Some(q) = self.quarantine.as_mut() {
                                q.keep(&tag.fh, offset, &block_buf[i * sbs + a..i * sbs + b]);
                            }
                        }
                    }
                    let f = &mut self.frames[id];
                    f.generation = tag.generation;
                    f.durable_slot = 1 - newest;
                    self.write_tag(id)?;
                    continue;
                }
                if other_torn {
                    report.torn_tag_writes += 1;
                }
                let older = slots[usize::from(1 - newest)].clone().ok();
                // Only the current copy's committed bits count: an older
                // copy's may have been cleared by a durable mark_clean
                // before the frame was reused.
                let committed = tag.committed;
                {
                    let f = &mut self.frames[id];
                    f.generation = tag.generation;
                    f.durable_slot = newest;
                }
                if tag.valid.is_empty() && tag.partial.is_empty() {
                    continue;
                }
                let set = self.geo.set_index(&tag.fh, tag.block);
                if set as usize != id / ways as usize {
                    report.corrupt_tags += 1;
                    self.write_tag(id)?;
                    continue;
                }
                let mut changed = false;
                if check.verify {
                    let (bank, off) = self.data_pos(id, 0);
                    self.banks[bank]
                        .storage
                        .read_at(&mut block_buf, off)
                        .ctx("reading frame data")?;
                    for sb in tag.valid.or(tag.partial).iter().collect::<Vec<_>>() {
                        let i = sb as usize;
                        let (a, b) = tag.span(sb, sbs).unwrap_or((0, sbs));
                        let crc = crc32fast::hash(&block_buf[i * sbs + a..i * sbs + b]);
                        let (_, at) = self.data_pos(id, sb);
                        let beyond = at + sbs as u64 > check.sound_len;
                        if crc == tag.crcs[i] && !beyond {
                            continue;
                        }
                        changed = true;
                        let data = &block_buf[i * sbs..(i + 1) * sbs];
                        let same = older
                            .as_ref()
                            .filter(|o| o.fh == tag.fh && o.block == tag.block);
                        let verdict = if beyond {
                            Verdict::Drop
                        } else {
                            judge(&tag, same, other_torn, sb, data, check)
                        };
                        match verdict {
                            Verdict::Revert => {
                                let Some(o) = same else { continue };
                                report.unlanded_writes_reverted += 1;
                                for (mask, from) in [
                                    (&mut tag.valid, o.valid),
                                    (&mut tag.partial, o.partial),
                                    (&mut tag.dirty, o.dirty),
                                    (&mut tag.committed, o.committed),
                                ] {
                                    if from.contains(sb) {
                                        mask.insert(sb);
                                    } else {
                                        mask.remove(sb);
                                    }
                                }
                                tag.extents[i] = o.extents[i];
                                tag.crcs[i] = o.crcs[i];
                            }
                            Verdict::KeepTorn => {
                                report.torn_committed_kept += 1;
                                tracing::warn!(
                                    block = tag.block,
                                    sub_block = sb,
                                    "block cache: a committed sub-block was being overwritten \
                                     when the proxy stopped; its bytes are kept for the client \
                                     to resend the overwrite"
                                );
                                tag.crcs[i] = crc;
                                tag.dirty.insert(sb);
                                tag.committed.insert(sb);
                            }
                            Verdict::CommittedExtent(a, b) => {
                                report.torn_committed_kept += 1;
                                tag.valid.remove(sb);
                                tag.partial.insert(sb);
                                tag.dirty.insert(sb);
                                tag.committed.insert(sb);
                                tag.extents[i] = (a, b);
                                tag.crcs[i] = crc32fast::hash(&data[a as usize..b as usize]);
                            }
                            Verdict::Drop => {
                                if tag.dirty.contains(sb) {
                                    report.dirty_sub_blocks_lost += 1;
                                    let kept = self.quarantine.as_mut().and_then(|q| {
                                        let offset = tag.block * u64::from(self.geo.block_size())
                                            + (i * sbs + a) as u64;
                                        q.keep(&tag.fh, offset, &data[a..b])
                                    });
                                    tracing::error!(
                                        block = tag.block,
                                        sub_block = sb,
                                        set_aside = kept
                                            .map(|p| p.display().to_string())
                                            .unwrap_or_default(),
                                        "block cache: dirty data failed its checksum; it is \
                                         dropped, not written back"
                                    );
                                } else {
                                    report.clean_sub_blocks_dropped += 1;
                                }
                                tag.valid.remove(sb);
                                tag.dirty.remove(sb);
                                tag.committed.remove(sb);
                                tag.partial.remove(sb);
                                tag.extents[i] = (0, 0);
                            }
                        }
                    }
                }
                for (i, c) in tag.crcs.iter_mut().enumerate() {
                    if !tag.valid.or(tag.partial).contains(i as u32) {
                        *c = 0;
                    }
                }
                if tag.dirty.is_empty() {
                    tag.dirty_end = 0;
                }
                // Two tags for one block (cannot happen unless corrupt): keep
                // the more recently used.
                if let Some(other) = self.lookup(&tag.fh, tag.block) {
                    report.corrupt_tags += 1;
                    if self.frames[other].lru >= tag.lru {
                        self.write_tag(id)?;
                        continue;
                    }
                    if let Some((fh, block)) = self.frames[other].key.take() {
                        self.unindex(&fh, block);
                    }
                    self.frames[other].clear();
                    self.write_tag(other)?;
                    report.frames_recovered -= 1;
                }
                self.clock = self.clock.max(tag.lru + 1);
                if tag.valid.is_empty() && tag.partial.is_empty() {
                    self.write_tag(id)?;
                    continue;
                }
                let fh = FileHandle::from_checked(&tag.fh);
                let f = &mut self.frames[id];
                f.key = Some((fh.clone(), tag.block));
                f.valid = tag.valid;
                f.dirty = tag.dirty;
                f.committed = tag.committed;
                f.partial = tag.partial;
                f.extents = tag.extents;
                f.dirty_end = tag.dirty_end;
                f.durable_committed = committed;
                f.crcs = tag.crcs;
                f.lru = tag.lru;
                self.index.entry(fh).or_default().insert(tag.block, id);
                report.frames_recovered += 1;
                if changed || f.committed != f.dirty {
                    self.write_tag(id)?;
                }
            }
        }
        report.dirty_frames_recovered =
            self.frames.iter().filter(|f| !f.dirty.is_empty()).count() as u64;
        Ok(())
    }
}
