//! Which proxy gvfsctl talks to: the control socket named with
//! `--control`, else the only live one found.

use std::path::PathBuf;

use anyhow::bail;

/// The control socket `given` with `--control`, else the only live one in
/// the runtime directory; fails when there is none or several.
pub(super) fn control_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let found = gvfs_proxy::control::discover();
    let list = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match found.live.as_slice() {
        [one] => Ok(one.clone()),
        [] if !found.stale.is_empty() => bail!(
            "no running gvfs-proxy found (stale control sockets: {}; a proxy started on the same \
             address replaces its socket) (start one, or pass --control PATH)",
            list(&found.stale)
        ),
        [] => bail!(
            "no running gvfs-proxy found in {} (start one, or pass --control PATH)",
            gvfs_proxy::config::runtime_dir().display()
        ),
        many => bail!(
            "several proxies are running; pick one with --control: {}",
            list(many)
        ),
    }
}
