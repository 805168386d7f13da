//! Opening a store: bank files, headers, and rebuilding the index from the
//! tag tables after a clean or unclean shutdown. The crash-safety rules are
//! the parent module's; an open keeps them by taking these steps, in this
//! order:
//!
//! 1. **Banks** ([`banks`]): each file's header is read and checked against
//!    the geometry (a mismatch or an unknown format version refuses the
//!    open). A file cut short gets a cut mark, made durable, before it is
//!    grown back to its layout, and nothing past the cut is trusted. Then
//!    the space of every file is reserved. A bank file missing beside
//!    banks with headers (or in a directory that held a cache) lost what
//!    it held.
//! 2. **Durable before rewritten.** Every bank is fsynced before recovery
//!    writes over what it reads: a tag a killed process left in the page
//!    cache may be the newest copy, and recovery rewrites the other slot.
//! 3. **Tags** ([`tags`]): each frame's newest good tag is taken back into
//!    the index; in a bank to be verified its sub-blocks are checked
//!    against their CRCs, and one that fails is judged ([`judge`]).
//! 4. **Verifier**: the one every header agrees on is kept unless the
//!    parent module's verifier rule names something that happened on the
//!    way (a new cache gets a new one).
//! 5. **Repairs durable, then cuts forgotten.** New headers ("open",
//!    "synced") and a sync make the repairs durable and recovered dirty
//!    data committed (it is on disk now); only then are cut marks cleared.
//!
//! Whether the system restarted since the cache was last opened ([`boot`])
//! decides how much recovery may assume about an unsynced bank; the boot id
//! is recorded once an open succeeds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use crate::error::{Error, IoContext, Result};
use crate::format::{BankLayout, CUT_MARK_AT, CUT_MARK_LEN, Header, Shutdown, SyncState};
use crate::geometry::Geometry;
use crate::set::Frame;
use crate::storage::{FileStorage, Storage};

use super::quarantine::Quarantine;
use super::writers::Writers;
use super::{
    Bank, BlockStore, CacheStats, DropHook, Inner, OpenOptions, RecoveryReport, UncleanShutdown,
};

mod banks;
mod boot;
mod findings;
mod judge;
mod tags;

use banks::{BankCheck, open_bank, reserve_space};
use boot::{BOOT_ID_FILE, BootId};
use findings::Findings;

/// What a store keeps beside its banks, when it has a directory.
#[derive(Debug, Default)]
struct Kept {
    quarantine: Option<Quarantine>,
    writers: Writers,
    /// The directory held a cache before.
    existed: bool,
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
        let lock = lock_dir(dir)?;
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

    /// The steps of an open, in the order the module docs give.
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
        let mut found = Findings::default();
        let mut opened = Vec::new();
        for (b, storage) in storages.into_iter().enumerate() {
            opened.push(open_bank(
                b, storage, &geometry, &layout, options, &mut found,
            )?);
        }
        reserve_space(&opened, layout.file_len())?;
        found.count_lost_banks(kept.existed);
        let mut banks = Vec::new();
        let mut checks = Vec::new();
        let mut cut = Vec::new();
        for o in opened {
            banks.push(o.bank);
            checks.push(o.check);
            cut.push(o.cut);
        }
        let mut inner = Inner::recovering(geometry, layout, banks, kept);
        inner.sync_before_recovery()?;
        for (b, check) in checks.into_iter().enumerate() {
            inner.recover_bank(b, check, &mut found.report)?;
        }
        found.count_recovery_losses();
        let verifier = found.verifier();
        let report = found.report;
        inner.stats.corrupt_clean_dropped = report.clean_sub_blocks_dropped;
        inner.stats.dirty_sub_blocks_lost = report.dirty_sub_blocks_lost;
        inner.stats.banks_lost = u64::from(report.banks_lost + report.banks_truncated);
        inner.stats.verifier_changes = u64::from(report.verifier_changed);
        inner.start_session(verifier, found.max_epoch + 1)?;
        inner.forget_cuts(&cut)?;
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

/// Takes `DIR/lock`: one process per cache directory, since two would each
/// believe they own every frame.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .ctx("opening the cache directory's lock file")?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::DirInUse {
            dir: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(e).ctx("locking the cache directory"),
    }
}

impl Inner {
    /// A store over freshly opened banks with nothing in its index yet.
    fn recovering(geometry: Geometry, layout: BankLayout, banks: Vec<Bank>, kept: Kept) -> Inner {
        let frames = (0..geometry.total_frames())
            .map(|_| Frame::empty(geometry.sub_blocks_per_block()))
            .collect();
        Inner {
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
        }
    }

    /// Makes what recovery reads durable before it writes over it: a tag a
    /// killed process left in the page cache may be the newest copy, and
    /// recovery rewrites the other slot.
    fn sync_before_recovery(&self) -> Result<()> {
        for bank in &self.banks {
            bank.storage.sync().ctx("syncing a bank before recovery")?;
        }
        Ok(())
    }

    /// New headers ("open", "synced", the next epoch), then a sync: the
    /// repairs become durable, then recovered dirty data is recorded as
    /// committed (it is on disk now).
    fn start_session(&mut self, verifier: [u8; 8], epoch: u64) -> Result<()> {
        for b in 0..self.banks.len() {
            let mut h = Header::new(&self.geo, b as u32, verifier, epoch);
            h.shutdown = Shutdown::Open;
            h.sync = SyncState::Synced;
            self.write_header(b, h)?;
        }
        self.sync()
    }

    /// Clears the cut marks of the banks that were `cut`: only with the
    /// repairs durable may a cut be forgotten.
    fn forget_cuts(&self, cut: &[bool]) -> Result<()> {
        for (bank, _) in self.banks.iter().zip(cut).filter(|(_, c)| **c) {
            bank.storage
                .write_at(&[0u8; CUT_MARK_LEN], CUT_MARK_AT)
                .ctx("clearing a bank's cut mark")?;
            bank.storage.sync().ctx("clearing a bank's cut mark")?;
        }
        Ok(())
    }
}
