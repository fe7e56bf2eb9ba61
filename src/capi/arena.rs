//! The C ABI of the shared tensor arena (`transport::shm::arena`), for the
//! shim's CPU allocator (`csrc-shim/allocator.cpp`).

use std::ffi::c_void;

use super::{guarded, set_last_error};
use crate::config::shm_tensors_sizes;
use crate::error::Code;
use crate::transport::shm::arena::Arena;

/// Creates this process's arena from the settings (once; later calls
/// return at once). Its smallest allocation in bytes, or -1 with the
/// reason in `rustccl_last_error`.
#[no_mangle]
pub extern "C" fn rustccl_arena_enable() -> i64 {
    let mut min = -1;
    let code = guarded("rustccl_arena_enable", || {
        // Not through `Config::get()`: this runs at `import rustccl`, and
        // the settings a script sets after the import (a host identity,
        // say) must still count when its group starts.
        let (smallest, cache) = shm_tensors_sizes();
        // Address space for the host's memory: its pages cost nothing
        // until a tensor touches them.
        // SAFETY: sysconf takes plain integers.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        let len = (pages.max(1) as u64) * (page.max(4096) as u64);
        match Arena::enable(len, smallest.max(1), cache as u64) {
            Ok(a) => {
                min = a.min_bytes as i64;
                0
            }
            Err(e) => {
                set_last_error(&format!("rustccl: cannot create the shared tensor arena (RUSTCCL_SHM_TENSORS=1): {e}"));
                Code::Backend as i32
            }
        }
    });
    if code == 0 {
        min
    } else {
        -1
    }
}

/// `n` bytes from the arena, or null (below its smallest allocation, full,
/// not enabled, or in a forked child): the caller allocates elsewhere.
#[no_mangle]
pub extern "C" fn rustccl_arena_alloc(n: usize) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    guarded("rustccl_arena_alloc", || {
        if let Some(a) = Arena::get() {
            p = a.alloc(n).map_or(std::ptr::null_mut(), |q| q.cast());
        }
        0
    });
    p
}

/// 1 when `p` lies in this process's arena.
#[no_mangle]
pub extern "C" fn rustccl_arena_owns(p: *const c_void) -> i32 {
    Arena::owns(p.cast()) as i32
}

/// Gives back a pointer of `rustccl_arena_alloc`.
#[no_mangle]
pub extern "C" fn rustccl_arena_free(p: *mut c_void) {
    guarded("rustccl_arena_free", || {
        Arena::release(p.cast());
        0
    });
}
