//! What sits below a gvfs proxy, the bottom of its stack, chosen by URL:
//! `dir:PATH` ([`dir`]: a local directory, the embedded origin),
//! `nfs://HOST[:PORT]/EXPORT` ([`nfs`]: an NFSv3 server) or
//! `gvfs://HOST:PORT/EXPORT` (also [`nfs`]: another gvfs-proxy over TLS).
//! Each is a [`gvfs_nfs::NfsService`], so the layers above it neither know
//! nor care which one they talk to; [`UpstreamUrl`] parses the URL.
#![warn(missing_docs)]

pub mod dir;
pub mod nfs;

use std::path::PathBuf;

/// The default export name.
pub const DEFAULT_EXPORT: &str = "/export";

/// A parsed `--upstream` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamUrl {
    /// `dir:PATH`.
    Dir(PathBuf),
    /// `nfs://...`.
    Nfs(nfs::NfsUrl),
    /// `gvfs://...`.
    Gvfs(nfs::GvfsUrl),
}

impl std::str::FromStr for UpstreamUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("dir:") {
            if path.is_empty() {
                return Err(format!(
                    "bad upstream {s:?}: dir: needs a path, e.g. dir:/srv/images"
                ));
            }
            return Ok(Self::Dir(PathBuf::from(path)));
        }
        if s.starts_with("nfs://") {
            return nfs::NfsUrl::parse(s)
                .map(Self::Nfs)
                .map_err(|e| e.to_string());
        }
        if s.starts_with("gvfs://") {
            return nfs::GvfsUrl::parse(s)
                .map(Self::Gvfs)
                .map_err(|e| e.to_string());
        }
        Err(format!(
            "bad upstream {s:?}: expected dir:PATH, nfs://HOST[:PORT]/EXPORT[?mountport=N] \
             or gvfs://HOST:PORT[/EXPORT]"
        ))
    }
}
