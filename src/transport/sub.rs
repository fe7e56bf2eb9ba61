//! A view of a transport restricted to some of its ranks, renumbered
//! 0..k, so that any algorithm can run among them (the leaders of each
//! host, or the ranks of one host).
#![forbid(unsafe_code)]

use super::{Interrupter, OpCtx, Transport, Xfer};
use crate::error::Result;
use crate::types::Rank;

pub struct SubTransport<'a> {
    inner: &'a mut dyn Transport,
    /// Real ranks of the members, in their sub-rank order.
    ranks: Vec<Rank>,
    me: Rank,
    sent: u64,
}

impl<'a> SubTransport<'a> {
    /// `ranks` must contain the inner transport's own rank.
    pub fn new(inner: &'a mut dyn Transport, ranks: Vec<Rank>) -> SubTransport<'a> {
        let me = ranks.iter().position(|&r| r == inner.rank()).expect("this rank is a member");
        SubTransport { inner, ranks, me, sent: 0 }
    }

    /// Bytes sent through this view so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent
    }
}

impl Transport for SubTransport<'_> {
    fn rank(&self) -> Rank {
        self.me
    }
    fn size(&self) -> usize {
        self.ranks.len()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn peer_addr(&self, peer: Rank) -> String {
        self.inner.peer_addr(self.ranks[peer])
    }
    fn begin(&mut self, ctx: OpCtx) {
        self.inner.begin(ctx)
    }
    fn ctx(&self) -> &OpCtx {
        self.inner.ctx()
    }
    fn interrupter(&self) -> Interrupter {
        self.inner.interrupter()
    }

    fn exchange(&mut self, xfers: &mut [Xfer<'_>]) -> Result<()> {
        let mut mapped: Vec<Xfer<'_>> = xfers
            .iter_mut()
            .map(|x| match x {
                Xfer::Send { peer, data } => {
                    self.sent += data.len() as u64;
                    Xfer::Send { peer: self.ranks[*peer], data }
                }
                Xfer::Recv { peer, data } => Xfer::Recv { peer: self.ranks[*peer], data },
            })
            .collect();
        self.inner.exchange(&mut mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::OpSite;
    use crate::transport::loopback;
    use std::time::Duration;

    #[test]
    fn members_talk_by_sub_rank() {
        let mut mesh = loopback::mesh(4);
        let ctx = OpCtx::new(OpSite { op: "t", seq: 0, group: "g".into() }, Duration::from_secs(5));
        std::thread::scope(|s| {
            for (r, t) in mesh.iter_mut().enumerate() {
                t.begin(ctx.clone());
                if r == 1 || r == 3 {
                    s.spawn(move || {
                        let mut sub = SubTransport::new(t, vec![3, 1]);
                        let me = sub.rank();
                        let mut got = [0u8; 1];
                        sub.sendrecv(1 - me, &[r as u8], 1 - me, &mut got).unwrap();
                        assert_eq!(got[0] as usize, if r == 1 { 3 } else { 1 });
                    });
                }
            }
        });
    }
}
