//! How a [`Mesh`] waits for its local peers' shared-memory progress
//! (`PhaseWait`): their phases, and the block flags of a streamed block
//! (`collectives::shm::blocks`), with the operation's deadline, interrupt
//! and dead-peer checks.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Mesh;
use crate::error::{Error, Result};
use crate::transport::shm::PhaseWait;
use crate::transport::{interrupted_error, timeout_error};
use crate::types::Rank;

impl PhaseWait for Mesh {
    fn seq(&self) -> u32 {
        self.ctx.wire_seq()
    }

    fn mismatch(&self, peer: Rank, detail: String) -> Error {
        Error::Protocol { site: self.ctx.site.clone(), rank: self.rank, peer, addr: self.addrs[peer].clone(), detail }
    }

    fn what(&self) -> crate::transport::frame::What {
        self.ctx.what
    }

    fn disagree(&self, peer: Rank, detail: String) -> Error {
        Mesh::disagree(self, peer, detail)
    }

    fn wait_phase(&mut self, target: u64) -> Result<()> {
        let _t = crate::profile::start(crate::profile::Span::PhaseWait);
        let r = self.wait_phase_for(target);
        self.clear_blocked();
        r
    }

    fn wait_until(&mut self, peer: usize, ready: &dyn Fn() -> bool) -> Result<()> {
        let _t = crate::profile::start(crate::profile::Span::PhaseWait);
        let Some(rank) = self.local.as_ref().map(|l| l.ranks[peer]) else { return Err(Error::Internal("no shared memory".into())) };
        while !ready() {
            if self.interrupt.is_set() {
                return Err(interrupted_error(self));
            }
            if Instant::now() >= self.ctx.deadline {
                return Err(timeout_error(self, vec![rank]));
            }
            self.check_alive(&[rank])?;
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }
}

impl Mesh {
    fn wait_phase_for(&mut self, target: u64) -> Result<()> {
        let Some(local) = self.local.clone() else { return Err(Error::Internal("no shared memory".into())) };
        let lags = |i: usize| i != local.me && local.segs[i].phase().load(Ordering::Acquire) < target;
        if !(0..local.segs.len()).any(lags) {
            return Ok(());
        }
        // The clock only for a wait that does not end at the first look.
        let t0 = Instant::now();
        local.spin(t0, || !(0..local.segs.len()).any(lags));
        let mut slept = false;
        loop {
            if !(0..local.segs.len()).any(lags) {
                if slept {
                    self.window.slept(t0.elapsed());
                }
                return Ok(());
            }
            // Named only for errors and liveness checks (no allocation per spin).
            let behind = || -> Vec<Rank> { (0..local.segs.len()).filter(|&i| lags(i)).map(|i| local.ranks[i]).collect() };
            if self.interrupt.is_set() {
                return Err(interrupted_error(self));
            }
            if Instant::now() >= self.ctx.deadline {
                return Err(timeout_error(self, behind()));
            }
            if t0.elapsed() < self.window.get() && !local.cores_taken() {
                local.pause();
            } else {
                slept = true;
                self.check_alive(&behind())?;
                self.publish_blocked(Some(target), behind())?;
                let left = self.ctx.deadline.saturating_duration_since(Instant::now());
                // Publishers wake only sleepers (`Window::publish`).
                local.mine().sleep_unless(left.min(Duration::from_millis(2)), || !(0..local.segs.len()).any(lags));
                self.clear_blocked();
            }
        }
    }
}
