//! Which TLS failures are refusals rather than faults, said in words.
//!
//! A fatal alert from the server (it rejected our certificate, or the
//! handshake), or a server certificate we reject, will happen again on the
//! next connection: a client that retried would only wait out its
//! deadline and then report a timeout instead of the reason. A connection
//! reset or a timeout is not a refusal.

use std::io;

use rustls::{AlertDescription, CertificateError};

/// Why the server refused us, or we refused it, if `e` (from a client
/// handshake or from reading a client connection) says so.
pub fn refusal(e: &io::Error) -> Option<String> {
    match e.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(alert) => Some(match certificate_alert(*alert) {
            Some(why) => format!("the server rejected our certificate: {why}"),
            None => format!("the server refused the connection: TLS alert {alert:?}"),
        }),
        rustls::Error::InvalidCertificate(e) => Some(format!(
            "we rejected the server's certificate: {}",
            certificate_error(e)
        )),
        rustls::Error::NoCertificatesPresented => {
            Some("we rejected the server: it presented no certificate".into())
        }
        _ => None,
    }
}

/// The alerts (RFC 8446 section 6.2) a server sends about the client's
/// certificate, in words.
fn certificate_alert(alert: AlertDescription) -> Option<&'static str> {
    Some(match alert {
        AlertDescription::UnknownCA => "unknown CA",
        AlertDescription::BadCertificate => "bad certificate",
        AlertDescription::UnsupportedCertificate => "unsupported certificate",
        AlertDescription::CertificateRevoked => "certificate revoked",
        AlertDescription::CertificateExpired => "certificate expired",
        AlertDescription::CertificateUnknown => "certificate unknown",
        AlertDescription::CertificateRequired => "certificate required",
        AlertDescription::AccessDenied => "access denied",
        // What a server sends when our certificate names its CA as issuer
        // but that CA did not sign it: another CA of the same name.
        AlertDescription::DecryptError => {
            "its signature does not verify (signed by another CA of the same name?)"
        }
        _ => return None,
    })
}

fn certificate_error(e: &CertificateError) -> String {
    match e {
        CertificateError::UnknownIssuer => "not signed by our CA (unknown issuer)".into(),
        CertificateError::Expired => "expired".into(),
        CertificateError::NotValidYet => "not valid yet".into(),
        CertificateError::NotValidForName => "not valid for the name we dialled".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(e: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn alerts_and_rejected_certificates_are_refusals_in_words() {
        assert_eq!(
            refusal(&io(rustls::Error::AlertReceived(
                AlertDescription::UnknownCA
            )))
            .as_deref(),
            Some("the server rejected our certificate: unknown CA")
        );
        assert!(
            refusal(&io(rustls::Error::AlertReceived(
                AlertDescription::DecryptError
            )))
            .is_some_and(|r| r.starts_with("the server rejected our certificate: its signature"))
        );
        assert_eq!(
            refusal(&io(rustls::Error::AlertReceived(
                AlertDescription::HandshakeFailure
            )))
            .as_deref(),
            Some("the server refused the connection: TLS alert HandshakeFailure")
        );
        assert_eq!(
            refusal(&io(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            )))
            .as_deref(),
            Some("we rejected the server's certificate: not signed by our CA (unknown issuer)")
        );
        // Faults are not refusals.
        assert_eq!(refusal(&io::ErrorKind::ConnectionReset.into()), None);
        assert_eq!(refusal(&io(rustls::Error::DecryptError)), None);
    }
}
