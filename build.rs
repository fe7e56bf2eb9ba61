//! Build script (feature `python` only): the torch this build is for, and
//! the C++ c10d shim as its own shared library.
//!
//! - torch's version, CUDA flavour, C++ ABI flag, include and library paths
//!   come from the building Python (`PYO3_PYTHON`, which maturin sets, else
//!   `python3`), when it has torch: the wheel then carries a shim prebuilt
//!   for that torch's minor release, and its version is compiled into the
//!   extension (`rustccl._rustccl.build_info()`). Without torch (pip's
//!   build isolation) the build makes the engine alone, and `import
//!   rustccl` compiles the shim for the running torch (`rustccl._shims`).
//! - Shims prebuilt for other torch releases (`scripts/prebuild_shims.py`,
//!   `RUSTCCL_BUILD_SHIMS_DIR`) go into `rustccl/_shims/<tag>/`, and the
//!   shim's sources into `rustccl/_shim_src/`, for a torch that no prebuilt
//!   shim serves.
//! - The shim is linked into `OUT_DIR/_shim.so`, which pyproject.toml puts
//!   into the wheel beside the extension. Only the shim links libtorch (c10,
//!   torch_cpu, torch: found at run time because torch is imported first, and
//!   through an rpath to the installed torch next to rustccl); the extension
//!   `_rustccl.abi3.so` links none, so the numpy `Communicator` works
//!   without torch. The shim calls the engine's C ABI (`csrc-shim/rustccl.h`)
//!   in `_rustccl.abi3.so`: it names that file as a needed library (linked
//!   against an empty stand-in of that name here, found at run time through
//!   the rpath `$ORIGIN`), so the dynamic loader binds it to the extension
//!   Python has already loaded.

use std::path::{Path, PathBuf};
use std::process::Command;

/// File name of the extension module (maturin's name for `rustccl._rustccl`
/// with PyO3's abi3 feature on Linux).
const ENGINE_FILE: &str = "_rustccl.abi3.so";

const QUERY: &str = r#"
import os, torch, torch.utils.cpp_extension as ce
print(torch.__version__)
print(torch.version.cuda or "")
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(os.path.join(os.path.dirname(torch.__file__), "version.py"))
print("\n".join(ce.include_paths()))
print("--")
print("\n".join(ce.library_paths()))
"#;

struct Torch {
    version: String,
    cuda: String,
    cxx11_abi: String,
    version_file: String,
    includes: Vec<String>,
    libs: Vec<String>,
}

/// The building Python's torch, or None when it has none.
fn query_torch(python: &str) -> Option<Torch> {
    let out = Command::new(python).args(["-c", QUERY]).output().unwrap_or_else(|e| panic!("rustccl build: cannot run {python}: {e}"));
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines().map(str::trim);
    let mut next = || lines.next().unwrap_or_default().to_string();
    let (version, cuda, cxx11_abi, version_file) = (next(), next(), next(), next());
    let (mut includes, mut libs, mut in_libs) = (Vec::new(), Vec::new(), false);
    for l in text.lines().skip(4).map(str::trim).filter(|l| !l.is_empty()) {
        if l == "--" {
            in_libs = true;
        } else if in_libs {
            libs.push(l.to_string())
        } else {
            includes.push(l.to_string())
        }
    }
    Some(Torch { version, cuda, cxx11_abi, version_file, includes, libs })
}

/// The C++ standard torch's headers need: 2.12 and later use C++20.
fn cxx_std(version: &str) -> &'static str {
    let mut parts = version.split(['.', '+']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) <= (2, 11) {
        "c++17"
    } else {
        "c++20"
    }
}

/// The torch releases a wheel may carry a prebuilt shim for, beside the
/// one of the building torch: pyproject.toml lists the same names.
const PREBUILT_TAGS: [&str; 5] =
    ["torch2.11-cxx11abi1", "torch2.12-cxx11abi1", "torch2.13-cxx11abi1", "torch2.14-cxx11abi1", "torch2.15-cxx11abi1"];

/// Copies the shims that `scripts/prebuild_shims.py` built into
/// `$RUSTCCL_BUILD_SHIMS_DIR` to `out/_shims/<tag>/_shim.so`; a tag it has
/// none for gets an empty file, which the loader never takes.
fn ship_prebuilt(out: &Path) {
    println!("cargo:rerun-if-env-changed=RUSTCCL_BUILD_SHIMS_DIR");
    let from = std::env::var_os("RUSTCCL_BUILD_SHIMS_DIR").map(PathBuf::from);
    for tag in PREBUILT_TAGS {
        let dir = out.join("_shims").join(tag);
        std::fs::create_dir_all(&dir).expect("rustccl build: cannot create OUT_DIR/_shims");
        let shim = from.as_ref().map(|d| d.join(tag).join("_shim.so")).filter(|p| p.is_file());
        match shim {
            Some(p) => {
                println!("cargo:rerun-if-changed={}", p.display());
                std::fs::copy(&p, dir.join("_shim.so")).expect("rustccl build: cannot copy a prebuilt shim");
            }
            None => std::fs::write(dir.join("_shim.so"), b"").expect("rustccl build: cannot write a placeholder shim"),
        }
    }
}

/// Copies the shim's sources into `out/_shim_src/`, from where the wheel
/// takes them (pyproject.toml).
fn ship_sources(out: &Path) {
    let dir = out.join("_shim_src");
    std::fs::create_dir_all(&dir).expect("rustccl build: cannot create OUT_DIR/_shim_src");
    for e in std::fs::read_dir("csrc-shim").expect("rustccl build: csrc-shim/ is missing").flatten() {
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("rustccl build: cannot copy the shim's sources");
    }
}

/// An empty shared library named like the extension, for the shim to link
/// against (the real one is linked after this script runs).
fn engine_stand_in(out: &Path, compiler: &cc::Tool) -> PathBuf {
    let dir = out.join("engine-stand-in");
    std::fs::create_dir_all(&dir).expect("rustccl build: cannot create OUT_DIR/engine-stand-in");
    let src = dir.join("empty.c");
    std::fs::write(&src, "/* stands in for the extension when linking the shim */\n").expect("rustccl build: cannot write empty.c");
    let status = Command::new(compiler.path())
        .args(["-shared", "-x", "c"])
        .arg(&src)
        .arg("-o")
        .arg(dir.join(ENGINE_FILE))
        .status()
        .expect("rustccl build: cannot run the C compiler");
    assert!(status.success(), "rustccl build: linking the stand-in {ENGINE_FILE} failed");
    dir
}

fn build_shim(torch: &Torch, out: &Path) {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std(cxx_std(&torch.version))
        .pic(true)
        .include("csrc-shim")
        .define("_GLIBCXX_USE_CXX11_ABI", torch.cxx11_abi.as_str())
        .flag_if_supported("-fvisibility=hidden")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        // Like the shims prebuilt for other releases: no debug info in a
        // release wheel, where it would be most of the wheel's size.
        .debug(std::env::var("PROFILE").as_deref() != Ok("release"))
        .opt_level(2);
    for i in &torch.includes {
        b.include(i);
    }
    let mut sources: Vec<_> = std::fs::read_dir("csrc-shim")
        .expect("rustccl build: csrc-shim/ is missing")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .collect();
    sources.sort();
    b.files(&sources);
    let objects = b.compile_intermediates();
    let compiler = b.get_compiler();
    let stand_in = engine_stand_in(out, &compiler);

    let mut link = Command::new(compiler.path());
    link.args(["-shared", "-o"]).arg(out.join("_shim.so")).args(&objects);
    for l in &torch.libs {
        link.arg(format!("-L{l}"));
    }
    link.args(["-lc10", "-ltorch_cpu", "-ltorch"])
        .arg(format!("-L{}", stand_in.display()))
        .args(["-Wl,--no-as-needed", &format!("-l:{ENGINE_FILE}"), "-Wl,--as-needed"])
        // Installed as site-packages/rustccl/_shim.so: torch's libraries in
        // ../torch/lib, the engine beside it.
        .args(["-Wl,-rpath,$ORIGIN/../torch/lib:$ORIGIN", "-Wl,--gc-sections"]);
    let status = link.status().expect("rustccl build: cannot run the C++ compiler to link the shim");
    assert!(status.success(), "rustccl build: linking _shim.so failed: {link:?}");
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc-shim");
    println!("cargo:rerun-if-changed=pyproject.toml");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_none() {
        return;
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    // The shim finds the extension by this name when it is already loaded.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{ENGINE_FILE}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("rustccl build: OUT_DIR is not set"));
    ship_sources(&out);
    ship_prebuilt(&out);
    let Some(torch) = query_torch(&python) else {
        println!("cargo:warning=rustccl: {python} has no torch: no prebuilt shim; import compiles one for the running torch");
        for var in ["VERSION", "CUDA", "CXX11_ABI"] {
            println!("cargo:rustc-env=RUSTCCL_TORCH_{var}=");
        }
        // The wheel's file list names it: an empty file, which the loader
        // never takes (build_info() says no torch).
        std::fs::write(out.join("_shim.so"), b"").expect("rustccl build: cannot write OUT_DIR/_shim.so");
        return;
    };
    // A torch installed over the one built against rebuilds the shim.
    println!("cargo:rerun-if-changed={}", torch.version_file);
    println!("cargo:rustc-env=RUSTCCL_TORCH_VERSION={}", torch.version);
    println!("cargo:rustc-env=RUSTCCL_TORCH_CUDA={}", torch.cuda);
    println!("cargo:rustc-env=RUSTCCL_TORCH_CXX11_ABI={}", torch.cxx11_abi);
    build_shim(&torch, &out);
}
