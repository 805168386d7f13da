//! What the guest's parts share: how long QEMU and the tools may take.

use std::time::Duration;

/// How long a QMP reply, or a command-line tool, may take.
pub(super) const QMP_TIMEOUT: Duration = Duration::from_secs(60);
pub(super) const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
/// One MiB, the unit of the guest files' sizes.
pub(super) const MIB: u64 = 1 << 20;
