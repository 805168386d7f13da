//! systemd's readiness protocol (sd_notify(3)), for units with
//! `Type=notify`: `READY=1` once every listener is bound and the upstream
//! answered, `STOPPING=1` when shutdown begins.
//!
//! A message is one datagram to the unix socket named in `$NOTIFY_SOCKET`
//! (a path, or `@NAME` for a name in the abstract namespace). Without that
//! variable (not started by systemd, or not `Type=notify`) nothing is sent.
//! A message that cannot be sent is logged and otherwise ignored: serving
//! goes on, and systemd's start timeout says the rest.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;

/// The variable systemd names its socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `state` (e.g. `"READY=1"`; several assignments separated by
/// newlines) to `$NOTIFY_SOCKET`, if set. Returns whether it was sent.
pub fn notify(state: &str) -> bool {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET) else {
        return false;
    };
    match notify_to(&socket, state) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(socket = ?socket, error = %e, "cannot notify systemd of {state:?}");
            false
        }
    }
}

/// Sends `state` to the notification socket `socket`: a path, or `@NAME`
/// for an abstract one (Linux).
pub fn notify_to(socket: &OsStr, state: &str) -> std::io::Result<()> {
    let out = UnixDatagram::unbound()?;
    let bytes = socket.as_encoded_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => send_abstract(&out, name, state),
        None if bytes.first() == Some(&b'/') => out.send_to(state.as_bytes(), socket).map(|_| ()),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path or an @abstract name",
        )),
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(out: &UnixDatagram, name: &[u8], state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    out.send_to_addr(state.as_bytes(), &addr).map(|_| ())
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract socket names are Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_state_reaches_a_socket_named_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        assert_eq!(received(&socket), "READY=1\nSTATUS=serving");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_state_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("gvfs-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        assert_eq!(received(&socket), "STOPPING=1");
    }

    #[test]
    fn a_relative_name_or_a_missing_socket_is_an_error() {
        assert!(notify_to(OsStr::new("notify.sock"), "READY=1").is_err());
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone.sock");
        assert!(notify_to(gone.as_os_str(), "READY=1").is_err());
    }
}
