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

pub use nfs::DEFAULT_EXPORT;

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

/// Why an `--upstream` URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// `dir:` with nothing after it.
    #[error("bad upstream {url:?}: dir: needs a path, e.g. dir:/srv/images")]
    DirWithoutPath {
        /// The URL given.
        url: String,
    },
    /// An `nfs://` URL that does not parse.
    #[error(transparent)]
    Nfs(nfs::BadUrl),
    /// A `gvfs://` URL that does not parse.
    #[error(transparent)]
    Gvfs(nfs::BadUrl),
    /// None of `dir:`, `nfs://` and `gvfs://`.
    #[error(
        "bad upstream {url:?}: expected dir:PATH, nfs://HOST[:PORT]/EXPORT[?mountport=N] \
         or gvfs://HOST:PORT[/EXPORT]"
    )]
    UnknownScheme {
        /// The URL given.
        url: String,
    },
}

impl std::str::FromStr for UpstreamUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        if let Some(path) = s.strip_prefix("dir:") {
            if path.is_empty() {
                return Err(UrlError::DirWithoutPath { url: s.to_string() });
            }
            return Ok(Self::Dir(PathBuf::from(path)));
        }
        if s.starts_with("nfs://") {
            return nfs::NfsUrl::parse(s).map(Self::Nfs).map_err(UrlError::Nfs);
        }
        if s.starts_with("gvfs://") {
            return nfs::GvfsUrl::parse(s)
                .map(Self::Gvfs)
                .map_err(UrlError::Gvfs);
        }
        Err(UrlError::UnknownScheme { url: s.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_errors_say_what_was_expected() {
        let e = |s: &str| s.parse::<UpstreamUrl>().unwrap_err().to_string();
        assert_eq!(
            e("dir:"),
            "bad upstream \"dir:\": dir: needs a path, e.g. dir:/srv/images"
        );
        assert_eq!(
            e("ftp://x"),
            "bad upstream \"ftp://x\": expected dir:PATH, \
             nfs://HOST[:PORT]/EXPORT[?mountport=N] or gvfs://HOST:PORT[/EXPORT]"
        );
        assert!(e("nfs://h").starts_with("bad nfs:// URL \"nfs://h\": "));
        assert!(e("gvfs://p/e").starts_with("bad gvfs:// URL \"gvfs://p/e\": "));
        assert_eq!(
            "dir:/srv".parse::<UpstreamUrl>(),
            Ok(UpstreamUrl::Dir(PathBuf::from("/srv")))
        );
    }
}
