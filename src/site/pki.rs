//! A site's PKI: a CA made with `gvfsctl ca init` and a certificate per
//! proxy (`gvfsctl ca issue`, for IP 127.0.0.1), in a temporary directory.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::proxy::{gvfsctl_local, site_ca};

/// A site CA and its proxies' certificates: `NAME.pem` and `NAME-key.pem`
/// beside `ca.pem` in [`Pki::ca_dir`], as [`ProxyArgs::tls`] reads them.
///
/// [`ProxyArgs::tls`]: crate::proxy::ProxyArgs::tls
#[derive(Debug)]
pub struct Pki {
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pki {
    /// A CA with a certificate for each of `names`.
    pub fn new(names: &[String]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("gvfs-site-pki-")
            .tempdir()?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let ca = site_ca(dir.path(), &names)?;
        Ok(Self { ca, _dir: dir })
    }

    /// The CA's directory (`ca.pem`, and each proxy's certificate).
    pub fn ca_dir(&self) -> &Path {
        &self.ca
    }

    /// Issues a certificate for `name` unless there is one.
    pub fn issue(&self, name: &str) -> Result<()> {
        if self.ca.join(format!("{name}.pem")).is_file() {
            return Ok(());
        }
        let ca = self.ca.display().to_string();
        gvfsctl_local(&[
            "ca",
            "issue",
            "--ca",
            &ca,
            "--name",
            name,
            "--ip",
            "127.0.0.1",
        ])?;
        Ok(())
    }
}
