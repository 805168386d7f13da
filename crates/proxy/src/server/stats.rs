//! The server edge's connection counters, kept by the accept loop
//! (`server/mod.rs`) and the connection slots (`server/slots.rs`).

use std::sync::atomic::AtomicU64;

/// Connection counters.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Connections closed for exceeding a record cap.
    pub oversized: AtomicU64,
    /// TLS connections established (on a TLS port or after STARTTLS).
    pub tls_accepted: AtomicU64,
    /// Connections refused: failed handshakes, bad or missing
    /// certificates, plain RPC on a TLS port, TLS on a plain port.
    pub tls_refused: AtomicU64,
    /// Plain connections upgraded by the RFC 9289 STARTTLS probe.
    pub starttls: AtomicU64,
    /// Connections open now that are not yet through their first call or
    /// TLS handshake.
    pub pending: AtomicU64,
    /// Such connections closed to admit a newer one (the oldest first).
    pub evicted_pending: AtomicU64,
    /// Served connections closed, idle, to make room for a new one.
    pub evicted_idle: AtomicU64,
    /// New connections that waited for a slot: every served one was busy.
    pub slot_waits: AtomicU64,
    /// Connections closed by a timeout: no first call, a record begun and
    /// not finished, or idle.
    pub timed_out: AtomicU64,
}
