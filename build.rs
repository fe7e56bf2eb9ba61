//! Builds the C++ c10d shim into the extension (feature `python` only).
//!
//! torch's include and library paths and its C++ ABI flag come from the
//! building Python (`PYO3_PYTHON`, which maturin sets, else `python3`). The
//! shim needs no Python headers: it links only c10, torch_cpu and torch, and
//! finds them at run time because `import rustccl` imports torch first (and
//! through an rpath to the installed torch next to rustccl).

use std::process::Command;

const QUERY: &str = r#"
import torch, torch.utils.cpp_extension as ce
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("\n".join(ce.include_paths()))
print("--")
print("\n".join(ce.library_paths()))
"#;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc-shim");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_none() {
        return;
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", QUERY])
        .output()
        .unwrap_or_else(|e| panic!("rustccl build: cannot run {python}: {e}"));
    if !out.status.success() {
        panic!(
            "rustccl build: {python} could not import torch (install torch==2.11.0 first):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let abi = lines.next().unwrap_or("1").trim().to_string();
    let mut includes = Vec::new();
    let mut libs = Vec::new();
    let mut in_libs = false;
    for l in lines {
        if l.trim() == "--" {
            in_libs = true;
        } else if !l.trim().is_empty() {
            if in_libs { libs.push(l.trim().to_string()) } else { includes.push(l.trim().to_string()) }
        }
    }

    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++17")
        .include("csrc-shim")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .flag_if_supported("-fvisibility=hidden")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .opt_level(2)
        .link_lib_modifier("+whole-archive");
    for i in &includes {
        b.include(i);
    }
    let mut sources: Vec<_> = std::fs::read_dir("csrc-shim")
        .expect("rustccl build: csrc-shim/ is missing")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .collect();
    sources.sort();
    b.files(&sources);
    b.compile("rustccl_shim");

    for l in &libs {
        println!("cargo:rustc-link-search=native={l}");
    }
    for lib in ["c10", "torch_cpu", "torch"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // Installed next to torch in site-packages: rustccl/_rustccl.abi3.so.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../torch/lib");
}
