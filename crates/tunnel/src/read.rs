//! Reading and writing the PEM files, with errors that name the file.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;

use crate::error::TunnelError;

/// The largest PEM file we read: a chain of a few certificates and a key is a
/// few KiB, so anything near this is the wrong file.
pub(crate) const MAX_PEM_FILE: u64 = 1 << 20;

/// Reads a whole (small) file.
pub(crate) fn read_small(path: &Path) -> Result<Vec<u8>, TunnelError> {
    let file = fs::File::open(path).map_err(|e| open_error(path, e))?;
    let size = file
        .metadata()
        .map_err(|cause| TunnelError::Unreadable {
            path: path.to_owned(),
            cause,
        })?
        .len();
    if size > MAX_PEM_FILE {
        return Err(TunnelError::TooLarge {
            path: path.to_owned(),
            size,
            limit: MAX_PEM_FILE,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_PEM_FILE)
        .read_to_end(&mut bytes)
        .map_err(|cause| TunnelError::Unreadable {
            path: path.to_owned(),
            cause,
        })?;
    Ok(bytes)
}

fn open_error(path: &Path, e: io::Error) -> TunnelError {
    if e.kind() == io::ErrorKind::NotFound {
        TunnelError::Missing {
            path: path.to_owned(),
        }
    } else {
        TunnelError::Unreadable {
            path: path.to_owned(),
            cause: e,
        }
    }
}

fn not_pem(path: &Path, what: &'static str, e: pem::Error) -> TunnelError {
    let detail = match e {
        pem::Error::NoItemsFound => match what {
            "certificate" => "no CERTIFICATE section found".to_owned(),
            _ => "no PRIVATE KEY section found".to_owned(),
        },
        other => other.to_string(),
    };
    TunnelError::NotPem {
        path: path.to_owned(),
        what,
        detail,
    }
}

/// Every certificate in a PEM file, in order; at least one.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TunnelError> {
    let bytes = read_small(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(path, "certificate", e))?;
    if certs.is_empty() {
        return Err(not_pem(path, "certificate", pem::Error::NoItemsFound));
    }
    for cert in &certs {
        parse_x509(path, cert)?;
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TunnelError> {
    let bytes = read_small(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| not_pem(path, "private key", e))
}

/// The parsed form of a certificate read from `path`.
pub(crate) fn parse_x509<'a>(
    path: &Path,
    der: &'a CertificateDer<'_>,
) -> Result<X509Certificate<'a>, TunnelError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(TunnelError::BadCertificate {
            path: path.to_owned(),
            detail: "trailing bytes after the certificate".to_owned(),
        }),
        Err(e) => Err(TunnelError::BadCertificate {
            path: path.to_owned(),
            detail: e.to_string(),
        }),
    }
}

/// Fails if `path` exists (or cannot be checked).
pub(crate) fn refuse_existing(path: &Path) -> Result<(), TunnelError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Err(TunnelError::AlreadyExists {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(TunnelError::Unreadable {
            path: path.to_owned(),
            cause,
        }),
    }
}

/// Creates `dir` (and its parents) with mode 0700 if it does not exist;
/// an existing directory keeps its mode.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), TunnelError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|cause| TunnelError::Unwritable {
            path: dir.to_owned(),
            cause,
        })
}

/// Writes a new file with `mode`, never replacing an existing one, and syncs it.
pub(crate) fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), TunnelError> {
    let unwritable = |cause| TunnelError::Unwritable {
        path: path.to_owned(),
        cause,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                TunnelError::AlreadyExists {
                    path: path.to_owned(),
                }
            } else {
                unwritable(e)
            }
        })?;
    file.write_all(contents).map_err(unwritable)?;
    file.sync_all().map_err(unwritable)
}
