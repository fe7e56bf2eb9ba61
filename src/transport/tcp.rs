//! A TCP link: one non-blocking connection to a peer (any host).
//!
//! A send writes header and payload with one vectored write, a receive
//! reads header and payload with one vectored read straight into the
//! caller's buffer; both stop at `WouldBlock` and report how far they got.
#![forbid(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut, Read, Write};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use super::frame::HEADER_LEN;
use super::{Progress, Step};

pub struct TcpLink {
    stream: TcpStream,
    pub addr: String,
}

impl TcpLink {
    pub fn new(std_stream: std::net::TcpStream, addr: String) -> io::Result<TcpLink> {
        std_stream.set_nonblocking(true)?;
        std_stream.set_nodelay(true)?;
        Ok(TcpLink { stream: TcpStream::from_std(std_stream), addr })
    }

    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(&mut self.stream, token, Interest::READABLE | Interest::WRITABLE)
    }

    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    pub fn send_step(&mut self, data: &[u8], st: &mut Progress) -> io::Result<Step> {
        let mut moved = false;
        loop {
            let bufs = [IoSlice::new(&st.hdr[st.hdr_done..]), IoSlice::new(&data[st.body_done..])];
            match self.stream.write_vectored(&bufs) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
                Ok(k) => {
                    moved = true;
                    st.advance(k);
                    if st.hdr_done == HEADER_LEN && st.body_done == data.len() {
                        return Ok(Step::Done);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Blocked(moved)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `check` validates the header once it is complete.
    pub fn recv_step(
        &mut self,
        data: &mut [u8],
        st: &mut Progress,
        check: &mut dyn FnMut(&[u8; HEADER_LEN]) -> Result<(), String>,
    ) -> io::Result<Result<Step, String>> {
        let mut moved = false;
        loop {
            let r = {
                let mut bufs = [IoSliceMut::new(&mut st.hdr[st.hdr_done..]), IoSliceMut::new(&mut data[st.body_done..])];
                self.stream.read_vectored(&mut bufs)
            };
            match r {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(k) => {
                    moved = true;
                    st.advance(k);
                    if st.hdr_done == HEADER_LEN && !st.checked {
                        if let Err(why) = check(&st.hdr) {
                            return Ok(Err(why));
                        }
                        st.checked = true;
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
