//! Why a configuration was refused.

use std::path::PathBuf;

use gvfs_upstream::UrlError;

/// A bad configuration value, described in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The config file is not valid TOML for these settings.
    #[error("bad config file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A value is out of range or malformed.
    #[error("{0}")]
    Invalid(String),
    /// The upstream URL is malformed.
    #[error(transparent)]
    Upstream(#[from] UrlError),
}
