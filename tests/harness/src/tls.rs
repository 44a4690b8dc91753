//! A throwaway PKI for the TLS tests, made with rcgen: a CA, a server
//! certificate for `127.0.0.1` and `localhost` (the shim's or Redis's), a
//! client certificate it signed (Envoy's), and a client certificate from
//! another CA (a stranger's). PEM files in a scratch dir, removed on drop.

use std::path::PathBuf;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::process::scratch_dir;

/// A certificate and its key, as PEM files.
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Pki {
    dir: PathBuf,
    /// The CA certificate (PEM) that signed `server` and `client`.
    pub ca: PathBuf,
    pub server: Identity,
    pub client: Identity,
    /// A client certificate signed by another CA.
    pub stranger: Identity,
}

impl Pki {
    pub fn generate() -> anyhow::Result<Pki> {
        let dir = scratch_dir("pki")?;
        let other = ca("another CA")?;
        let ca = ca("sluice test CA")?;
        let server =
            leaf(&ca, "sluice shim", &["127.0.0.1", "localhost"], ExtendedKeyUsagePurpose::ServerAuth)?;
        let client = leaf(&ca, "envoy", &[], ExtendedKeyUsagePurpose::ClientAuth)?;
        let stranger = leaf(&other, "stranger", &[], ExtendedKeyUsagePurpose::ClientAuth)?;
        let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        Ok(Pki {
            ca: write("ca.pem", &ca.pem())?,
            server: Identity { cert: write("server.pem", &server.0)?, key: write("server.key", &server.1)? },
            client: Identity { cert: write("client.pem", &client.0)?, key: write("client.key", &client.1)? },
            stranger: Identity {
                cert: write("stranger.pem", &stranger.0)?,
                key: write("stranger.key", &stranger.1)?,
            },
            dir,
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Ca = CertifiedIssuer<'static, KeyPair>;

fn ca(name: &str) -> anyhow::Result<Ca> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// A certificate signed by `ca`: its PEM and its key's PEM.
fn leaf(
    ca: &Ca,
    name: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}
