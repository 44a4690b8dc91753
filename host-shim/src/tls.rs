//! TLS for the shim, on rustls with ring: the server side of mutual TLS with
//! Envoy (`sluice serve --tls-cert --tls-key --client-ca`), and the crypto
//! provider the redis crate's `rediss://` connections use.
//!
//! With mTLS, the shim accepts only clients whose certificate a configured
//! CA signed: whoever can reach the port but holds no such certificate can
//! neither check, refill buckets through `/v1/adjust`, nor release leases.
//! ALPN offers `h2` first, so Envoy multiplexes its calls over HTTP/2 as it
//! does in cleartext.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The one crypto provider of the build.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider, which the redis crate's TLS
/// connections take; harmless when already done.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The server config for mutual TLS: this certificate chain and key, and
/// only clients with a certificate signed by a CA in `client_ca`.
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}: no PEM private key", key.display()))?;
    let mut roots = RootCertStore::empty();
    for ca in certificates(client_ca)? {
        roots
            .add(ca)
            .with_context(|| format!("--client-ca {}: not a CA certificate", client_ca.display()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .with_context(|| format!("--client-ca {}", client_ca.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .with_context(|| format!("--tls-cert {} does not go with its key", cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Every certificate in a PEM file; at least one.
pub fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: bad PEM", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no PEM certificate", path.display());
    }
    Ok(certs)
}
