//! Which all-reduces of a communicator are compressed between hosts.
//!
//! Two ways to ask, both default off:
//! - per group: [`GroupCompression::set`] (`rustccl.set_compression(group,
//!   codec)`): every later float SUM / AVG all_reduce of the group; the
//!   error-feedback key is the tensor's address, length and dtype, so a
//!   tensor reused across steps (a gradient, a DDP bucket) keeps its
//!   residual;
//! - per call: [`set_next`] (the `rustccl.hooks.engine_compression` DDP
//!   hook) names the codec and key for the next collective this thread
//!   submits to the group, overriding the group's setting.
//!
//! Ranks must agree on the codec of each all_reduce (they call the same
//! functions in the same order, like every collective); the key is each
//! leader's own business.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::collectives::compress::codec::{self, Codec, Request};
use crate::collectives::Op;
use crate::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub codec: Codec,
    pub feedback: bool,
}

pub struct Next {
    group: String,
    setting: Option<Setting>,
    key: String,
}

thread_local! {
    static NEXT: RefCell<Option<Next>> = const { RefCell::new(None) };
}

/// The next collective this thread submits to `group` runs with `setting`
/// (None: exact) and error-feedback key `key`.
pub fn set_next(group: &str, setting: Option<Setting>, key: &str) {
    NEXT.with(|n| *n.borrow_mut() = Some(Next { group: group.into(), setting, key: key.into() }));
}

/// Takes this thread's pending per-call choice for `group`, if any.
pub fn take_next(group: &str) -> Option<Next> {
    NEXT.with(|n| {
        let mut n = n.borrow_mut();
        if n.as_ref().is_some_and(|x| x.group == group) {
            n.take()
        } else {
            None
        }
    })
}

#[derive(Default)]
pub struct GroupCompression {
    setting: Mutex<Option<Setting>>,
    /// A setting is in force: an exact group's calls skip the lock.
    on: AtomicBool,
}

impl GroupCompression {
    pub fn set(&self, s: Option<Setting>) {
        let mut g = self.setting.lock().unwrap_or_else(|p| p.into_inner());
        *g = s;
        self.on.store(s.is_some(), Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<Setting> {
        *self.setting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request for a submission to `group`: only all_reduce submissions
    /// whose tensors are all of one float dtype with SUM / AVG compress
    /// (the rest stay exact). Consumes a pending [`set_next`] for the group.
    pub fn request(&self, group: &str, ops: &[Op<Tensor>]) -> Option<Request> {
        self.request_with(take_next(group), ops)
    }

    /// [`GroupCompression::request`] with the pending choice already taken
    /// (the communicator takes it before validating, so a rejected call
    /// cannot leave it to the next one).
    pub fn request_with(&self, next: Option<Next>, ops: &[Op<Tensor>]) -> Option<Request> {
        let first = match ops.first()? {
            Op::AllReduce { bufs, op } => (bufs.first()?.dtype(), *op),
            _ => return None,
        };
        let same = ops.iter().all(|o| match o {
            Op::AllReduce { bufs, op } => *op == first.1 && bufs.iter().all(|b| b.dtype() == first.0),
            _ => false,
        });
        if !same || !codec::applies(first.0, first.1) {
            return None;
        }
        let (setting, key) = match next {
            Some(n) => (n.setting?, n.key),
            None if !self.on.load(Ordering::Relaxed) => return None,
            None => (self.get()?, default_key(ops)),
        };
        Some(Request { codec: setting.codec, key, feedback: setting.feedback })
    }
}

/// Address, length and dtype of the first tensor, and the total length.
fn default_key(ops: &[Op<Tensor>]) -> String {
    let bufs: Vec<&Tensor> = ops.iter().flat_map(|o| o.tensors()).collect();
    let total: usize = bufs.iter().map(|t| t.numel()).sum();
    let t = bufs[0];
    format!("t{:x}:{}:{}:{total}", t.addr(), t.numel(), t.dtype().name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DType, ReduceOp};

    fn ar(dtype: DType, op: ReduceOp) -> Vec<Op<Tensor>> {
        vec![Op::AllReduce { bufs: vec![Tensor::zeros(dtype, 8)], op }]
    }

    #[test]
    fn group_setting_and_per_call_override() {
        let g = GroupCompression::default();
        assert_eq!(g.request("g", &ar(DType::F32, ReduceOp::Sum)), None);
        g.set(Some(Setting { codec: Codec::Int8, feedback: true }));
        let r = g.request("g", &ar(DType::F32, ReduceOp::Avg)).unwrap();
        assert_eq!((r.codec, r.feedback), (Codec::Int8, true));
        assert!(r.key.ends_with(":8:float32:8"), "{}", r.key);
        assert_eq!(g.request("g", &ar(DType::F32, ReduceOp::Max)), None);
        assert_eq!(g.request("g", &ar(DType::I32, ReduceOp::Sum)), None);
        set_next("other", Some(Setting { codec: Codec::Bf16, feedback: false }), "b3");
        assert_eq!(g.request("g", &ar(DType::F32, ReduceOp::Sum)).unwrap().codec, Codec::Int8);
        set_next("g", Some(Setting { codec: Codec::Bf16, feedback: false }), "b3");
        let r = g.request("g", &ar(DType::F64, ReduceOp::Sum)).unwrap();
        assert_eq!((r.codec, r.key.as_str(), r.feedback), (Codec::Bf16, "b3", false));
        set_next("g", None, "b4");
        assert_eq!(g.request("g", &ar(DType::F32, ReduceOp::Sum)), None, "per-call None means exact");
        assert_eq!(g.request("g", &ar(DType::F32, ReduceOp::Sum)).unwrap().codec, Codec::Int8, "consumed once");
    }
}
