//! The boot id a cache directory records, to tell a crash of the proxy
//! alone from one of the whole system: only the process died if the system
//! has not restarted since the cache was opened. Every open records it (so
//! its file also says a cache was here), atomically and durably; a system
//! without a boot id is taken to have crashed.

use std::path::Path;

use super::super::UncleanShutdown;

/// The running system's boot id (`/proc/sys/kernel/random/boot_id`).
#[derive(Debug)]
pub(super) struct BootId(Option<String>);

/// Where a cache directory records the boot id it was last opened in.
pub(super) const BOOT_ID_FILE: &str = "boot-id";

impl BootId {
    pub(super) fn read() -> BootId {
        BootId(
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string()),
        )
    }

    /// What an unclean shutdown of the cache in `dir` may have done: only
    /// the process died if the system has not restarted since it was
    /// opened.
    pub(super) fn unclean_shutdown_in(&self, dir: &Path) -> UncleanShutdown {
        let last = std::fs::read_to_string(dir.join(BOOT_ID_FILE)).ok();
        match (&self.0, last) {
            (Some(now), Some(last)) if last.trim() == now => UncleanShutdown::ProcessOnly,
            _ => UncleanShutdown::SystemCrash,
        }
    }

    /// Records this boot as the one the cache in `dir` is open in.
    pub(super) fn record_in(&self, dir: &Path) {
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
