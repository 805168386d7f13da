//! The server edge's connection gauges and counters, kept by the accept
//! loop (`server/mod.rs`) and the connection slots (`server/slots.rs`).

use std::sync::atomic::AtomicU64;

gvfs_nfs::counters! {
    /// What happened to connections, for `gvfsctl status`.
    pub struct ConnCounters => ConnCounts {
        /// Connections accepted since start.
        accepted,
        /// Connections closed for exceeding a record cap.
        closed_oversized,
        /// TLS connections established (on a TLS port or after STARTTLS).
        tls_accepted,
        /// Connections refused: failed handshakes, bad or missing
        /// certificates, plain RPC on a TLS port, TLS on a plain port.
        tls_refused,
        /// Plain connections upgraded by the RFC 9289 STARTTLS probe.
        starttls,
        /// Pending connections closed to admit a newer one (the oldest
        /// first).
        evicted_pending,
        /// Served connections closed, idle, to make room for a new one.
        evicted_idle,
        /// New connections that waited for a slot: every served one was
        /// busy.
        slot_waits,
        /// Connections closed by a timeout: no first call, a record begun
        /// and not finished, or idle.
        timed_out,
    }
}

/// Connection gauges and counters.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections open now that are not yet through their first call or
    /// TLS handshake.
    pub pending: AtomicU64,
    /// What happened to connections.
    pub counts: ConnCounters,
}
