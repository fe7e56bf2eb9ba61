//! A TCP link: one non-blocking connection to a peer (any host), plain or
//! through TLS ([`Socket`]).
//!
//! A send writes header and payload with one vectored write, a receive
//! reads header and payload with one vectored read straight into the
//! caller's buffer; both stop at `WouldBlock` and report how far they got.
//! A send is done once its bytes left for the socket (through TLS, sealed
//! records may wait in the session for room).
//! Bytes read past a frame that the receiver does not take (a frame of a
//! collective given up) go back to the front of the stream (`give_back`).
#![forbid(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use crate::tls::Socket;

use super::frame::{Seen, HEADER_LEN};
use super::{Progress, Step};

pub struct TcpLink {
    stream: Socket,
    pub addr: String,
    /// Bytes given back to the stream: reads take them first.
    given_back: Vec<u8>,
}

impl TcpLink {
    pub fn new(std_stream: std::net::TcpStream, addr: String, tls: Option<rustls::Connection>) -> io::Result<TcpLink> {
        std_stream.set_nonblocking(true)?;
        std_stream.set_nodelay(true)?;
        Ok(TcpLink { stream: Socket::new(TcpStream::from_std(std_stream), tls), addr, given_back: Vec::new() })
    }

    /// Whether the link's bytes go through TLS.
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(self.stream.sock(), token, Interest::READABLE | Interest::WRITABLE)
    }

    pub fn shutdown(&self) {
        self.stream.shutdown();
    }

    pub fn send_step(&mut self, data: &[u8], st: &mut Progress) -> io::Result<Step> {
        let mut moved = false;
        loop {
            if st.hdr_done == HEADER_LEN && st.body_done == data.len() {
                return Ok(if self.stream.flushed()? { Step::Done } else { Step::Blocked(moved) });
            }
            let bufs = [IoSlice::new(&st.hdr[st.hdr_done..]), IoSlice::new(&data[st.body_done..])];
            match self.stream.write_vectored(&bufs) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
                Ok(k) => {
                    moved = true;
                    st.advance(k);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Blocked(moved)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Puts `bytes` back at the front of the stream, before what is unread.
    pub fn give_back(&mut self, bytes: &[u8]) {
        self.given_back.splice(0..0, bytes.iter().copied());
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        if self.given_back.is_empty() {
            return self.stream.read_vectored(bufs);
        }
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = b.len().min(self.given_back.len() - n);
            b[..k].copy_from_slice(&self.given_back[n..n + k]);
            n += k;
        }
        self.given_back.drain(..n);
        Ok(n)
    }

    /// Reads what is there, up to `dst.len()` bytes; None: nothing yet.
    pub fn read_some(&mut self, dst: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.read_vectored(&mut [IoSliceMut::new(dst)]) {
                Ok(0) if !dst.is_empty() => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(k) => return Ok(Some(k)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `check` classifies the header once it is complete; anything but
    /// [`Seen::Expected`] stops the receive with the header read and
    /// `st.body_done` bytes after it in `data`.
    pub fn recv_step(
        &mut self,
        data: &mut [u8],
        st: &mut Progress,
        check: &mut dyn FnMut(&[u8; HEADER_LEN]) -> Seen,
    ) -> io::Result<Result<Step, Seen>> {
        let mut moved = false;
        loop {
            let r = {
                let mut bufs = [IoSliceMut::new(&mut st.hdr[st.hdr_done..]), IoSliceMut::new(&mut data[st.body_done..])];
                self.read_vectored(&mut bufs)
            };
            match r {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(k) => {
                    moved = true;
                    st.advance(k);
                    if st.hdr_done == HEADER_LEN && !st.checked {
                        match check(&st.hdr) {
                            Seen::Expected => st.checked = true,
                            other => return Ok(Err(other)),
                        }
                    }
                    if st.checked && st.body_done == data.len() {
                        return Ok(Ok(Step::Done));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Ok(Step::Blocked(moved))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
