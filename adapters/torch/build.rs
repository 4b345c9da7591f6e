//! Compiles the C++ shim (csrc/shim.cpp) against the libtorch torch-sys links.
//!
//! The libtorch directory comes from torch-sys (`DEP_TCH_LIBTORCH_LIB`), so both always
//! agree. The CUDA half of the shim is compiled when libtorch has `libc10_cuda.so` and
//! the CUDA headers are found: `HANDOFF_CUDA_INCLUDE`, else the pip wheels next to
//! libtorch (`<site-packages>/nvidia/cu13/include`), else `$CUDA_HOME/include` or
//! `/usr/local/cuda/include`. Otherwise the CUDA entry points return an error, and a
//! CPU-only libtorch works.
//!
//! Nothing here links `libtorch_cuda.so`: the shim `dlopen`s it when the process
//! starts, so one binary runs on CPU-only installs and has CUDA where it exists.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-env-changed=HANDOFF_CUDA_INCLUDE");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rustc-check-cfg=cfg(handoff_torch_cuda_shim)");

    let lib = match std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        Some(l) => PathBuf::from(l),
        None => {
            println!(
                "cargo:warning=torch-sys did not report its libtorch directory; set LIBTORCH \
                 (`cargo xtask setup`, then the variables `cargo xtask env` prints)"
            );
            std::process::exit(1);
        }
    };
    let root = lib.parent().map(Path::to_path_buf).unwrap_or_else(|| lib.clone());
    let include = root.join("include");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .std("c++17")
        // System includes: libtorch's headers are not ours to warn about.
        .flag("-isystem")
        .flag(include.display().to_string())
        .flag("-isystem")
        .flag(include.join("torch/csrc/api/include").display().to_string())
        .define("_GLIBCXX_USE_CXX11_ABI", cxx11_abi().as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .file("csrc/shim.cpp");

    let cuda = cuda_include(&root).filter(|_| lib.join("libc10_cuda.so").exists());
    match &cuda {
        Some(dir) => {
            build.flag("-isystem").flag(dir.display().to_string()).define("HANDOFF_TORCH_CUDA", None);
            println!("cargo:rustc-cfg=handoff_torch_cuda_shim");
        }
        None => println!(
            "cargo:warning=handoff-torch: no CUDA headers or no libc10_cuda.so next to {}; \
             the shim's CUDA entry points will return errors",
            lib.display()
        ),
    }
    build.compile("handoff_torch_shim");
    if cuda.is_some() {
        // After the static shim, so that `--as-needed` keeps it: the shim uses it.
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
}

/// torch-sys's own default (PyTorch's pip wheels use the C++11 ABI since 2.7).
fn cxx11_abi() -> String {
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into())
}

fn cuda_include(torch_root: &Path) -> Option<PathBuf> {
    let has_all = |d: &Path| {
        d.join("cuda.h").exists()
            && d.join("cuda_runtime_api.h").exists()
            && d.join("crt/host_defines.h").exists()
    };
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("HANDOFF_CUDA_INCLUDE") {
        candidates.push(PathBuf::from(d));
    }
    if let Some(site) = torch_root.parent() {
        for v in ["cu13", "cu12"] {
            candidates.push(site.join("nvidia").join(v).join("include"));
        }
        candidates.push(site.join("nvidia/cuda_runtime/include"));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.into_iter().find(|d| has_all(d))
}
