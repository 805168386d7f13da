//! The site CA and node certificates, made with rcgen.
//!
//! A site has one CA (`ca.pem`, `ca-key.pem`) kept by whoever runs
//! `gvfsctl ca`. Each proxy gets a node certificate (`NAME.pem`,
//! `NAME-key.pem`) whose subject CN is its name: that name is the identity an
//! image server maps to a uid/gid ([`crate::identity`]). Node certificates
//! carry both the serverAuth and the clientAuth extended key usage, because a
//! middle proxy serves its clients and connects to its upstream with the same
//! certificate. Keys are ECDSA P-256 and written with mode 0600; no file is
//! ever overwritten.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::DnsName;
use time::OffsetDateTime;

use crate::error::TunnelError;
use crate::read;

/// The CA certificate's file name inside a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA key's file name inside a CA directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";

/// How far back a new certificate's validity starts, so that a peer whose
/// clock is a little behind ours accepts it at once.
const BACKDATE: Duration = Duration::from_secs(3600);

const DAY: Duration = Duration::from_secs(86_400);

/// What to put in a node certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueOptions {
    /// The node's name: the subject CN, the file name stem, and a DNS SAN
    /// when it is a valid DNS name (an IP SAN when it is an IP address).
    pub name: String,
    /// IP addresses the node is reached at (IP SANs).
    pub ips: Vec<IpAddr>,
    /// DNS names the node is reached at (DNS SANs).
    pub dns: Vec<String>,
    /// Validity in days from now (ignored where `not_after` is given).
    pub days: u32,
    /// Start of validity instead of an hour ago (for tests).
    pub not_before: Option<SystemTime>,
    /// End of validity instead of `days` from now (for tests).
    pub not_after: Option<SystemTime>,
}

impl IssueOptions {
    /// Options for `name` valid for `days` days, with no extra SANs.
    pub fn new(name: impl Into<String>, days: u32) -> Self {
        Self {
            name: name.into(),
            ips: Vec::new(),
            dns: Vec::new(),
            days,
            not_before: None,
            not_after: None,
        }
    }
}

/// Creates DIR/ca.pem and DIR/ca-key.pem (key 0600, DIR created 0700 if
/// missing) for a new site CA named `common_name`, valid for `days` days.
/// Refuses to overwrite existing files. Returns the certificate's path.
pub fn init_ca(dir: &Path, common_name: &str, days: u32) -> Result<PathBuf, TunnelError> {
    if common_name.trim().is_empty() {
        return Err(TunnelError::InvalidName {
            name: common_name.to_owned(),
            reason: "a CA needs a non-empty name",
        });
    }
    let (not_before, not_after) = validity(days, None, None)?;
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    read::refuse_existing(&cert_path)?;
    read::refuse_existing(&key_path)?;

    let generate = |cause| TunnelError::Generate {
        name: common_name.to_owned(),
        cause,
    };
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    // Path length 0: the CA signs node certificates only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.self_signed(&key).map_err(generate)?;

    read::create_private_dir(dir)?;
    read::write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    read::write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(ca = %cert_path.display(), name = common_name, days, "created a site CA");
    Ok(cert_path)
}

/// Signs a node certificate with the CA in `ca_dir` and writes
/// OUT/NAME.pem and OUT/NAME-key.pem (key 0600, OUT created 0700 if
/// missing), refusing to overwrite. The certificate has CN=NAME; its SANs are
/// `dns` (plus NAME as a DNS SAN if it is a valid DNS name, or as an IP SAN
/// if it is an IP address) and `ips`; it is usable for both serverAuth and
/// clientAuth. Returns (certificate path, key path).
pub fn issue(
    ca_dir: &Path,
    out_dir: &Path,
    opts: &IssueOptions,
) -> Result<(PathBuf, PathBuf), TunnelError> {
    let name = opts.name.as_str();
    check_node_name(name)?;
    let (not_before, not_after) = validity(opts.days, opts.not_before, opts.not_after)?;
    let sans = subject_alt_names(opts)?;
    let cert_path = out_dir.join(format!("{name}.pem"));
    let key_path = out_dir.join(format!("{name}-key.pem"));
    read::refuse_existing(&cert_path)?;
    read::refuse_existing(&key_path)?;

    let ca_cert_path = ca_dir.join(CA_CERT_FILE);
    let ca_key_path = ca_dir.join(CA_KEY_FILE);
    let ca_certs = read::certificates(&ca_cert_path)?;
    let ca_cert = &ca_certs[0];
    let ca_key_pem =
        String::from_utf8(read::read_small(&ca_key_path)?).map_err(|_| TunnelError::NotPem {
            path: ca_key_path.clone(),
            what: "private key",
            detail: "not text".to_owned(),
        })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| TunnelError::BadKey {
        path: ca_key_path.clone(),
        detail: e.to_string(),
    })?;
    let parsed = read::parse_x509(&ca_cert_path, ca_cert)?;
    if !parsed.is_ca() {
        return Err(TunnelError::CertificateRejected {
            path: ca_cert_path,
            detail: "not a CA certificate (basicConstraints CA is not set)".to_owned(),
        });
    }
    if parsed.public_key().subject_public_key.data.as_ref() != ca_key.public_key_raw() {
        return Err(TunnelError::KeyMismatch {
            key: ca_key_path,
            cert: ca_cert_path,
        });
    }
    let ca_not_after = parsed.validity().not_after.to_datetime();
    if ca_not_after < OffsetDateTime::now_utc() {
        return Err(TunnelError::Expired {
            path: ca_cert_path,
            not_after: parsed.validity().not_after.to_string(),
        });
    }
    if not_after > ca_not_after {
        tracing::warn!(
            ca = %ca_cert_path.display(),
            ca_not_after = %parsed.validity().not_after,
            "the node certificate outlives the CA: it stops working when the CA expires"
        );
    }
    let generate = |cause| TunnelError::Generate {
        name: name.to_owned(),
        cause,
    };
    let issuer =
        Issuer::from_ca_cert_der(ca_cert, ca_key).map_err(|e| TunnelError::BadCertificate {
            path: ca_cert_path.clone(),
            detail: e.to_string(),
        })?;

    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;

    read::create_private_dir(out_dir)?;
    read::write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    read::write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_path.display(), name, "issued a node certificate");
    Ok((cert_path, key_path))
}

/// A node name becomes a file name and a certificate CN: letters, digits,
/// '.', '-', '_' and '@', starting with a letter or digit.
fn check_node_name(name: &str) -> Result<(), TunnelError> {
    let invalid = |reason| {
        Err(TunnelError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("a node needs a non-empty name");
    }
    if name.len() > 64 {
        return invalid("longer than 64 bytes (the limit of a certificate CN)");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return invalid("must start with a letter or a digit");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
    {
        return invalid("only letters, digits, '.', '-', '_' and '@' are allowed");
    }
    Ok(())
}

/// The SANs of a node certificate, without duplicates: DNS names first, then
/// IP addresses.
fn subject_alt_names(opts: &IssueOptions) -> Result<Vec<SanType>, TunnelError> {
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for d in &opts.dns {
        if DnsName::try_from(d.as_str()).is_err() {
            return Err(TunnelError::InvalidName {
                name: d.clone(),
                reason: "not a valid DNS name",
            });
        }
        dns.insert(d.to_ascii_lowercase());
    }
    ips.extend(opts.ips.iter().copied());
    if let Ok(ip) = opts.name.parse::<IpAddr>() {
        ips.insert(ip);
    } else if DnsName::try_from(opts.name.as_str()).is_ok() {
        dns.insert(opts.name.to_ascii_lowercase());
    }
    let mut sans = Vec::with_capacity(dns.len() + ips.len());
    for d in dns {
        let ia5 = d
            .as_str()
            .try_into()
            .map_err(|_| TunnelError::InvalidName {
                name: d.clone(),
                reason: "not a valid DNS name",
            })?;
        sans.push(SanType::DnsName(ia5));
    }
    sans.extend(ips.into_iter().map(SanType::IpAddress));
    Ok(sans)
}

/// The validity period: `not_before` (default an hour ago) to `not_after`
/// (default `days` days from now).
fn validity(
    days: u32,
    not_before: Option<SystemTime>,
    not_after: Option<SystemTime>,
) -> Result<(OffsetDateTime, OffsetDateTime), TunnelError> {
    let now = SystemTime::now();
    let start = not_before.unwrap_or_else(|| now.checked_sub(BACKDATE).unwrap_or(now));
    let end = match not_after {
        Some(t) => t,
        None => {
            if days == 0 {
                return Err(TunnelError::InvalidValidity(
                    "a certificate must be valid for at least one day".to_owned(),
                ));
            }
            DAY.checked_mul(days)
                .and_then(|d| now.checked_add(d))
                .ok_or_else(|| TunnelError::InvalidValidity(format!("{days} days is too long")))?
        }
    };
    if end <= start {
        return Err(TunnelError::InvalidValidity(
            "the certificate would expire before it becomes valid".to_owned(),
        ));
    }
    let start = x509_time(start).ok_or_else(|| {
        TunnelError::InvalidValidity("the start is outside the years 1 to 9999".into())
    })?;
    let end = x509_time(end).ok_or_else(|| {
        TunnelError::InvalidValidity(format!(
            "the end ({days} days) is outside the years 1 to 9999"
        ))
    })?;
    Ok((start, end))
}

/// `t` in whole seconds, if X.509 can express it (GeneralizedTime has a
/// four-digit year).
fn x509_time(t: SystemTime) -> Option<OffsetDateTime> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).ok()?,
        Err(before) => i64::try_from(before.duration().as_secs())
            .ok()?
            .checked_neg()?,
    };
    OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .filter(|t| (1..=9999).contains(&t.year()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        for ok in ["node1", "lab-proxy.example.org", "10.0.0.5", "a_b@site"] {
            assert!(check_node_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "../etc",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(check_node_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sans_include_the_name_and_no_duplicates() {
        let mut opts = IssueOptions::new("Node1", 1);
        opts.dns = vec!["node1".into(), "b.example".into()];
        opts.ips = vec!["127.0.0.1".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        let sans = subject_alt_names(&opts).unwrap();
        assert_eq!(sans.len(), 3, "{sans:?}");

        let ip_named = IssueOptions::new("10.1.2.3", 1);
        let sans = subject_alt_names(&ip_named).unwrap();
        assert_eq!(sans, vec![SanType::IpAddress("10.1.2.3".parse().unwrap())]);

        let mut bad = IssueOptions::new("n", 1);
        bad.dns = vec!["not a name".into()];
        assert!(subject_alt_names(&bad).is_err());
    }

    #[test]
    fn validity_periods() {
        assert!(validity(0, None, None).is_err());
        assert!(validity(u32::MAX, None, None).is_err());
        let (a, b) = validity(1, None, None).unwrap();
        assert!(b - a > time::Duration::hours(24));
        let past = SystemTime::now() - DAY;
        assert!(validity(1, Some(SystemTime::now()), Some(past)).is_err());
    }
}
