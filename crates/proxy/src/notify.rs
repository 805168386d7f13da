//! systemd's readiness protocol (sd_notify(3)), for units with
//! `Type=notify`: `READY=1` once every listener is bound and the upstream
//! answered, `STOPPING=1` when shutdown begins; sent with the `sd-notify`
//! crate to the socket named in `$NOTIFY_SOCKET` (a path or an `@abstract`
//! name). Without that variable (not started by systemd, or not
//! `Type=notify`) nothing is sent. A message that cannot be sent is logged
//! and otherwise ignored: serving goes on, and systemd's start timeout says
//! the rest. `tests/deploy.rs` checks both messages from a running proxy.

pub use sd_notify::NotifyState;

/// The variable systemd names its socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `states` to `$NOTIFY_SOCKET`, if set. Returns whether they were
/// sent.
pub fn notify(states: &[NotifyState]) -> bool {
    if std::env::var_os(NOTIFY_SOCKET).is_none() {
        return false;
    }
    match sd_notify::notify(states) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot notify systemd of {states:?}");
            false
        }
    }
}
