//! Probe: how fast this rank's shared-memory worker threads read another
//! process's memory through the kernel (the rendezvous send's path), by
//! size, threads and piece size, against the same threads copying within
//! the process. Usage: `cargo run --release --example vm_read_probe`
//! (results and what they decided:
//! `benchmarks/results/2026-11-26-h100host-p2p-staged/`).
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use rustccl::transport::shm::{remote, Workers};

const MAX: usize = 32 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        let src = vec![7u8; MAX];
        remote::allow_attach();
        println!("{} {}", std::process::id(), src.as_ptr() as u64);
        std::io::stdout().flush().unwrap();
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).unwrap();
        drop(src);
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap()).arg("serve").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut it = line.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (pid, addr) = (it.next().unwrap() as i32, it.next().unwrap());
    let mut dst = vec![0u8; MAX];
    let local = vec![3u8; MAX];
    let reps = 40;
    for &threads in &[1usize, 2, 4, 8] {
        for &min_piece in &[256usize << 10, 1 << 20] {
            let wk = Workers::new(threads, "probe", min_piece, std::time::Duration::from_micros(200)).unwrap();
            for &size in &[256usize << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 32 << 20] {
                let d = &mut dst[..size];
                let mut tr = Vec::new();
                let mut tc = Vec::new();
                for _ in 0..reps {
                    let t = Instant::now();
                    wk.for_pieces_mut(d, |off, piece| remote::read(pid, addr + off as u64, piece)).unwrap();
                    tr.push(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    let Ok(()) = wk.for_pieces_mut(d, |off, piece| {
                        piece.copy_from_slice(&local[off..off + piece.len()]);
                        Ok::<(), std::convert::Infallible>(())
                    });
                    tc.push(t.elapsed().as_secs_f64());
                }
                let (r, c) = (median(tr), median(tc));
                println!("threads {threads} min_piece {:4} KiB size {:6} KiB: read {:8.1} us {:5.1} GB/s | copy {:8.1} us {:5.1} GB/s", min_piece >> 10, size >> 10, r * 1e6, size as f64 / r / 1e9, c * 1e6, size as f64 / c / 1e9);
            }
        }
    }
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    child.wait().unwrap();
}
