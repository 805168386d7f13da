//! The one error type of the crate: every message is one line and names the
//! file (or the peer) it is about.

use std::io;
use std::path::PathBuf;

/// What went wrong while making, loading or using certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// A file that should exist does not.
    #[error("{}: no such file", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("{}: cannot read: {cause}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: io::Error,
    },
    /// A file is larger than any PEM file we expect.
    #[error("{}: too large for a PEM file ({size} bytes, at most {limit})", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The largest size accepted.
        limit: u64,
    },
    /// A file holds no PEM section of the kind wanted, or malformed PEM.
    #[error("{}: not a PEM {what} file ({detail})", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What it should hold ("certificate", "private key").
        what: &'static str,
        /// What the PEM parser said.
        detail: String,
    },
    /// A certificate that does not parse as X.509.
    #[error("{}: not a valid X.509 certificate: {detail}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A private key that the crypto provider cannot use.
    #[error("{}: unusable private key: {detail}", path.display())]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The private key is not the one the certificate was issued for.
    #[error("{}: private key does not match the certificate {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// The certificate was not issued by the CA we trust.
    #[error("{}: not signed by the CA in {}", cert.display(), ca.display())]
    NotSignedByCa {
        /// The certificate file.
        cert: PathBuf,
        /// The CA file.
        ca: PathBuf,
    },
    /// The certificate's validity has ended.
    #[error("{}: certificate expired on {not_after}", path.display())]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// When it expired, as text.
        not_after: String,
    },
    /// The certificate's validity has not begun.
    #[error("{}: certificate not valid before {not_before}", path.display())]
    NotYetValid {
        /// The certificate file.
        path: PathBuf,
        /// When it becomes valid, as text.
        not_before: String,
    },
    /// The certificate chains to the CA but is not fit for use (wrong key
    /// usage, a CA certificate used as a node certificate, ...).
    #[error("{}: certificate rejected: {detail}", path.display())]
    CertificateRejected {
        /// The certificate file.
        path: PathBuf,
        /// What the verifier said.
        detail: String,
    },
    /// The certificate carries no name (no CN, DNS or IP SAN) to identify us.
    #[error("{}: certificate has no name (no subject CN, DNS or IP SAN)", path.display())]
    Nameless {
        /// The certificate file.
        path: PathBuf,
    },
    /// Refused to overwrite an existing file.
    #[error("{}: already exists; refusing to overwrite it", path.display())]
    AlreadyExists {
        /// The file.
        path: PathBuf,
    },
    /// A file or directory could not be written.
    #[error("{}: cannot write: {cause}", path.display())]
    Unwritable {
        /// The file or directory.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: io::Error,
    },
    /// rcgen could not build or sign a certificate.
    #[error("cannot create the certificate for {name:?}: {cause}")]
    Generate {
        /// The certificate's name.
        name: String,
        /// What rcgen said (part of the message, so not also a `source`).
        cause: rcgen::Error,
    },
    /// A node or CA name that cannot be used.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A server name (for certificate verification) that is neither a DNS
    /// name nor an IP address.
    #[error("invalid TLS server name {0:?}: not a DNS name or an IP address")]
    InvalidServerName(String),
    /// A validity period of zero days, or one that ends before it begins.
    #[error("invalid validity period: {0}")]
    InvalidValidity(String),
    /// rustls refused to build a configuration from our files.
    #[error("{}: cannot set up TLS: {detail}", path.display())]
    Config {
        /// The file at fault (the CA or the certificate).
        path: PathBuf,
        /// What rustls said.
        detail: String,
    },
}

/// The forms a peer mapping takes, for messages.
const MAPPING_FORMS: &str = "fixed:UID:GID, range:FIRST-LAST, pass or squash";

/// Why a peer mapping (`fixed:UID:GID`, `range:FIRST-LAST`, `pass`,
/// `squash`) or a peer rule (`NAME=MAPPING`) was refused. Every message
/// starts with the text refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MappingError {
    /// Not one of the mapping kinds.
    #[error("{text:?}: unknown mapping; expected {MAPPING_FORMS}")]
    UnknownKind {
        /// The mapping.
        text: String,
    },
    /// A known kind that lacks its parts.
    #[error("{text:?}: expected {expected}")]
    Malformed {
        /// The mapping.
        text: String,
        /// The form it should have.
        expected: &'static str,
    },
    /// A uid, gid or range end that is not a 32-bit unsigned number.
    #[error("{text:?}: {what} {value:?} is not a number from 0 to 4294967295")]
    BadId {
        /// The mapping.
        text: String,
        /// Which id ("uid", "gid", "first id", "last id").
        what: &'static str,
        /// What stands there.
        value: String,
    },
    /// A range whose first id is above its last.
    #[error("{text:?}: the range is empty ({first} > {last})")]
    EmptyRange {
        /// The mapping.
        text: String,
        /// Its first id.
        first: u32,
        /// Its last id.
        last: u32,
    },
    /// A rule with no `=` between the peer's name and its mapping.
    #[error("{text:?}: expected NAME=MAPPING (expected {MAPPING_FORMS})")]
    NotARule {
        /// The rule.
        text: String,
    },
    /// A rule with no peer name before the `=`.
    #[error("{text:?}: the peer name is empty")]
    EmptyName {
        /// The rule.
        text: String,
    },
}
