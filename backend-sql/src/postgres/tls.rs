//! TLS for PostgreSQL connections: rustls with the ring provider, configured from `sslmode` and
//! `sslrootcert` with libpq's meanings.

use std::sync::Arc;

use headcount_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::{PostgresConfig, Roots, Verification};

/// The connector for `config`. tokio-postgres only uses it when the mode asks for TLS, so
/// `sslmode=disable` gets a (never used) non-verifying one to keep a single connector type.
pub(crate) fn connector(config: &PostgresConfig) -> Result<MakeRustlsConnect> {
    // An explicit provider, so the process-wide default (which another crate may set to aws-lc,
    // or leave unset) does not matter.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match config.verification() {
        Verification::None => Arc::new(EncryptOnly {
            provider: provider.clone(),
        }),
        Verification::Chain => Arc::new(ChainOnly {
            inner: webpki_verifier(config, &provider)?,
        }),
        Verification::Full => webpki_verifier(config, &provider)?,
    };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("cannot set up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

fn webpki_verifier(
    config: &PostgresConfig,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    let mut roots = RootCertStore::empty();
    match config.roots() {
        Roots::Bundled => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::File(path) => {
            let unreadable = |e: &dyn std::fmt::Display| {
                Error::config(format!("cannot read sslrootcert `{}`: {e}", path.display()))
            };
            let certs = CertificateDer::pem_file_iter(&path)
                .map_err(|e| unreadable(&e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable(&e))?;
            if certs.is_empty() {
                return Err(unreadable(&"no PEM certificate in the file"));
            }
            let (_, ignored) = roots.add_parsable_certificates(certs);
            if roots.is_empty() {
                return Err(unreadable(&format!(
                    "none of its {ignored} certificates could be parsed"
                )));
            }
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| Error::config(format!("cannot set up TLS verification: {e}")))
}

/// `sslmode=prefer|require`: any certificate is accepted, as libpq does in these modes. The
/// handshake signatures are still checked, so the session is encrypted to whoever holds the key
/// of the certificate presented; what is not checked is who that is.
#[derive(Debug)]
struct EncryptOnly {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to a trusted root, but the certificate need not name
/// the host (libpq's meaning, useful when connecting by an address the certificate does not list).
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // webpki checks the chain before the name, so a name mismatch means the chain is good.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn connectors_build_for_every_mode() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let config =
                PostgresConfig::from_url(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
            assert!(connector(&config).is_ok(), "{mode}");
        }
    }

    #[test]
    fn a_bad_root_file_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for path in [missing, empty] {
            let config = PostgresConfig::from_url(&format!(
                "postgres://u:pw@h/db?sslmode=verify-full&sslrootcert={}",
                path.display()
            ))
            .unwrap();
            let err = connector(&config).err().unwrap();
            assert_eq!(err.kind(), headcount_core::ErrorKind::Config);
            assert!(err.to_string().contains("sslrootcert"), "{err}");
        }
    }
}
