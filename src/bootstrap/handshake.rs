//! The first 32 bytes on every connection, connector to acceptor:
//! `"RCCL"` | version u16 | channel u8 | 0 | from-rank u32 | to-rank u32 |
//! 16-byte group secret. The acceptor answers `"RCOK"` | its rank u32.
//! Anything else is dropped without an answer.
#![forbid(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::{PeerInfo, CHANNELS};
use crate::config::log_at;
use crate::config::LogLevel;
use crate::types::Rank;

const HELLO_LEN: usize = 32;
/// Wire protocol between ranks: 2 since frame headers carry the roots of
/// rooted operations (a version-1 peer would send 0 there).
const VERSION: u16 = 2;

pub struct Handshake {
    pub rank: Rank,
    pub size: usize,
    pub secret: [u8; 16],
    pub deadline: Instant,
}

/// (peer, channel, stream)
pub type Accepted = Vec<(Rank, u8, TcpStream)>;

fn remaining(deadline: Instant) -> Result<Duration, String> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(|| "Timed out connecting to peers".to_string())
}

/// Constant-time comparison, so the secret cannot be probed byte by byte.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Handshake {
    fn hello(&self, channel: u8, to: Rank) -> [u8; HELLO_LEN] {
        let mut h = [0u8; HELLO_LEN];
        h[0..4].copy_from_slice(b"RCCL");
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6] = channel;
        h[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(to as u32).to_le_bytes());
        h[16..32].copy_from_slice(&self.secret);
        h
    }

    /// Parses a hello addressed to us; `Err` says why it is refused.
    fn check_hello(&self, h: &[u8; HELLO_LEN]) -> Result<(Rank, u8), String> {
        if &h[0..4] != b"RCCL" {
            return Err("not a rustccl peer".into());
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(format!("protocol version {version}, expected {VERSION}"));
        }
        if !same_secret(&h[16..32], &self.secret) {
            return Err("wrong group secret".into());
        }
        let channel = h[6];
        let from = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as Rank;
        let to = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as Rank;
        if to != self.rank || from <= self.rank || from >= self.size || channel as usize >= CHANNELS {
            return Err(format!("unexpected hello (from {from} to {to}, channel {channel})"));
        }
        Ok((from, channel))
    }

    /// Accepts one connection per (higher rank, channel); drops strangers.
    pub fn accept_all(&self, listener: &TcpListener, peers: &[PeerInfo]) -> Result<Accepted, String> {
        let expected = (self.size - self.rank - 1) * CHANNELS;
        let mut got: Accepted = Vec::with_capacity(expected);
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        while got.len() < expected {
            let (mut stream, from_addr) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    remaining(self.deadline).map_err(|e| {
                        let missing: Vec<Rank> =
                            (self.rank + 1..self.size).filter(|p| got.iter().filter(|g| g.0 == *p).count() < CHANNELS).collect();
                        format!("{e}: no connection from rank(s) {missing:?}")
                    })?;
                    wait_readable(listener, Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(format!("accept failed: {e}")),
            };
            let result = (|| -> Result<(Rank, u8), String> {
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                stream.set_read_timeout(Some(remaining(self.deadline)?.min(Duration::from_secs(10)))).map_err(|e| e.to_string())?;
                let mut h = [0u8; HELLO_LEN];
                stream.read_exact(&mut h).map_err(|e| format!("reading hello: {e}"))?;
                let (from, channel) = self.check_hello(&h)?;
                if got.iter().any(|g| g.0 == from && g.1 == channel) {
                    return Err(format!("duplicate connection from rank {from}"));
                }
                let mut ok = [0u8; 8];
                ok[0..4].copy_from_slice(b"RCOK");
                ok[4..8].copy_from_slice(&(self.rank as u32).to_le_bytes());
                stream.write_all(&ok).map_err(|e| format!("answering hello: {e}"))?;
                stream.set_read_timeout(None).map_err(|e| e.to_string())?;
                Ok((from, channel))
            })();
            match result {
                Ok((from, channel)) => got.push((from, channel, stream)),
                Err(why) => {
                    log_at!(LogLevel::Warn, "rank {}: refused connection from {from_addr}: {why}", self.rank);
                }
            }
        }
        let _ = peers;
        Ok(got)
    }

    /// Connects to every lower rank on every channel.
    pub fn connect_all(&self, peers: &[PeerInfo]) -> Result<Accepted, String> {
        let mut out = Vec::new();
        for peer in peers.iter().filter(|p| p.rank < self.rank) {
            for channel in 0..CHANNELS as u8 {
                let stream = self.connect_one(peer, channel)?;
                out.push((peer.rank, channel, stream));
            }
        }
        Ok(out)
    }

    fn connect_one(&self, peer: &PeerInfo, channel: u8) -> Result<TcpStream, String> {
        let what = |e: &dyn std::fmt::Display| format!("rank {} ({}): {e}", peer.rank, peer.addr);
        let mut stream = loop {
            let left = remaining(self.deadline).map_err(|e| what(&e))?;
            match TcpStream::connect_timeout(&peer.addr, left.min(Duration::from_secs(10))) {
                Ok(s) => break s,
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::Interrupted | ErrorKind::TimedOut) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(what(&e)),
            }
        };
        stream.set_nodelay(true).map_err(|e| what(&e))?;
        stream.set_read_timeout(Some(remaining(self.deadline).map_err(|e| what(&e))?)).map_err(|e| what(&e))?;
        stream.write_all(&self.hello(channel, peer.rank)).map_err(|e| what(&e))?;
        let mut ok = [0u8; 8];
        stream.read_exact(&mut ok).map_err(|e| what(&format!("no answer to hello ({e}); is the peer in the same job?")))?;
        let their = u32::from_le_bytes(ok[4..8].try_into().expect("4 bytes")) as Rank;
        if &ok[0..4] != b"RCOK" || their != peer.rank {
            return Err(what(&"bad answer to hello"));
        }
        stream.set_read_timeout(None).map_err(|e| what(&e))?;
        Ok(stream)
    }
}

/// Waits until `listener` has a connection to accept, or `most` passed
/// (a peer's connection wakes the acceptor at once, where sleeping between
/// tries made every group's creation wait).
fn wait_readable(listener: &TcpListener, most: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = PollTimeout::from(most.as_millis().min(u16::MAX as u128) as u16);
    let _ = poll(&mut [PollFd::new(listener.as_fd(), PollFlags::POLLIN)], ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(rank: Rank) -> Handshake {
        Handshake { rank, size: 4, secret: [7; 16], deadline: Instant::now() + Duration::from_secs(5) }
    }

    #[test]
    fn hello_checks() {
        let a = hs(3);
        let b = hs(1);
        assert_eq!(b.check_hello(&a.hello(1, 1)).unwrap(), (3, 1));
        // addressed to someone else
        assert!(b.check_hello(&a.hello(0, 2)).is_err());
        // wrong secret
        let mut wrong = a.hello(0, 1);
        wrong[20] ^= 1;
        assert!(b.check_hello(&wrong).unwrap_err().contains("secret"));
        // from a lower rank (only higher ranks connect to us)
        assert!(a.check_hello(&b.hello(0, 3)).is_err());
    }
}
