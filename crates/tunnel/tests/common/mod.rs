//! A throw-away site: a CA in a temporary directory and node certificates
//! signed by it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gvfs_tunnel::pki::{self, IssueOptions};
use gvfs_tunnel::{TlsFiles, TlsIdentity};

pub(crate) struct Site {
    pub(crate) dir: tempfile::TempDir,
}

impl Site {
    /// A new site CA in a fresh temporary directory.
    pub(crate) fn new(name: &str) -> Site {
        let dir = tempfile::tempdir().expect("temporary directory");
        pki::init_ca(&dir.path().join("ca"), name, 30).expect("init_ca");
        Site { dir }
    }

    pub(crate) fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }

    pub(crate) fn ca_pem(&self) -> PathBuf {
        self.ca_dir().join("ca.pem")
    }

    pub(crate) fn issue_with(&self, opts: &IssueOptions) -> TlsFiles {
        let out = self.dir.path().join("nodes");
        let (cert, key) = pki::issue(&self.ca_dir(), &out, opts).expect("issue");
        TlsFiles {
            cert,
            key,
            ca: self.ca_pem(),
        }
    }

    /// A node certificate for `name`, valid for 127.0.0.1.
    pub(crate) fn issue(&self, name: &str) -> TlsFiles {
        let mut opts = IssueOptions::new(name, 1);
        opts.ips = vec!["127.0.0.1".parse().expect("an IP")];
        self.issue_with(&opts)
    }

    /// A node certificate for `name` that expired yesterday.
    pub(crate) fn issue_expired(&self, name: &str) -> TlsFiles {
        let now = SystemTime::now();
        let mut opts = IssueOptions::new(name, 1);
        opts.ips = vec!["127.0.0.1".parse().expect("an IP")];
        opts.not_before = Some(now - Duration::from_secs(10 * 86_400));
        opts.not_after = Some(now - Duration::from_secs(86_400));
        self.issue_with(&opts)
    }

    pub(crate) fn identity(&self, name: &str) -> TlsIdentity {
        TlsIdentity::load(&self.issue(name)).expect("load the identity")
    }
}

/// A CA file that trusts both sites (for a client whose own certificate
/// comes from a CA the server does not trust).
pub(crate) fn both_cas(dir: &Path, a: &Site, b: &Site) -> PathBuf {
    let mut pem = std::fs::read(a.ca_pem()).expect("read the CA");
    pem.extend(std::fs::read(b.ca_pem()).expect("read the CA"));
    let path = dir.join("both-cas.pem");
    std::fs::write(&path, pem).expect("write the CA file");
    path
}
