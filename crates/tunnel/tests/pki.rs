//! Making a site CA and node certificates, and loading them back.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Site;
use gvfs_tunnel::pki::{self, IssueOptions};
use gvfs_tunnel::{TlsFiles, TlsIdentity, TunnelError, peer_name};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("test setup").permissions().mode() & 0o777
}

#[test]
fn init_ca_and_issue_make_private_files_and_never_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let ca_dir = tmp.path().join("site/ca");
    let ca = pki::init_ca(&ca_dir, "test site CA", 10).unwrap();
    assert_eq!(ca, ca_dir.join("ca.pem"));
    assert!(ca.is_file());
    assert_eq!(mode(&ca_dir), 0o700);
    assert_eq!(mode(&ca_dir.join("ca-key.pem")), 0o600);
    let ca_bytes = fs::read(&ca).unwrap();
    let ca_cert = CertificateDer::from_pem_slice(&ca_bytes).unwrap();
    assert_eq!(peer_name(&ca_cert).as_deref(), Some("test site CA"));

    let again = pki::init_ca(&ca_dir, "another", 10).unwrap_err();
    assert!(
        matches!(again, TunnelError::AlreadyExists { .. }),
        "{again}"
    );
    assert!(again.to_string().contains("ca.pem"), "{again}");
    assert_eq!(fs::read(&ca).unwrap(), ca_bytes, "the CA was overwritten");

    let out = tmp.path().join("nodes");
    let (cert, key) = pki::issue(&ca_dir, &out, &IssueOptions::new("node1", 5)).unwrap();
    assert_eq!(cert, out.join("node1.pem"));
    assert_eq!(key, out.join("node1-key.pem"));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&out), 0o700);
    let cert_bytes = fs::read(&cert).unwrap();

    let again = pki::issue(&ca_dir, &out, &IssueOptions::new("node1", 5)).unwrap_err();
    assert!(
        matches!(again, TunnelError::AlreadyExists { .. }),
        "{again}"
    );
    assert!(again.to_string().contains("node1.pem"), "{again}");
    assert_eq!(
        fs::read(&cert).unwrap(),
        cert_bytes,
        "the node cert was overwritten"
    );

    // By default a node's files go next to the CA's, as gvfsctl does.
    let (cert2, _) = pki::issue(&ca_dir, &ca_dir, &IssueOptions::new("node2", 5)).unwrap();
    assert_eq!(cert2, ca_dir.join("node2.pem"));

    let identity = TlsIdentity::load(&TlsFiles { cert, key, ca }).unwrap();
    assert_eq!(identity.name(), "node1");
}

#[test]
fn issue_refuses_bad_input() {
    let site = Site::new("site");
    let out = site.dir.path().join("out");
    for bad in ["", "../escape", "a/b", ".hidden", "ca key"] {
        let err = pki::issue(&site.ca_dir(), &out, &IssueOptions::new(bad, 1)).unwrap_err();
        assert!(
            matches!(err, TunnelError::InvalidName { .. }),
            "{bad:?}: {err}"
        );
    }
    let err = pki::issue(&site.ca_dir(), &out, &IssueOptions::new("n", 0)).unwrap_err();
    assert!(matches!(err, TunnelError::InvalidValidity(_)), "{err}");
    let mut opts = IssueOptions::new("n", 1);
    opts.dns = vec!["bad name".into()];
    let err = pki::issue(&site.ca_dir(), &out, &opts).unwrap_err();
    assert!(matches!(err, TunnelError::InvalidName { .. }), "{err}");

    let missing = site.dir.path().join("no-such-ca");
    let err = pki::issue(&missing, &out, &IssueOptions::new("n", 1)).unwrap_err();
    assert!(matches!(err, TunnelError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("no-such-ca/ca.pem"), "{err}");

    // A CA key that is not the CA certificate's.
    let other = Site::new("other");
    fs::remove_file(site.ca_dir().join("ca-key.pem")).unwrap();
    fs::copy(
        other.ca_dir().join("ca-key.pem"),
        site.ca_dir().join("ca-key.pem"),
    )
    .unwrap();
    let err = pki::issue(&site.ca_dir(), &out, &IssueOptions::new("n", 1)).unwrap_err();
    assert!(matches!(err, TunnelError::KeyMismatch { .. }), "{err}");
    assert!(!out.join("n.pem").exists());
}

#[test]
fn a_node_certificate_is_not_a_ca() {
    // Signing with a node certificate instead of the CA is refused.
    let site = Site::new("site");
    let node = site.issue("node");
    let fake_ca = site.dir.path().join("fake-ca");
    fs::create_dir(&fake_ca).unwrap();
    fs::copy(&node.cert, fake_ca.join("ca.pem")).unwrap();
    fs::copy(&node.key, fake_ca.join("ca-key.pem")).unwrap();
    let err = pki::issue(&fake_ca, &fake_ca, &IssueOptions::new("n", 1)).unwrap_err();
    assert!(err.to_string().contains("not a CA"), "{err}");
}

#[test]
fn load_names_the_missing_file() {
    let site = Site::new("site");
    let mut files = site.issue("node");
    files.key = site.dir.path().join("nope-key.pem");
    let err = TlsIdentity::load(&files).unwrap_err();
    assert!(matches!(err, TunnelError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("nope-key.pem"), "{err}");
    assert!(err.to_string().contains("no such file"), "{err}");
}

#[test]
fn load_names_the_file_that_is_not_pem() {
    let site = Site::new("site");
    let files = site.issue("node");
    let garbage = site.dir.path().join("garbage.pem");
    fs::write(&garbage, b"this is not a certificate\n").unwrap();
    for which in ["cert", "key", "ca"] {
        let mut bad = files.clone();
        match which {
            "cert" => bad.cert = garbage.clone(),
            "key" => bad.key = garbage.clone(),
            _ => bad.ca = garbage.clone(),
        }
        let err = TlsIdentity::load(&bad).unwrap_err();
        assert!(matches!(err, TunnelError::NotPem { .. }), "{which}: {err}");
        assert!(err.to_string().contains("garbage.pem"), "{which}: {err}");
    }
    // A key where the certificate should be.
    let swapped = TlsFiles {
        cert: files.key.clone(),
        ..files.clone()
    };
    let err = TlsIdentity::load(&swapped).unwrap_err();
    assert!(err.to_string().contains("no CERTIFICATE section"), "{err}");
    // A broken PEM body.
    fs::write(
        &garbage,
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let bad = TlsFiles {
        cert: garbage.clone(),
        ..files
    };
    let err = TlsIdentity::load(&bad).unwrap_err();
    assert!(err.to_string().contains("garbage.pem"), "{err}");
}

#[test]
fn load_refuses_a_key_that_does_not_match() {
    let site = Site::new("site");
    let one = site.issue("one");
    let two = site.issue("two");
    let files = TlsFiles {
        key: two.key.clone(),
        ..one
    };
    let err = TlsIdentity::load(&files).unwrap_err();
    assert!(matches!(err, TunnelError::KeyMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("two-key.pem") && msg.contains("one.pem"),
        "{msg}"
    );
}

#[test]
fn load_refuses_a_certificate_from_another_ca() {
    let site = Site::new("site");
    let other = Site::new("other");
    let files = TlsFiles {
        ca: other.ca_pem(),
        ..site.issue("node")
    };
    let err = TlsIdentity::load(&files).unwrap_err();
    assert!(matches!(err, TunnelError::NotSignedByCa { .. }), "{err}");
    assert!(err.to_string().contains("not signed by the CA"), "{err}");
}

#[test]
fn load_refuses_an_expired_certificate() {
    let site = Site::new("site");
    let files = site.issue_expired("old");
    let err = TlsIdentity::load(&files).unwrap_err();
    assert!(matches!(err, TunnelError::Expired { .. }), "{err}");
    assert!(
        err.to_string().contains("old.pem: certificate expired on"),
        "{err}"
    );
}

#[test]
fn sans_and_names() {
    let site = Site::new("site");
    let mut opts = IssueOptions::new("lab-proxy", 1);
    opts.dns = vec!["lab.example.org".into()];
    opts.ips = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    let files = site.issue_with(&opts);
    let identity = TlsIdentity::load(&files).unwrap();
    assert_eq!(identity.name(), "lab-proxy");
    // peer_name falls back to SANs only without a CN; our certs always have one.
    let der = CertificateDer::from_pem_file(&files.cert).unwrap();
    assert_eq!(peer_name(&der).as_deref(), Some("lab-proxy"));
    assert_eq!(peer_name(&CertificateDer::from(vec![1, 2, 3])), None);
}
