mod common;
use common::*;
use rustccl::{DType, OpKind};
use std::time::Instant;
#[test]
fn per_call() {
    let comms = loopback_comms(1, Default::default());
    let c = &comms[0];
    let b = buf(DType::F32, &[1.0, 2.0]);
    for blocking in [false, true] {
        for _ in 0..3 {
            let t0 = Instant::now();
            let n = 200_000;
            for _ in 0..n {
                let mut s = spec(OpKind::Broadcast);
                s.inputs = vec![t(&b)];
                s.sync = blocking;
                let w = c.submit(vec![s], None, None).unwrap();
                w.wait(None).unwrap();
            }
            eprintln!("blocking={blocking} per call {:.2} us", t0.elapsed().as_secs_f64() / n as f64 * 1e6);
        }
    }
}
