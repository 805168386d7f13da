//! What the gate knows of the link it admits requests to.

use gvfs_nfs::net::estimate::{LinkEstimate, LinkHandle};
use tokio::time::Instant;

/// What the gate knows of the link: the RPC client's estimate
/// ([`LinkHandle`]), or a fixed one in tests.
pub trait Link: Send + Sync + 'static {
    /// The link as measured, once something has been.
    fn estimate(&self) -> Option<LinkEstimate>;

    /// Calls a client waits for on the link besides the gate's (NFS calls
    /// passed upstream) in flight, and when one last began or ended.
    fn foreground(&self) -> (usize, Option<Instant>) {
        (0, None)
    }
}

impl Link for LinkHandle {
    fn estimate(&self) -> Option<LinkEstimate> {
        LinkHandle::estimate(self)
    }

    fn foreground(&self) -> (usize, Option<Instant>) {
        self.foreground_calls()
    }
}

/// A link that never changes (tests; `None`: never measured).
#[derive(Debug, Clone, Copy)]
pub struct FixedLink(pub Option<LinkEstimate>);

impl Link for FixedLink {
    fn estimate(&self) -> Option<LinkEstimate> {
        self.0
    }
}
