//! A non-blocking TCP connection, plain or through a TLS session: what
//! the transport's TCP links and the point-to-point engine read and write.
//!
//! Reads and writes keep the plain socket's contract: they move what they
//! can and stop at `WouldBlock`, so readiness-driven callers work
//! unchanged. Through TLS, a write takes plaintext into the session (which
//! seals it into records) and writes the records that fit; records left in
//! the session go out on the next write or [`Socket::flushed`], which a
//! sender calls before it counts a message as sent.
#![forbid(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut, Read, Write};

use mio::net::TcpStream;
use rustls::Connection;

pub struct Socket {
    sock: TcpStream,
    tls: Option<Box<Connection>>,
}

impl Socket {
    pub fn new(sock: TcpStream, tls: Option<Connection>) -> Socket {
        Socket { sock, tls: tls.map(Box::new) }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The socket, to register with a poll or shut down.
    pub fn sock(&mut self) -> &mut TcpStream {
        &mut self.sock
    }

    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let Some(tls) = self.tls.as_deref_mut() else { return self.sock.write_vectored(bufs) };
        send_records(tls, &mut self.sock)?;
        if tls.wants_write() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = tls.writer().write_vectored(bufs)?;
        send_records(tls, &mut self.sock)?;
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    /// Whether every byte written so far has left for the socket (always,
    /// without TLS); sends what it can of the rest.
    pub fn flushed(&mut self) -> io::Result<bool> {
        let Some(tls) = self.tls.as_deref_mut() else { return Ok(true) };
        send_records(tls, &mut self.sock)?;
        Ok(!tls.wants_write())
    }

    /// Reads what is there; Ok(0) at the end of the stream. Through TLS, a
    /// record that fails authentication is an `InvalidData` error that
    /// says so.
    pub fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let Some(tls) = self.tls.as_deref_mut() else { return self.sock.read_vectored(bufs) };
        loop {
            match tls.reader().read_vectored(bufs) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            match tls.read_tls(&mut self.sock) {
                Ok(0) => return Ok(0),
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        // tell the peer why (an alert), as far as it goes
                        let _ = send_records(tls, &mut self.sock);
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "TLS: {e} (a record failed authentication or broke the protocol: the link was tampered with or corrupted)"
                            ),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [IoSliceMut::new(dst)])
    }
}

/// Writes the session's sealed records until the socket is full.
fn send_records(tls: &mut Connection, sock: &mut TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(sock) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
