//! Cross-memory attach: reading another local rank's memory straight from
//! its address space (`process_vm_readv`), or writing into it
//! (`process_vm_writev`), so a byte crosses between two ranks of one host
//! in one copy instead of two (into a shared segment and out of it).
//!
//! Reads, and one kind of write ([`write()`]): into a buffer the peer posted
//! in its table for this rank to fill in the current operation (a gather's
//! outputs, a reduce root's buffer, a 2-rank broadcast's receiving buffer;
//! `Window::push`); nothing else of a peer's is ever written. The
//! kernel checks every remote address (a wrong one is `EFAULT`, never a
//! fault here) and the caller's permission to attach (same user; with Yama's
//! `ptrace_scope` 1 the target must allow it, see [`allow_attach`]). A
//! pid from another pid namespace reads the wrong process or fails: the
//! [`probe`] at setup compares a canary value read through the peer's
//! published pid and address with the one it published in shared memory,
//! and the group uses attach only when every pair passed.
#![allow(unsafe_code)]

use std::io;
use std::sync::Once;

/// Lets every process of this user read this one's memory, as Open MPI's
/// and MPICH's single-copy transports do: without it, Yama's
/// `ptrace_scope` 1 (Ubuntu's default) refuses sibling processes such as
/// torchrun's ranks. Without Yama the call fails and changes nothing.
pub fn allow_attach() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) takes plain
        // integers and touches no memory of ours; failure is harmless.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY as libc::c_ulong, 0, 0, 0);
        }
    });
}

/// Copies `dst.len()` bytes at `addr` in process `pid` into `dst`.
pub fn read(pid: i32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    let len = dst.len();
    whole(pid, addr, len, |done| {
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr().cast(), iov_len: len - done };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: `local` describes `dst[done..]`, memory we own mutably
        // for the whole call; the remote range is checked by the kernel,
        // which fails with EFAULT / ESRCH / EPERM rather than touching
        // anything else. Nothing is read from `remote` in this process.
        unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) }
    })
}

/// Copies `src` to `addr` in process `pid`: only into a buffer that
/// process posted for this one to fill (see the module docs).
pub fn write(pid: i32, addr: u64, src: &[u8]) -> io::Result<()> {
    let len = src.len();
    whole(pid, addr, len, |done| {
        let local = libc::iovec { iov_base: src[done..].as_ptr() as *mut libc::c_void, iov_len: len - done };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: `local` describes `src[done..]`, which the kernel only
        // reads (the iovec's pointer is `*mut` by type alone); the remote
        // range is checked by the kernel, which fails with EFAULT / ESRCH /
        // EPERM rather than touching anything else, and is a buffer the
        // peer posted for us to fill (the caller's contract).
        unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) }
    })
}

/// Calls `step(done)` (one transfer of the bytes from `done` on, returning
/// what the system call returned) until `len` bytes moved; retries on EINTR.
fn whole(pid: i32, addr: u64, len: usize, mut step: impl FnMut(usize) -> isize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        match step(done) {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("process {pid} moved 0 bytes at {addr:#x}+{done}"))),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// [`read_and_copy_speed`] of 1 MiB, measured once per process: every
/// group set up later reuses it instead of timing again.
pub fn read_and_copy_speed_once() -> Option<(f64, f64)> {
    static SPEED: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    *SPEED.get_or_init(|| read_and_copy_speed(1 << 20))
}

/// Bytes per second one thread moves (best of a few tries) reading `len`
/// bytes of memory through the kernel as a peer would (this process's own,
/// the same path), and copying them in user space; None when the read
/// fails. The buffers stay in cache, where most transfers are staged.
pub fn read_and_copy_speed(len: usize) -> Option<(f64, f64)> {
    let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut dst = vec![0u8; len];
    let pid = std::process::id() as i32;
    let best = |f: &mut dyn FnMut() -> io::Result<()>| -> io::Result<f64> {
        let mut t = f64::INFINITY;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            f()?;
            t = t.min(t0.elapsed().as_secs_f64());
        }
        Ok(len as f64 / t.max(1e-9))
    };
    let read = best(&mut || read(pid, src.as_ptr() as u64, &mut dst)).ok()?;
    let copy = best(&mut || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        Ok(())
    })
    .ok()?;
    Some((read, copy))
}

/// Whether this process can read `expect` at `addr` of process `pid`.
pub fn probe(pid: i32, addr: u64, expect: u64) -> bool {
    let mut b = [0u8; 8];
    read(pid, addr, &mut b).is_ok() && u64::from_ne_bytes(b) == expect
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_bad_addresses() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pid = std::process::id() as i32;
        read(pid, src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(src, dst);
        let canary = Box::new(0x5eed_u64);
        assert!(probe(pid, &*canary as *const u64 as u64, 0x5eed));
        assert!(!probe(pid, &*canary as *const u64 as u64, 0x5eee));
        assert!(read(pid, 8, &mut dst[..8]).is_err(), "an unmapped address is an error, not a fault");
    }

    #[test]
    fn measures_both_speeds() {
        let (read, copy) = read_and_copy_speed(1 << 20).expect("own memory is readable");
        assert!(read > 1e6 && copy > 1e6, "{read} {copy}");
    }
}
