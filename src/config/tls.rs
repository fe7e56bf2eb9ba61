//! The TLS settings (`RUSTCCL_TLS*`), of the process or of one group
//! (`pg_options`): read here, loaded by the `tls` module.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use super::env::Vars;
use super::Config;

/// The TLS settings' names: a group may set them apart from the process.
pub const TLS_SETTINGS: &[&str] = &["RUSTCCL_TLS", "RUSTCCL_TLS_CA", "RUSTCCL_TLS_CERT", "RUSTCCL_TLS_KEY", "RUSTCCL_TLS_SECRET_FILE"];

/// How a group's ranks prove they belong to it (the `tls` module loads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// Each rank's certificate and key, both directions checked against the CA.
    Certs { ca: PathBuf, cert: PathBuf, key: PathBuf },
    /// A secret every rank reads from this file.
    Secret { file: PathBuf },
}

impl Config {
    /// TLS as `settings` ((name, value) as in the environment) over the
    /// environment say: None when off; Err when `RUSTCCL_TLS` does not
    /// parse or names no way to authenticate.
    pub fn tls_for(&self, settings: &[(String, String)]) -> Result<Option<TlsMode>, String> {
        tls_from(&Vars::layered(settings, &self.env))
    }
}

fn tls_from(v: &Vars<'_>) -> Result<Option<TlsMode>, String> {
    let on = match v.var("RUSTCCL_TLS").unwrap_or_default().to_ascii_lowercase().as_str() {
        "" | "0" | "off" | "false" | "no" => false,
        "1" | "on" | "true" | "yes" => true,
        other => return Err(format!("RUSTCCL_TLS={other:?}: not 0 or 1")),
    };
    if !on {
        return Ok(None);
    }
    let path = |name: &str| v.text(name).map(PathBuf::from);
    match (path("RUSTCCL_TLS_CA"), path("RUSTCCL_TLS_CERT"), path("RUSTCCL_TLS_KEY"), path("RUSTCCL_TLS_SECRET_FILE")) {
        (Some(ca), Some(cert), Some(key), None) => Ok(Some(TlsMode::Certs { ca, cert, key })),
        (None, None, None, Some(file)) => Ok(Some(TlsMode::Secret { file })),
        (None, None, None, None) => {
            Err("RUSTCCL_TLS=1 needs RUSTCCL_TLS_SECRET_FILE, or RUSTCCL_TLS_CA, RUSTCCL_TLS_CERT and RUSTCCL_TLS_KEY".into())
        }
        (_, _, _, Some(_)) if v.text("RUSTCCL_TLS_CA").is_some() || v.text("RUSTCCL_TLS_CERT").is_some() => {
            Err("set RUSTCCL_TLS_SECRET_FILE or the certificates (RUSTCCL_TLS_CA / _CERT / _KEY), not both".into())
        }
        _ => Err("RUSTCCL_TLS_CA, RUSTCCL_TLS_CERT and RUSTCCL_TLS_KEY go together: one is missing".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<Option<TlsMode>, String> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        tls_from(&Vars::layered(&owned, &[]))
    }

    #[test]
    fn tls_settings_name_one_way_to_authenticate() {
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[("RUSTCCL_TLS", "0"), ("RUSTCCL_TLS_SECRET_FILE", "/s")]), Ok(None));
        assert_eq!(read(&[("RUSTCCL_TLS", "1"), ("RUSTCCL_TLS_SECRET_FILE", "/s")]), Ok(Some(TlsMode::Secret { file: "/s".into() })));
        let certs = read(&[("RUSTCCL_TLS", "1"), ("RUSTCCL_TLS_CA", "a"), ("RUSTCCL_TLS_CERT", "b"), ("RUSTCCL_TLS_KEY", "c")]);
        assert_eq!(certs, Ok(Some(TlsMode::Certs { ca: "a".into(), cert: "b".into(), key: "c".into() })));
        assert!(read(&[("RUSTCCL_TLS", "1")]).unwrap_err().contains("RUSTCCL_TLS_SECRET_FILE"));
        assert!(read(&[("RUSTCCL_TLS", "1"), ("RUSTCCL_TLS_CA", "a")]).unwrap_err().contains("go together"));
        assert!(read(&[("RUSTCCL_TLS", "1"), ("RUSTCCL_TLS_CA", "a"), ("RUSTCCL_TLS_SECRET_FILE", "s")]).unwrap_err().contains("not both"));
        assert!(read(&[("RUSTCCL_TLS", "maybe")]).unwrap_err().contains("not 0 or 1"));
    }
}
