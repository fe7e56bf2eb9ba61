//! Hierarchical all-reduce for groups spanning several hosts with several
//! ranks each: reduce within every host through shared memory, all-reduce
//! among the hosts' *leaders* (each host's lowest rank) over TCP, then
//! broadcast within every host. Only one rank per host crosses the network.
//! AVG sums at both levels and divides once, on the leaders.
#![forbid(unsafe_code)]

use super::reduce::{finish_avg, Scratch};
use super::{all_reduce_bytes, all_reduce_shm, tree, AlgoName};
use crate::config::AlgoConfig;
use crate::error::Result;
use crate::transport::sub::SubTransport;
use crate::transport::Transport;
use crate::types::{DType, Rank, ReduceOp};

pub fn all_reduce(
    t: &mut dyn Transport,
    hosts: &[Vec<Rank>],
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
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
    if me == host[0] {
        let mut sub = SubTransport::new(t, leaders);
        all_reduce_bytes(&mut sub, buf, dtype, sum, cfg, scratch)?;
        if op == ReduceOp::Avg {
            finish_avg(dtype, buf, n)?;
        }
    }
    if host.len() > 1 {
        let mut sub = SubTransport::new(t, host);
        tree::broadcast(&mut sub, buf, 0)?;
    }
    Ok("hierarchical")
}
