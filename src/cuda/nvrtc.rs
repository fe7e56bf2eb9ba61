//! Run-time compilation of CUDA C++ with NVRTC, through cudarc.
//!
//! cudarc opens `libnvrtc.so.<major>` by name. torch's CUDA wheels ship
//! NVRTC in their `nvidia/*/lib` folders and usually load it, so the name
//! resolves to that copy; `RUSTCCL_NVRTC_LIBRARY` names another one, and a
//! libnvrtc found next to a loaded CUDA runtime is used when nothing has
//! loaded NVRTC yet. NVRTC opens `libnvrtc-builtins` the same way, so it is
//! loaded first from the same folder.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::config::Config;

/// Makes libnvrtc (and its builtins) loadable by name, once per process.
fn load() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let explicit = Config::get().nvrtc_library.clone().map(PathBuf::from);
            if let Some(lib) = explicit.clone().or_else(beside_loaded_runtime) {
                preload(&lib)?;
            }
            // SAFETY: probing tries dlopen on candidate names only.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                Ok(())
            } else {
                Err("libnvrtc could not be loaded (set RUSTCCL_NVRTC_LIBRARY to its path)".into())
            }
        })
        .clone()
}

/// A libnvrtc in the folder of a CUDA library this process has loaded.
fn beside_loaded_runtime() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    if maps.contains("/libnvrtc.so") {
        return None; // already loaded: cudarc finds it by name
    }
    let dirs = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("/libcudart.so") || p.contains("/libcublas.so"))
        .filter_map(|p| Path::new(p).parent().map(Path::to_path_buf));
    for d in dirs {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&d)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc.so.")))
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Some(p);
        }
    }
    None
}

/// Loads `lib` and the builtins beside it with RTLD_GLOBAL, for good.
fn preload(lib: &Path) -> Result<(), String> {
    let dir = lib.parent().unwrap_or(Path::new("."));
    let builtins = std::fs::read_dir(dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")));
    for p in builtins.iter().chain(std::iter::once(&lib.to_path_buf())) {
        // SAFETY: loading NVIDIA's libraries runs their initialisers, which
        // have no preconditions; the handle is leaked so they stay loaded.
        let l = unsafe { libloading::os::unix::Library::open(Some(p), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
            .map_err(|e| format!("loading {}: {e}", p.display()))?;
        std::mem::forget(l);
    }
    Ok(())
}

/// Compiles `src` to PTX for compute capability `cc`; the error carries
/// NVRTC's log.
pub fn compile(src: &str, name: &str, cc: (i32, i32)) -> Result<String, String> {
    load()?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1), "--std=c++17".into()],
        name: Some(name.into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| format!("NVRTC: {e:?}"))?;
    Ok(ptx.to_src())
}
