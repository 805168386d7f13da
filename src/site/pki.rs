//! A site's PKI: a CA made with `gvfsctl ca init` and certificates made
//! with `gvfsctl ca issue` (for IP 127.0.0.1), in a temporary directory.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::proxy::{ProxyArgs, gvfsctl_local};

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
    /// A CA (named as `gvfsctl ca init` names it) with a certificate for
    /// each of `names`.
    pub fn new(names: &[&str]) -> Result<Self> {
        let pki = Self::init(None)?;
        for name in names {
            pki.issue(name)?;
        }
        Ok(pki)
    }

    /// A CA whose own certificate is named `ca_name`, with no certificate
    /// issued yet: another site's CA, say.
    pub fn named(ca_name: &str) -> Result<Self> {
        Self::init(Some(ca_name))
    }

    fn init(ca_name: Option<&str>) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("gvfs-site-pki-")
            .tempdir()?;
        let ca = dir.path().join("ca");
        let ca_s = ca.display().to_string();
        let mut args = vec!["ca", "init", &ca_s];
        if let Some(name) = ca_name {
            args.extend(["--name", name]);
        }
        gvfsctl_local(&args)?;
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

    /// Issues a certificate for `name` that expired yesterday.
    pub fn issue_expired(&self, name: &str) -> Result<()> {
        let day = Duration::from_secs(86_400);
        gvfs_tunnel::pki::issue(
            &self.ca,
            &self.ca,
            &gvfs_tunnel::pki::IssueOptions {
                name: name.to_string(),
                ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
                dns: Vec::new(),
                days: 1,
                not_before: Some(SystemTime::now() - 3 * day),
                not_after: Some(SystemTime::now() - day),
            },
        )?;
        Ok(())
    }

    /// `name`'s certificate, key and the CA's certificate.
    pub fn files(&self, name: &str) -> gvfs_tunnel::TlsFiles {
        gvfs_tunnel::TlsFiles {
            cert: self.ca.join(format!("{name}.pem")),
            key: self.ca.join(format!("{name}-key.pem")),
            ca: self.ca.join("ca.pem"),
        }
    }

    /// `args` with `--cert --key --ca` for `name`.
    pub fn args(&self, name: &str, args: ProxyArgs) -> ProxyArgs {
        let f = self.files(name);
        args.tls_files(&f.cert, &f.key, &f.ca)
    }
}
