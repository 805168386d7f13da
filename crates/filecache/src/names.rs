//! How a file-cache entry is named on disk and in the index: its file is
//! its handle in hex in the cache's directory, its frames `HEX.frames`
//! and, while it is partial, its progress log `HEX.progress` beside it,
//! its record under the index key `f` + handle.

use std::path::{Path, PathBuf};

/// The index key of a file-cache entry.
pub(crate) fn index_key(fh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + fh.len());
    k.push(b'f');
    k.extend_from_slice(fh);
    k
}

/// The name of a cached file: its handle in hex.
pub(crate) fn file_name(fh: &[u8]) -> String {
    fh.iter().map(|b| format!("{b:02x}")).collect()
}

/// The frame file beside a cached file (removed at open, as its name is not
/// a handle's).
pub(crate) fn frames_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".frames");
    PathBuf::from(p)
}

/// The progress log beside a partly fetched file (`progress.rs`; kept at
/// open only beside a file kept partial).
pub(crate) fn progress_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".progress");
    PathBuf::from(p)
}

/// The handle a cached file's name (or [`FileDedup::fh`]) spells in hex.
///
/// [`FileDedup::fh`]: crate::FileDedup::fh
pub fn parse_handle(name: &str) -> Option<Vec<u8>> {
    parse_name(name)
}

pub(crate) fn parse_name(name: &str) -> Option<Vec<u8>> {
    if !name.len().is_multiple_of(2) || name.len() > 128 {
        return None;
    }
    (0..name.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(name.get(i..i + 2)?, 16).ok())
        .collect()
}
