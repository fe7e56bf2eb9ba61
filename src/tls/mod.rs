//! TLS 1.3 on the TCP links between ranks (`RUSTCCL_TLS=1`), through
//! rustls with its ring provider.
//!
//! Two ways to say who belongs to the group, both verified in both
//! directions:
//!
//! - **Certificates** (`RUSTCCL_TLS_CA`, `RUSTCCL_TLS_CERT`,
//!   `RUSTCCL_TLS_KEY`, PEM files, as gloo's TLS transport takes them):
//!   every rank presents its certificate, and each checks the other's
//!   against the CA. No host-name check (ranks are addressed by IP).
//! - **A shared secret** (`RUSTCCL_TLS_SECRET_FILE`, a file every rank gets
//!   from its launcher): every rank derives the same Ed25519 key from the
//!   secret and the group's name ([`pin`]), presents one self-signed
//!   certificate for it, and accepts exactly that certificate.
//!
//! The store never sees either: a process that can read and write the
//! store but holds neither the secret nor a CA-signed certificate cannot
//! complete a handshake. [`socket`] runs the records over the non-blocking
//! sockets of the transport and the point-to-point engine.

mod pin;
pub mod socket;
mod verify;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};

pub use socket::Socket;

pub use crate::config::TlsMode;

/// A group's TLS configuration, ready for handshakes.
pub struct Tls {
    pub mode: TlsMode,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// The name a client asks for: never checked (see [`verify`]), but rustls
/// needs one.
const SERVER_NAME: &str = "rustccl";

/// ring, over aws-lc-rs, for its build (seconds, no cmake) on small CI
/// machines; rustls marks it deprecated because it offers no post-quantum
/// key exchange (`docs/tls.md` says what that means for a link).
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Loads the certificates and keys of `mode` for the group `group`
    /// (the secret's key depends on the group name). Err says which file
    /// and why.
    pub fn load(mode: TlsMode, group: &str) -> Result<Tls, String> {
        let provider = provider();
        let versions = &[&rustls::version::TLS13];
        let (client, server) = match &mode {
            TlsMode::Certs { ca, cert, key } => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c).map_err(|e| format!("RUSTCCL_TLS_CA {}: {e}", ca.display()))?;
                }
                let roots = Arc::new(roots);
                let chain = certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("RUSTCCL_TLS_KEY {}: {e}", key.display()))?;
                let server_verifier = verify::CaVerifier::new(roots.clone(), provider.clone())?;
                let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| format!("RUSTCCL_TLS_CA {}: {e}", ca.display()))?;
                let client = ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(versions)
                    .map_err(|e| e.to_string())?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(server_verifier))
                    .with_client_auth_cert(chain.clone(), key.clone_key())
                    .map_err(|e| format!("RUSTCCL_TLS_CERT / RUSTCCL_TLS_KEY: {e}"))?;
                let server = ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(versions)
                    .map_err(|e| e.to_string())?
                    .with_client_cert_verifier(client_verifier)
                    .with_single_cert(chain, key)
                    .map_err(|e| format!("RUSTCCL_TLS_CERT / RUSTCCL_TLS_KEY: {e}"))?;
                (client, server)
            }
            TlsMode::Secret { file } => {
                let secret = std::fs::read(file).map_err(|e| format!("RUSTCCL_TLS_SECRET_FILE {}: {e}", file.display()))?;
                if secret.len() < 16 {
                    return Err(format!(
                        "RUSTCCL_TLS_SECRET_FILE {}: {} bytes; a secret needs at least 16 (e.g. head -c 32 /dev/urandom)",
                        file.display(),
                        secret.len()
                    ));
                }
                let id = pin::Identity::derive(&secret, group)?;
                let verifier = Arc::new(verify::Pinned::new(id.cert.clone(), provider.clone()));
                let client = ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(versions)
                    .map_err(|e| e.to_string())?
                    .dangerous()
                    .with_custom_certificate_verifier(verifier.clone())
                    .with_client_auth_cert(vec![id.cert.clone()], id.key.clone_key())
                    .map_err(|e| e.to_string())?;
                let server = ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(versions)
                    .map_err(|e| e.to_string())?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(vec![id.cert], id.key)
                    .map_err(|e| e.to_string())?;
                (client, server)
            }
        };
        Ok(Tls { mode, client: Arc::new(client), server: Arc::new(server) })
    }

    /// Runs the handshake on the connected, blocking `stream` (the client
    /// side where this rank connected) until `deadline`: the session the
    /// link then reads and writes through, or why it failed.
    pub fn handshake(&self, stream: &mut TcpStream, client: bool, deadline: Instant) -> Result<Connection, String> {
        let mut conn: Connection = if client {
            let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
            ClientConnection::new(self.client.clone(), name).map_err(|e| e.to_string())?.into()
        } else {
            ServerConnection::new(self.server.clone()).map_err(|e| e.to_string())?.into()
        };
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the TLS handshake timed out (is the peer using TLS too?)".into());
            }
            stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
            match conn.complete_io(stream) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err("the TLS handshake timed out (is the peer using TLS too?)".into())
                }
                Err(e) => return Err(handshake_error(&e)),
            }
        }
        stream.set_read_timeout(None).map_err(|e| e.to_string())?;
        Ok(conn)
    }
}

/// What a failed handshake says: rustls's cause, and what a peer that
/// does not speak TLS looks like from here.
fn handshake_error(e: &io::Error) -> String {
    let tls = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match (e.kind(), tls) {
        (io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted, _) => {
            format!(
                "the peer closed the connection during the TLS handshake ({e}): it refused this rank's certificate, or does not use TLS"
            )
        }
        (_, Some(rustls::Error::AlertReceived(alert))) => {
            format!("the peer refused the TLS handshake ({alert:?}): it does not accept this rank's certificate")
        }
        (_, Some(rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateHandshakeMessage { .. })) => {
            format!("TLS handshake failed: {e} (does the peer use TLS?)")
        }
        _ => format!("TLS handshake failed: {e}"),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let all: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path).map_err(|e| format!("{}: {e}", path.display()))?.collect();
    let all = all.map_err(|e| format!("{}: {e}", path.display()))?;
    if all.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(all)
}

/// Writes all of `buf` through `conn` on the blocking `stream`.
pub fn write_all(conn: &mut Connection, stream: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    conn.writer().write_all(buf)?;
    while conn.wants_write() {
        conn.write_tls(stream)?;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes through `conn` on the blocking `stream`.
pub fn read_exact(conn: &mut Connection, stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match conn.reader().read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if conn.read_tls(stream)? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
