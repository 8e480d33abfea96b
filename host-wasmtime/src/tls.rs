//! TLS with rustls on ring: the public listener's certificate (`--tls-cert`, `--tls-key`)
//! and the roots outbound https trusts (the system's, plus `--ca`).

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(file: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let text = std::fs::read(file)
        .with_context(|| format!("{flag} {}: cannot read it", file.display()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            anyhow::anyhow!("{flag} {}: not a PEM certificate file: {e}", file.display())
        })?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{flag} {}: no certificate in it (PEM, -----BEGIN CERTIFICATE-----)",
        file.display()
    );
    Ok(certs)
}

/// The acceptor for the public listener: the chain in `cert`, the key in `key` (PEM), HTTP/1.1.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let chain = certificates(cert, "--tls-cert")?;
    let text = std::fs::read(key)
        .with_context(|| format!("--tls-key {}: cannot read it", key.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&text)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: no private key in it: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("--tls-cert and --tls-key do not make a certificate and its key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The system's root certificates, read once (webpki-roots' when the system has none).
fn system_roots() -> &'static rustls::RootCertStore {
    static ROOTS: OnceLock<rustls::RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!("system root certificates: {e}");
        }
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            tracing::warn!(
                "no root certificates found on this system: trusting webpki-roots' (Mozilla's) for outbound https"
            );
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        roots
    })
}

/// The client configuration for outbound https: the system's roots, plus every certificate
/// in the `ca` files (PEM).
pub fn client_config(ca: &[PathBuf]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = system_roots().clone();
    for file in ca {
        for c in certificates(file, "--ca")? {
            roots
                .add(c)
                .map_err(|e| anyhow::anyhow!("--ca {}: {e}", file.display()))?;
        }
    }
    client_config_with(roots)
}

/// The client configuration trusting only the certificates in `pem` (tests, tools).
pub fn client_config_trusting(pem: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        roots.add(c?)?;
    }
    client_config_with(roots)
}

fn client_config_with(roots: rustls::RootCertStore) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
