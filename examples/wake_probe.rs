//! Probe: what it costs a rank to put its shared-memory worker threads to
//! work after they were idle for a while, as between the phases and calls
//! of medium-sized collectives and sends. One round = `threads` pieces of
//! `piece` bytes each copied (one per thread, the caller taking one),
//! after the caller busy-waited `gap` us. Two pools: rayon's (which the
//! workers used before; its threads sleep soon after their last job) and
//! the workers' team (`transport/shm/team.rs`), whose threads spin for up
//! to `spin` us before they sleep. Prints the median round time.
//! Usage: `cargo run --release --example wake_probe [threads] [piece_kib]`;
//! run several at once to crowd the host as 8 or 16 ranks do.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustccl::transport::shm::Workers;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn busy(us: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

type Bufs = Arc<Vec<Mutex<(Vec<u8>, Vec<u8>)>>>;

fn copy(bufs: &Bufs, i: usize) {
    let mut g = bufs[i].lock().unwrap();
    let (a, b) = &mut *g;
    b.copy_from_slice(a);
    a[0] = a[0].wrapping_add(b[1]);
}

/// The pool the workers used before their team: rayon's, woken for
/// every round (one job per thread, the caller taking one).
fn rayon_round(pool: &rayon::ThreadPool, bufs: &Bufs, threads: usize) {
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= threads {
            break;
        }
        copy(bufs, i);
    };
    pool.in_place_scope(|s| {
        for _ in 0..threads - 1 {
            s.spawn(|_| work());
        }
        work();
    });
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().unwrap());
    let threads = args.next().unwrap_or(8);
    let piece = args.next().unwrap_or(128) << 10;
    let bufs: Bufs = Arc::new((0..threads).map(|_| Mutex::new((vec![1u8; piece], vec![0u8; piece]))).collect());
    let reps = 200;
    let gaps = [0u64, 10, 50, 200, 1000];
    let serial: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            copy(&bufs, 0);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    println!("threads {threads} piece {} KiB: one piece on one thread {:.1} us", piece >> 10, median(serial));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads - 1).build().unwrap();
    for &gap in &gaps {
        let v: Vec<f64> = (0..reps)
            .map(|_| {
                busy(gap);
                let t = Instant::now();
                rayon_round(&pool, &bufs, threads);
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        println!("  rayon     gap {gap:5} us: round {:.1} us", median(v));
    }
    drop(pool);
    for spin_us in [50u64, 200] {
        let wk = Workers::new(threads, "probe", 64, Duration::from_micros(spin_us)).unwrap();
        for &gap in &gaps {
            let v: Vec<f64> = (0..reps)
                .map(|_| {
                    busy(gap);
                    let t = Instant::now();
                    let r: Result<(), ()> = wk.for_each((0..threads).collect(), threads * piece, |i| {
                        copy(&bufs, i);
                        Ok(())
                    });
                    r.unwrap();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            println!("  team spin {spin_us:3} gap {gap:5} us: round {:.1} us", median(v));
        }
    }
}
