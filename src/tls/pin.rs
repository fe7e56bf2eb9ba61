//! The shared-secret mode's identity: one Ed25519 key that every rank of a
//! group derives from the secret and the group's name, and the one
//! self-signed certificate for it that every rank presents and accepts.
#![forbid(unsafe_code)]

use ring::hkdf;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// What a rank presents and pins in the shared-secret mode.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
}

/// PKCS#8 v1 wrapping of an Ed25519 seed (RFC 8410): this prefix, then
/// the 32 seed bytes.
const ED25519_PKCS8_PREFIX: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

struct Seed;

impl hkdf::KeyType for Seed {
    fn len(&self) -> usize {
        32
    }
}

impl Identity {
    /// The group's identity: HKDF-SHA256 of the secret, with the group's
    /// name as context, seeds the key; the certificate has fixed fields
    /// (validity, serial from the key), and Ed25519 signs
    /// deterministically, so every rank makes the same bytes.
    pub fn derive(secret: &[u8], group: &str) -> Result<Identity, String> {
        let mut seed = [0u8; 32];
        let info = [b"rustccl tls group ".as_slice(), group.as_bytes()];
        hkdf::Salt::new(hkdf::HKDF_SHA256, b"rustccl-tls-v1")
            .extract(secret)
            .expand(&info, Seed)
            .and_then(|okm| okm.fill(&mut seed))
            .map_err(|_| "deriving the TLS key from the secret failed".to_string())?;
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let der = PrivatePkcs8KeyDer::from(pkcs8);
        let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_ED25519).map_err(|e| e.to_string())?;
        let mut params = rcgen::CertificateParams::new(vec!["rustccl".to_string()]).map_err(|e| e.to_string())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("rustccl group {group}"));
        let cert = params.self_signed(&pair).map_err(|e| e.to_string())?;
        Ok(Identity { cert: cert.der().clone(), key: PrivateKeyDer::Pkcs8(der) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_derives_the_same_certificate_and_other_secrets_or_groups_another() {
        let a = Identity::derive(b"0123456789abcdef0123", "g").unwrap();
        let b = Identity::derive(b"0123456789abcdef0123", "g").unwrap();
        assert_eq!(a.cert, b.cert);
        assert_ne!(a.cert, Identity::derive(b"0123456789abcdef0124", "g").unwrap().cert);
        assert_ne!(a.cert, Identity::derive(b"0123456789abcdef0123", "h").unwrap().cert);
    }
}
