//! The control socket: a Unix socket on which `gvfsctl` talks to a running
//! proxy. One request per connection, one JSON line each way:
//! `{"cmd":"status"}` -> `{"ok":true,"status":{...}}` or
//! `{"ok":false,"error":"..."}`.
//!
//! The socket is created with mode 0600; requests are capped at
//! [`MAX_REQUEST`] bytes and every read and write has a timeout.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

/// Longest request line accepted.
pub const MAX_REQUEST: u64 = 64 * 1024;
/// Longest reply line accepted by the client.
pub const MAX_REPLY: u64 = 16 * 1024 * 1024;
/// Per-request I/O timeout.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Another live proxy answers on this path.
    #[error("control socket {0} is in use by another running proxy; pass --control PATH")]
    InUse(PathBuf),
    /// Binding failed.
    #[error("cannot create control socket {path}: {cause}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The cause (part of the message, so not also a `source`).
        cause: io::Error,
    },
}

/// Why a proxy refused a control request; its text is the `"error"` of
/// the reply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The request line is not JSON.
    #[error("bad request: {0}")]
    BadRequest(serde_json::Error),
    /// The request names no command.
    #[error("request has no \"cmd\"")]
    NoCommand,
    /// The request names a command this proxy does not know.
    #[error(
        "unknown command {0:?}; this proxy knows: status, stats, writeback, flush, held_blocks, learned, unmount"
    )]
    UnknownCommand(String),
    /// A write-back or flush asked of a proxy with no block cache.
    #[error("this proxy has no block cache (start it with --cache-dir)")]
    NoBlockCache,
    /// A question about held blocks, or an end to learnings, asked of a
    /// proxy with no file cache.
    #[error("this proxy holds no whole files (start it with --cache-dir and metadata on)")]
    NoFileCache,
    /// An unmount asked of a proxy with no FUSE mount.
    #[error("this proxy has no FUSE mount (start it with --mount DIR)")]
    NoMount,
    /// A hand-over of a mount nothing keeps (`--mount-keep none`).
    #[error(
        "this proxy's FUSE mount is not kept (--mount-keep none): its stop unmounts; \
         stop it, then start the new proxy"
    )]
    MountNotKept,
    /// An unmount without `force` while files are open on the mount.
    #[error(
        "{0} files are open on the mount (guests map them); a stop now would only pause it. \
         `gvfsctl unmount --force` ends it, and its users get errors"
    )]
    FilesOpen(u64),
    /// A command's argument is missing or wrong.
    #[error("bad argument: {0}")]
    BadArgument(&'static str),
}

/// Why [`request`] got no result from a proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Nothing accepts connections on the control socket.
    #[error("cannot reach a proxy at {}: {cause} (is gvfs-proxy running?)", path.display())]
    Unreachable {
        /// The control socket.
        path: PathBuf,
        /// The cause (part of the message, so not also a `source`).
        cause: io::Error,
    },
    /// The connection failed while the request or its reply went over it.
    #[error("talking to the proxy at {}: {cause}", path.display())]
    Io {
        /// The control socket.
        path: PathBuf,
        /// The cause (part of the message, so not also a `source`).
        cause: io::Error,
    },
    /// The reply is not JSON.
    #[error("bad reply from proxy: {0}")]
    BadReply(serde_json::Error),
    /// No reply came in time.
    #[error("proxy at {} did not answer in {after:?}", path.display())]
    Timeout {
        /// The control socket.
        path: PathBuf,
        /// How long it waited.
        after: Duration,
    },
    /// The proxy refused the request; its words.
    #[error("{0}")]
    Refused(String),
}

/// Binds `path`, replacing a stale socket left by a proxy that died, but
/// never one a live proxy still answers on.
pub async fn bind(path: &Path) -> Result<UnixListener, ControlError> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(ControlError::InUse(path.to_path_buf()));
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let bind_err = |cause| ControlError::Bind {
        path: path.to_path_buf(),
        cause,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    Ok(listener)
}

/// Answers requests with `handler` until `shutdown`; removes the socket file
/// on the way out.
pub async fn serve<F>(
    listener: UnixListener,
    path: PathBuf,
    handler: F,
    shutdown: CancellationToken,
) where
    F: Fn(&Value) -> Result<Value, CommandError> + Send + Sync + 'static,
{
    let handler = std::sync::Arc::new(handler);
    while let Some((stream, _)) =
        crate::server::accept_until(|| listener.accept(), "control", &shutdown).await
    {
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(IO_TIMEOUT, answer(stream, &*handler)).await;
        });
    }
    let _ = std::fs::remove_file(&path);
}

async fn answer<F>(stream: UnixStream, handler: &F) -> io::Result<()>
where
    F: Fn(&Value) -> Result<Value, CommandError>,
{
    let (rd, mut wr) = stream.into_split();
    let mut line = String::new();
    BufReader::new(rd.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let result = serde_json::from_str::<Value>(&line)
        .map_err(CommandError::BadRequest)
        .and_then(|req| handler(&req));
    let reply = match result {
        Ok(v) => json!({"ok": true, "result": v}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    let mut out = reply.to_string();
    out.push('\n');
    wr.write_all(out.as_bytes()).await?;
    wr.shutdown().await
}

/// Sends one request to the proxy at `path` and returns its result.
pub async fn request(path: &Path, req: &Value) -> Result<Value, RequestError> {
    let io_error = |cause| RequestError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let io = async {
        let stream =
            UnixStream::connect(path)
                .await
                .map_err(|cause| RequestError::Unreachable {
                    path: path.to_path_buf(),
                    cause,
                })?;
        let (rd, mut wr) = stream.into_split();
        let mut out = req.to_string();
        out.push('\n');
        wr.write_all(out.as_bytes()).await.map_err(io_error)?;
        let mut line = String::new();
        BufReader::new(rd.take(MAX_REPLY))
            .read_line(&mut line)
            .await
            .map_err(io_error)?;
        serde_json::from_str::<Value>(&line).map_err(RequestError::BadReply)
    };
    let reply =
        tokio::time::timeout(IO_TIMEOUT, io)
            .await
            .map_err(|_| RequestError::Timeout {
                path: path.to_path_buf(),
                after: IO_TIMEOUT,
            })??;
    if reply["ok"].as_bool() == Some(true) {
        Ok(reply["result"].clone())
    } else {
        Err(RequestError::Refused(
            reply["error"]
                .as_str()
                .unwrap_or("proxy reported an unknown error")
                .to_string(),
        ))
    }
}

/// Control sockets found by [`discover`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Sockets a proxy accepts connections on.
    pub live: Vec<PathBuf>,
    /// Sockets nothing listens on any more: left by a proxy that was
    /// killed (the next proxy on the same address replaces it).
    pub stale: Vec<PathBuf>,
}

/// Control sockets of proxies in the default runtime dir.
pub fn discover() -> Discovered {
    discover_in(&crate::config::runtime_dir())
}

/// Control sockets (`gvfs-proxy-*.sock`) in `dir`, sorted, split into live
/// and stale by trying to connect. Sockets this user may not connect to
/// (another user's proxy) are left out.
pub fn discover_in(dir: &Path) -> Discovered {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gvfs-proxy-") && n.ends_with(".sock"))
        })
        .collect();
    found.sort();
    let mut out = Discovered::default();
    for path in found {
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(_) => out.live.push(path),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => out.stale.push(path),
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "control socket skipped"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn discovery_skips_stale_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("gvfs-proxy-127.0.0.1-1.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        std::fs::write(dir.path().join("gvfs-proxy-notes.txt"), b"").unwrap();
        assert_eq!(
            discover_in(dir.path()),
            Discovered {
                live: vec![],
                stale: vec![stale.clone()],
            }
        );

        let live = dir.path().join("gvfs-proxy-127.0.0.1-2.sock");
        let _listener = bind(&live).await.unwrap();
        assert_eq!(
            discover_in(dir.path()),
            Discovered {
                live: vec![live],
                stale: vec![stale],
            }
        );
    }
}
