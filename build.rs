//! Build script (feature `python` only): the torch this build is for, and
//! the C++ c10d shim as its own shared library.
//!
//! - torch's version, CUDA flavour, C++ ABI flag, include and library paths
//!   come from the building Python (`PYO3_PYTHON`, which maturin sets, else
//!   `python3`). Its version must be the `torch==X` that pyproject.toml pins
//!   (the wheel's metadata says so); it is compiled into the extension
//!   (`rustccl._rustccl.build_info()`), and `import rustccl` compares it with
//!   the running torch before the shim loads.
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

fn query_torch(python: &str) -> Torch {
    let out = Command::new(python).args(["-c", QUERY]).output().unwrap_or_else(|e| panic!("rustccl build: cannot run {python}: {e}"));
    if !out.status.success() {
        panic!(
            "rustccl build: {python} could not import torch. rustccl is built against the torch of the \
             building Python: install the torch that pyproject.toml pins first, and build with \
             `pip install --no-build-isolation .` (see README.md):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
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
    Torch { version, cuda, cxx11_abi, version_file, includes, libs }
}

/// The versions pyproject.toml pins torch to (`"torch==X"`).
fn pinned_torch(pyproject: &str) -> Vec<String> {
    let mut pins: Vec<String> =
        pyproject.split('"').filter_map(|s| s.trim().strip_prefix("torch==")).map(|v| v.trim().to_string()).collect();
    pins.sort();
    pins.dedup();
    pins
}

fn check_pin(torch: &Torch) {
    let text = std::fs::read_to_string("pyproject.toml").expect("rustccl build: cannot read pyproject.toml");
    let pins = pinned_torch(&text);
    let release = torch.version.split('+').next().unwrap_or_default();
    if pins.len() != 1 || pins[0] != release {
        panic!(
            "rustccl build: the building Python has torch {}, but pyproject.toml pins torch=={}. \
             The wheel requires exactly the torch it was compiled against: install that torch, or change \
             every torch== pin in pyproject.toml to build for another one.",
            torch.version,
            pins.join(" and torch==")
        );
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
        .std("c++17")
        .pic(true)
        .include("csrc-shim")
        .define("_GLIBCXX_USE_CXX11_ABI", torch.cxx11_abi.as_str())
        .flag_if_supported("-fvisibility=hidden")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
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
    let torch = query_torch(&python);
    check_pin(&torch);
    // A torch installed over the one built against rebuilds the shim.
    println!("cargo:rerun-if-changed={}", torch.version_file);
    println!("cargo:rustc-env=RUSTCCL_TORCH_VERSION={}", torch.version);
    println!("cargo:rustc-env=RUSTCCL_TORCH_CUDA={}", torch.cuda);
    println!("cargo:rustc-env=RUSTCCL_TORCH_CXX11_ABI={}", torch.cxx11_abi);
    // The shim finds the extension by this name when it is already loaded.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{ENGINE_FILE}");

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("rustccl build: OUT_DIR is not set"));
    build_shim(&torch, &out);
}
