//! TLS for the HTTP API: the server's certificate and key ([`Tls`], which
//! [`serve_tls`](crate::serve_tls) serves HTTPS with), and what forwarding between
//! instances trusts ([`client_config`]). rustls with the `ring` provider, chosen here
//! rather than installed process-wide, so that nothing depends on a global default.

pub use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a certificate or key file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file cannot be read, or is not PEM of the expected kind.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the certificates and key together (e.g. a key that does not match
    /// the certificate).
    #[error("{0}")]
    Config(String),
}

/// The server side: a certificate chain and its private key, ready to serve HTTPS.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// Reads the certificate chain (PEM, leaf first) and the private key (PEM: PKCS#8,
    /// PKCS#1 or SEC1) and checks that they belong together. HTTP/1.1 only (ALPN).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, Error> {
        let chain = certificates(cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, "a PEM private key", e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                Error::Config(format!(
                    "the certificate {} and the key do not make a server identity: {e}",
                    cert.display()
                ))
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// The certificates of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let what = "PEM certificates";
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, what, e))?;
    if chain.is_empty() {
        return Err(file_error(path, what, pem::Error::NoItemsFound));
    }
    Ok(chain)
}

/// What forwarding to another instance trusts: the system's certificate authorities and
/// `extra` (e.g. a private CA). Without either (a machine with no CA bundle), an HTTPS
/// owner cannot be verified and forwarding to it fails; plain HTTP is unaffected.
pub fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<ClientConfig, Error> {
    let provider = provider();
    let has_extra = !extra.is_empty();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(e.to_string()))?;
    let config = match rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider) {
        Ok(verifier) => builder
            .dangerous() // Not dangerous: the platform's own verification, with `extra`.
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth(),
        Err(e) if has_extra => {
            return Err(Error::Config(format!(
                "the extra CA certificates cannot be trusted: {e}"
            )));
        }
        Err(e) => {
            tracing::debug!(error = %e, "no CA certificates to verify HTTPS owners with");
            builder
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        }
    };
    Ok(config)
}

/// ring: it builds with a C compiler alone (aws-lc-rs needs cmake), at the cost of the
/// post-quantum key exchange that rustls 0.23.48 deprecated its provider for.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(path: &Path, what: &str, e: pem::Error) -> Error {
    let why = match e {
        pem::Error::Io(e) => format!("cannot read it: {e}"),
        pem::Error::NoItemsFound => format!("no {what} in it"),
        e => format!("not {what}: {e}"),
    };
    Error::File {
        path: path.to_owned(),
        why,
    }
}
