//! A throwaway PKI for TLS-required brokers: a CA and a server leaf valid for `localhost` and
//! `127.0.0.1`, written as PEM files. Clients trust the CA explicitly, exactly as an integrator
//! would with a private CA; nothing is added to any system trust store.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::rig::error::HarnessError;

/// Paths of the PEM files written by [`TestPki::generate`].
#[derive(Debug, Clone)]
pub struct TestPki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestPki {
    /// Generates a CA and a server leaf (SANs: DNS `localhost`, IP `127.0.0.1`) into `dir` as
    /// `ca.pem`, `server-cert.pem` and `server-key.pem`.
    pub fn generate(dir: &Path) -> Result<TestPki, HarnessError> {
        let tls = |e: rcgen::Error| HarnessError::Tls(e.to_string());

        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "cotal-delivery harness test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(tls)?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(tls)?;

        let mut leaf_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .map_err(tls)?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        leaf_params.is_ca = IsCa::ExplicitNoCa;
        leaf_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().map_err(tls)?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(tls)?;

        let pki = TestPki {
            ca_cert: dir.join("ca.pem"),
            server_cert: dir.join("server-cert.pem"),
            server_key: dir.join("server-key.pem"),
        };
        write(&pki.ca_cert, &ca.pem())?;
        write(&pki.server_cert, &leaf.pem())?;
        write(&pki.server_key, &leaf_key.serialize_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text).map_err(|e| HarnessError::io(format!("write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_three_pem_files() {
        let dir = tempfile::tempdir().ok();
        let pki = dir.as_ref().map(|d| TestPki::generate(d.path()));
        let Some(Ok(pki)) = pki else {
            panic!("PKI generation failed: {pki:?}");
        };
        for p in [&pki.ca_cert, &pki.server_cert, &pki.server_key] {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            assert!(text.starts_with("-----BEGIN "), "{}", p.display());
        }
    }
}
