//! The first step of an open: each bank file's header read and checked, a
//! file cut short marked and grown back, and how the bank is to be
//! recovered decided from what its header says.
//!
//! * A header that names another geometry, or a format version this build
//!   does not know, refuses the open: nothing is written.
//! * An unreadable header is counted lost: the bank is recovered from its
//!   tags alone, verified, and the verifier changes.
//! * A file shorter than its layout but not empty was cut off (a full disk,
//!   a copy that stopped), now or before an open that did not finish.
//!   Nothing past the cut can be trusted: the cut is recorded in a mark in
//!   the header region, and synced, before the file is grown back, and the
//!   mark stays until recovery is durable.
//! * The space of every bank file is reserved, so that no later write into
//!   one can fail for want of space.

use crate::error::{Error, IoContext, Result};
use crate::format::{
    BankLayout, CUT_MARK_AT, CUT_MARK_LEN, HEADER_LEN, Header, HeaderError, Shutdown, SyncState,
    decode_cut_mark, encode_cut_mark,
};
use crate::geometry::Geometry;
use crate::storage::Storage;

use super::super::{Bank, OpenOptions, UncleanShutdown, VerifyData};
use super::findings::Findings;

/// How one bank is recovered.
#[derive(Debug, Clone, Copy)]
pub(super) struct BankCheck {
    /// Check every valid sub-block against its CRC.
    pub(super) verify: bool,
    /// Bytes of the bank file that were there on open: a sub-block past
    /// them is lost whatever its tag says.
    pub(super) sound_len: u64,
    /// The header said dirty writes were not synced (or was unreadable).
    pub(super) unsynced: bool,
    /// The header said the bank was closed cleanly.
    pub(super) closed_cleanly: bool,
    /// An unsynced bank after a system crash: writes may have landed in
    /// any order and torn anywhere (see [`judge`](super::judge)).
    pub(super) lenient: bool,
}

/// One bank file, opened and sized to its layout.
#[derive(Debug)]
pub(super) struct OpenedBank {
    pub(super) bank: Bank,
    pub(super) check: BankCheck,
    /// The file was empty: this open created it.
    pub(super) created: bool,
    /// The file was cut short (now or before): it has a cut mark, cleared
    /// once recovery is durable.
    pub(super) cut: bool,
}

/// Opens bank `b` over `storage`: reads its header, marks a cut and grows
/// the file back to its layout, and notes in `found` what the header says.
pub(super) fn open_bank(
    b: usize,
    storage: Box<dyn Storage>,
    geometry: &Geometry,
    layout: &BankLayout,
    options: OpenOptions,
    found: &mut Findings,
) -> Result<OpenedBank> {
    let len = storage.len().ctx("reading a bank's length")?;
    let created = len == 0;
    let header = if created {
        found.report.banks_created += 1;
        None
    } else {
        read_header(storage.as_ref(), len, geometry, b, found)?
    };
    let (truncated, sound_len) = mark_cut(storage.as_ref(), len, layout, b, found)?;
    if sound_len < layout.file_len() {
        storage
            .set_len(layout.file_len())
            .ctx("sizing a bank file")?;
    }
    let unsynced = header.is_none_or(|h| h.sync == SyncState::DirtyUnsynced);
    let header_says_verify = match header {
        Some(h) => {
            found.note_header(&h);
            h.shutdown != Shutdown::Clean || options.verify_data == VerifyData::Always
        }
        None => sound_len != 0,
    };
    Ok(OpenedBank {
        bank: Bank {
            storage,
            header: Header::new(geometry, b as u32, [0; 8], 0),
            unsynced_io: true,
        },
        check: BankCheck {
            verify: truncated || header_says_verify,
            sound_len: if truncated { sound_len } else { u64::MAX },
            lenient: unsynced && options.unclean != UncleanShutdown::ProcessOnly,
            unsynced,
            closed_cleanly: header.is_some_and(|h| h.shutdown == Shutdown::Clean),
        },
        created,
        cut: truncated,
    })
}

/// The header of bank `b` (a file of `len` bytes, not empty), or `None`
/// when it is unreadable (counted lost in `found`). A header of another
/// geometry or an unknown format version is an error.
fn read_header(
    storage: &dyn Storage,
    len: u64,
    geometry: &Geometry,
    b: usize,
    found: &mut Findings,
) -> Result<Option<Header>> {
    let b32 = b as u32;
    let mut buf = [0u8; HEADER_LEN];
    let decoded = if len >= HEADER_LEN as u64 {
        storage.read_at(&mut buf, 0).ctx("reading a bank header")?;
        Header::decode(&buf)
    } else {
        Err(HeaderError::Corrupt)
    };
    match decoded {
        Ok(h) if !h.matches(geometry, b32) => {
            let found = Geometry::from_parts(
                h.banks,
                h.ways,
                h.block_size,
                h.sub_block_size,
                h.sets_per_bank,
            )
            .map(|g| as_options(&g))
            .unwrap_or_else(|e| format!("an invalid geometry ({e})"));
            Err(Error::GeometryMismatch {
                bank: b32,
                found,
                wanted: as_options(geometry),
            })
        }
        Ok(h) => Ok(Some(h)),
        Err(HeaderError::Version(version)) => {
            Err(Error::UnsupportedFormatVersion { bank: b32, version })
        }
        Err(HeaderError::Blank | HeaderError::Corrupt) => {
            found.report.headers_lost += 1;
            found.change = true;
            tracing::warn!(bank = b, "bank header unreadable; recovering from tags");
            Ok(None)
        }
    }
}

/// Whether bank `b` (a file of `len` bytes) was cut short, now or before,
/// and how many of its bytes can be trusted. A cut found now is marked, and
/// the mark synced, before the file is grown back.
fn mark_cut(
    storage: &dyn Storage,
    len: u64,
    layout: &BankLayout,
    b: usize,
    found: &mut Findings,
) -> Result<(bool, u64)> {
    let mark = read_cut_mark(storage, len)?;
    let cut_now = len != 0 && len < layout.file_len();
    let truncated = cut_now || mark.is_some();
    let sound_len = mark.unwrap_or(len).min(len);
    if cut_now && mark.is_none() {
        storage
            .write_at(&encode_cut_mark(len), CUT_MARK_AT)
            .ctx("marking a bank file cut short")?;
        storage.sync().ctx("marking a bank file cut short")?;
    }
    if truncated {
        found.report.banks_truncated += 1;
        found.change = true;
        tracing::error!(
            bank = b,
            len,
            expected = layout.file_len(),
            "bank file is shorter than it should be: whatever was cached past its end, \
             dirty data included, is lost"
        );
    }
    Ok((truncated, sound_len))
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

impl Findings {
    /// Notes what a readable header says: its verifier and epoch, and
    /// whether its bank was synced and closed cleanly.
    fn note_header(&mut self, h: &Header) {
        self.old_verifiers.push(h.verifier);
        self.max_epoch = self.max_epoch.max(h.epoch);
        if h.sync == SyncState::DirtyUnsynced {
            self.report.unsynced_banks += 1;
            self.change = true;
        }
        if h.shutdown != Shutdown::Clean {
            self.report.unclean_banks += 1;
        }
    }
}

/// Reserves the disk space of every bank file, so that no later write into
/// one can fail for want of space (a full disk must not lose what the cache
/// acknowledged). A filesystem that cannot reserve space is accepted. When
/// there is no room, the bank files this open created are emptied again,
/// so a failed start leaves the disk as it found it.
pub(super) fn reserve_space(banks: &[OpenedBank], len: u64) -> Result<()> {
    let nospc = rustix::io::Errno::NOSPC.raw_os_error();
    for opened in banks {
        match opened.bank.storage.allocate(len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => return Ok(()),
            Err(e) => {
                for new in banks.iter().filter(|o| o.created) {
                    let _ = new.bank.storage.set_len(0);
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
