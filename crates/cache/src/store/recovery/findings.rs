//! What an open finds on its way: the report it returns and what the
//! verifier rule needs.

use crate::store::RecoveryReport;
use crate::store::verifier::new_verifier;

/// What an open found on its way, for the report and the verifier rule.
#[derive(Debug, Default)]
pub(super) struct Findings {
    pub(super) report: RecoveryReport,
    /// The verifiers of the headers that could be read.
    pub(super) old_verifiers: Vec<[u8; 8]>,
    /// The newest epoch a header recorded.
    pub(super) max_epoch: u64,
    /// Something the verifier rule names happened: the verifier changes.
    pub(super) change: bool,
}

impl Findings {
    /// Establishes whether the cache is new, and counts as lost the bank
    /// files created anew beside banks that have headers (or in a
    /// directory that held a cache): those were deleted, and whatever they
    /// held is gone, dirty data included.
    pub(super) fn count_lost_banks(&mut self, existed: bool) {
        let report = &mut self.report;
        self.old_verifiers.dedup();
        report.new_cache = self.old_verifiers.is_empty() && !existed;
        if !report.new_cache && report.banks_created > 0 {
            report.banks_lost = report.banks_created;
            self.change = true;
            tracing::error!(
                banks_lost = report.banks_lost,
                "bank files of this cache are missing and were created empty: whatever they \
                 held, dirty data included, is lost; the write verifier changes so clients \
                 resend what they have not committed"
            );
        }
        if self.old_verifiers.len() > 1 {
            self.change = true;
        }
    }

    /// Notes what rebuilding the index repaired or lost that changes the
    /// verifier.
    pub(super) fn count_recovery_losses(&mut self) {
        let report = &self.report;
        if report.corrupt_tags > 0
            || report.dirty_sub_blocks_lost > 0
            || report.torn_committed_kept > 0
            || report.unlanded_writes_reverted > 0
        {
            self.change = true;
        }
        if report.dirty_sub_blocks_lost > 0 || report.corrupt_tags > 0 {
            tracing::error!(
                dirty_sub_blocks_lost = report.dirty_sub_blocks_lost,
                corrupt_tags = report.corrupt_tags,
                "block cache recovery dropped data that may have been dirty; \
                 the write verifier changes so clients resend uncommitted writes"
            );
        }
    }

    /// The verifier of this session: the one every header agrees on, unless
    /// something changes it; and whether it changed for an old cache.
    pub(super) fn verifier(&mut self) -> [u8; 8] {
        let verifier = match self.old_verifiers.as_slice() {
            [v] if !self.change => *v,
            _ => new_verifier(&self.old_verifiers),
        };
        self.report.verifier_changed = !self.report.new_cache && self.change;
        verifier
    }
}
