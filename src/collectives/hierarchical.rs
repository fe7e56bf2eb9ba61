//! Hierarchical all-reduce for groups spanning several hosts with several
//! ranks each: reduce within every host through shared memory, all-reduce
//! among the hosts' *leaders* (each host's lowest rank) over TCP, then
//! broadcast within every host. Only one rank per host crosses the network.
//! AVG sums at both levels and divides once, on the leaders.
//!
//! With a compression request (float SUM / AVG only), the leaders' exchange
//! goes through a codec ([`super::compress`]); the steps within a host stay
//! exact, and every rank ends with the same bits.
#![forbid(unsafe_code)]

use super::compress::codec;
use super::compress::{self, Compression};
use super::kernels::{finish_avg, Scratch};
use super::{all_reduce_bytes, all_reduce_shm, tree, AlgoName};
use crate::config::AlgoConfig;
use crate::error::Result;
use crate::transport::sub::SubTransport;
use crate::transport::Transport;
use crate::types::{DType, Rank, ReduceOp};

#[allow(clippy::too_many_arguments)] // scratch and comp: the engine's state
pub fn all_reduce(
    t: &mut dyn Transport,
    hosts: &[Vec<Rank>],
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
    comp: Option<&mut Compression>,
) -> Result<AlgoName> {
    let me = t.rank();
    let n = t.size();
    let host = hosts.iter().find(|h| h.contains(&me)).expect("every rank is on a host").clone();
    let leaders: Vec<Rank> = hosts.iter().map(|h| h[0]).collect();
    let sum = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    if host.len() > 1 {
        if let Some((win, wait)) = t.window() {
            all_reduce_shm(&win, wait, buf, dtype, sum)?;
        }
    }
    let mut comp = comp;
    let codec_req = comp.as_ref().and_then(|c| c.request.clone()).filter(|_| hosts.len() > 1 && codec::applies(dtype, op));
    if me == host[0] {
        let mut sub = SubTransport::new(t, leaders);
        match (&codec_req, comp.as_deref_mut()) {
            (Some(_), Some(c)) => {
                let avg = (op == ReduceOp::Avg).then_some(n);
                compress::leaders_all_reduce(&mut sub, buf, dtype, avg, c, scratch)?;
            }
            _ => {
                all_reduce_bytes(&mut sub, buf, dtype, sum, cfg, scratch)?;
                if op == ReduceOp::Avg {
                    finish_avg(dtype, buf, n)?;
                }
            }
        }
        if let Some(c) = comp.as_deref_mut() {
            c.sent_between_hosts += sub.bytes_sent();
        }
    }
    if let (Some(req), Some(c)) = (&codec_req, comp) {
        c.used = Some(req.codec); // non-leaders too: their result went through it
    }
    if host.len() > 1 {
        let mut sub = SubTransport::new(t, host);
        tree::broadcast(&mut sub, buf, 0)?;
    }
    Ok(if codec_req.is_some() { "hierarchical_compressed" } else { "hierarchical" })
}
