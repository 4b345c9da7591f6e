//! The Python package `handoff` (`python/`, built from the Rust runtime with pyo3 and
//! maturin; not a member of the cargo workspace).
//!
//! - A virtual environment under `.deps/py-venv` (git-ignored) with the pinned test
//!   dependencies ([`PINS`]), made once and reused (remade when the pins change).
//! - Two abi3 wheels (one wheel each for Python >= 3.10), built with maturin
//!   ([`Wheel`]): the **shipped** one (default features, `python/target/wheels/`), which is
//!   what users install and has none of the extension's test seams, and the **hooks** one
//!   (cargo feature `test-hooks`, `python/target/wheels-test-hooks/`, never published),
//!   which adds them: `_handoff._set_route`, `_handoff._mock_ordered` and
//!   `Ordered._mock_advance`.
//! - `cargo xtask test`: `cargo fmt --check` and clippy (`-D warnings`, with and without
//!   `test-hooks`) of `python/Cargo.toml`, both wheels, then `pytest python/tests` (NumPy,
//!   JAX and PyTorch on the CPU; PyTorch from [`TORCH`]) twice: every test on the shipped
//!   wheel, those that need a seam (marked `hooks`) skipped there, then `pytest -m hooks` on
//!   the hooks wheel. The environment is left with the hooks wheel installed.
//! - `cargo xtask gpu-bundle`: both wheels (the hooks one under `hooks/`), the GPU checks
//!   (`bench/gpu_exchange_checks.py`, `gpu_training_checks.py`, `cuda_core_consumer.py`),
//!   the benchmarks (`bench/python_host_cost.py`, `dispatch_cost.py`, `profile_step.py`,
//!   `layer_cost.py`, `train_three_way.py` with the wheels of the packages it compares
//!   with, [`COMPARED`]: jax2torch, torch-jax-interop and what the latter imports) and,
//!   with `--prev-wheel`, an earlier wheel for the A/B go into `gpu-bundle/`; `run.sh`
//!   installs a wheel into a temporary directory with the GPU machine's own Python
//!   (torch and JAX there) and runs the scripts ([`RUN_STEP`]): the scripts that switch
//!   routes in-process with `_set_route` (`gpu_exchange_checks.py`, which checks each
//!   route, and `python_host_cost.py`, which times each) with the hooks wheel, every
//!   other one (and the wheel A/B) with the shipped wheel.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the Python tests need, pinned. JAX 0.10.2 is the newest JAX with wheels for
/// CPython 3.11 (0.11 needs 3.12); its dependencies are pinned too.
pub const PINS: &[&str] = &[
    "maturin==1.16.0",
    "pytest==9.2.0",
    "numpy==2.4.6",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "ml_dtypes==0.7.0",
    "opt_einsum==3.4.0",
    "scipy==1.17.1",
    "hypothesis==6.155.2",
    "sortedcontainers==2.4.0",
    // jax.export's serialization (torch.export of a torch_function layer).
    "flatbuffers==25.12.19",
];

/// PyTorch for the Python tests (on the CPU), installed with `--no-deps`: PyPI's
/// `torch==2.11.0` is the CUDA 13 build, and its own requirements would add triton, the
/// CUDA toolkit's other wheels and cuda-bindings, which the CPU does not need. What
/// `import torch` needs: its pure-Python dependencies, and the CUDA libraries that
/// `libtorch_cuda.so` links against (it loads with `torch._C` even on a CPU; about
/// 2.2 GB of wheels with torch, once).
pub const TORCH: &[&str] = &[
    "torch==2.11.0",
    "filelock==4.3.2",
    "fsspec==2026.9.0",
    "jinja2==3.1.6",
    "markupsafe==3.0.4",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "sympy==1.14.0",
    "typing_extensions==4.16.0",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cupti==13.0.85",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cublas==13.1.0.3",
    "nvidia-cufft==12.0.0.61",
    "nvidia-cufile==1.15.1.6",
    "nvidia-curand==10.4.0.35",
    "nvidia-cusparse==12.6.3.3",
    "nvidia-nvjitlink==13.0.88",
    "nvidia-cudnn-cu13==9.19.0.56",
    "nvidia-cusparselt-cu13==0.8.0",
    "nvidia-nccl-cu13==2.28.9",
    "nvidia-nvshmem-cu13==3.4.5",
];

const VENV: &str = ".deps/py-venv";
const MANIFEST: &str = "python/Cargo.toml";
const WHEELS: &str = "python/target/wheels";
const HOOKS_WHEELS: &str = "python/target/wheels-test-hooks";
/// The hooks wheel's features. maturin's `--features` replaces pyproject.toml's
/// `[tool.maturin] features` (`pyo3/extension-module`) instead of adding to them, so that
/// is named again: the two wheels differ by the test seams only.
const HOOKS_FEATURES: &str = "pyo3/extension-module,test-hooks";

/// Which of the extension's two wheels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Wheel {
    /// Default features: the wheel users install, without any test seam.
    Shipped,
    /// The cargo feature `test-hooks`: the shipped wheel plus the test and benchmark
    /// seams (`_set_route`, `_mock_ordered`, `Ordered._mock_advance`). Never published.
    Hooks,
}

impl Wheel {
    fn out_dir(self) -> &'static str {
        match self {
            Wheel::Shipped => WHEELS,
            Wheel::Hooks => HOOKS_WHEELS,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Wheel::Shipped => "the shipped wheel (default features, no test seams)",
            Wheel::Hooks => "the hooks wheel (--features test-hooks)",
        }
    }
}
/// Ordering, lifetime and host cost of the exchange on CUDA, per route (bundled as
/// `python_gpu_h200.py`, step `python_handoff`).
const GPU_SCRIPT: &str = "bench/gpu_exchange_checks.py";
/// `handoff.torch_function` on CUDA: float64 gradcheck with the backward on PyTorch's
/// autograd thread, `None` gradients, strides, misaligned views (bundled as
/// `python_gpu_training.py`, step `python_gpu_training`).
const GPU_TRAINING_SCRIPT: &str = "bench/gpu_training_checks.py";
/// The training comparison (pure PyTorch, jax2torch, torch-jax-interop,
/// handoff.torch_function, the JAX layer alone).
const TRAIN_SCRIPT: &str = "bench/train_three_way.py";
/// What [`TRAIN_SCRIPT`] compares with, as published on PyPI, and what those import that
/// the GPU machine's Python lacks (it has torch, JAX, NumPy, typing_extensions): pure
/// Python wheels (`py3-none-any`), each a requirement and its wheel's file-name prefix,
/// downloaded once into `.deps/wheels/` and installed there with `--no-deps`.
/// jax2torch 0.0.7 (2021, its last release) and torch-jax-interop 0.0.8 run a JAX
/// function in PyTorch's autograd; torch-jax-interop imports chex (not among its declared
/// requirements), which imports absl-py and toolz.
const COMPARED: &[(&str, &str)] = &[
    ("jax2torch==0.0.7", "jax2torch-0.0.7-"),
    ("torch-jax-interop==0.0.8", "torch_jax_interop-0.0.8-"),
    ("chex==0.1.92", "chex-0.1.92-"),
    ("absl-py==2.5.1", "absl_py-2.5.1-"),
    ("toolz==1.2.0", "toolz-1.2.0-"),
];
/// The host cost of each crossing, both ways: plain `from_dlpack`, through `handoff.ordered`,
/// `handoff.to_jax`/`to_torch` on each route, and the frameworks' own entry points.
const HOST_COST_SCRIPT: &str = "bench/python_host_cost.py";

/// The virtual environment's Python, made (or brought to [`PINS`] and [`TORCH`]) if
/// needed.
pub fn venv(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join(VENV);
    let python = dir.join("bin/python");
    let marker = dir.join("handoff-pins.txt");
    let want = [PINS, TORCH].concat().join("\n");
    if python.exists() && std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(python);
    }
    if !python.exists() {
        println!("xtask: creating {} (the Python tests' environment, once)", dir.display());
        run(Command::new(base_python()).args(["-m", "venv"]).arg(&dir))?;
    }
    println!("xtask: installing {} into {}", PINS.join(" "), dir.display());
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(PINS))?;
    println!("xtask: installing PyTorch 2.11.0 for the CPU into {} (about 2.2 GB, once)", dir.display());
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .args(TORCH))?;
    run(Command::new(&python).args(["-c", "import torch; torch.ones(1).add_(1)"]))
        .map_err(|e| format!("PyTorch does not import in {}: {e}", dir.display()))?;
    std::fs::write(&marker, want).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    Ok(python)
}

/// Builds `which` abi3 wheel with maturin (release) into its own folder and returns its
/// path. The two builds share `python/target/`; each rebuilds the extension crate only.
pub fn build_wheel(root: &Path, python: &Path, which: Wheel) -> Result<PathBuf, String> {
    let out = root.join(which.out_dir());
    if let Ok(entries) = std::fs::read_dir(&out) {
        for e in entries.flatten() {
            if is_wheel(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let maturin = python.with_file_name("maturin");
    let mut build = Command::new(maturin);
    build
        .current_dir(root)
        .env("PYO3_PYTHON", python)
        .args(["build", "--release", "--manifest-path", MANIFEST, "--out"])
        .arg(&out)
        .arg("--interpreter")
        .arg(python);
    if which == Wheel::Hooks {
        build.args(["--features", HOOKS_FEATURES]);
    }
    run(&mut build)?;
    std::fs::read_dir(&out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| is_wheel(p))
        .ok_or_else(|| format!("maturin left no handoff wheel in {}", out.display()))
}

fn is_wheel(p: &Path) -> bool {
    p.file_name().is_some_and(|n| {
        let n = n.to_string_lossy();
        n.starts_with("handoff-") && n.ends_with(".whl")
    })
}

/// `cargo xtask test`'s Python part: lint (when `lint`: rustfmt, clippy without and with
/// `test-hooks`), the README's performance section checked against its logs, both
/// wheels, then pytest on each ([`pytest`]).
pub fn test(root: &Path, lint: bool) -> Result<(), String> {
    let python = venv(root)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if lint {
        run(Command::new(&cargo).current_dir(root).args(["fmt", "--manifest-path", MANIFEST, "--check"]))?;
        for features in [&[][..], &["--features", "test-hooks"][..]] {
            run(Command::new(&cargo)
                .current_dir(root)
                .env("PYO3_PYTHON", &python)
                .args(["clippy", "--manifest-path", MANIFEST, "--all-targets"])
                .args(features)
                .args(["--", "-D", "warnings"]))?;
        }
    }
    // The README's performance table and figure are what the current run's logs give.
    run(Command::new(&python).current_dir(root).args(["bench/readme_performance.py", "--check"]))?;
    let shipped = build_wheel(root, &python, Wheel::Shipped)?;
    let hooks = build_wheel(root, &python, Wheel::Hooks)?;
    pytest(root, &python, &shipped, Wheel::Shipped)?;
    pytest(root, &python, &hooks, Wheel::Hooks)?;
    println!(
        "xtask: Python tests passed: pytest on the shipped wheel ({}), pytest -m hooks on the hooks wheel \
         ({}), which stays installed in {VENV}",
        shipped.display(),
        hooks.display(),
    );
    Ok(())
}

/// Installs `wheel` into the environment and runs pytest on it: on the shipped wheel
/// every test (those marked `hooks` skip, saying why), on the hooks wheel the tests marked
/// `hooks` only (`-m hooks`). `HANDOFF_TEST_HOOKS` (`absent`, `present`) makes
/// `python/tests/conftest.py` stop the run if the installed wheel is not the one meant.
fn pytest(root: &Path, python: &Path, wheel: &Path, which: Wheel) -> Result<(), String> {
    let install =
        ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--force-reinstall", "--no-deps"];
    run(Command::new(python).args(install).arg(wheel))?;
    let (expect, only): (&str, &[&str]) = match which {
        Wheel::Shipped => ("absent", &[]),
        Wheel::Hooks => ("present", &["-m", "hooks"]),
    };
    println!(
        "xtask: pytest on {} ({}){}",
        which.describe(),
        wheel.display(),
        if only.is_empty() { "" } else { ": the tests marked hooks" }
    );
    run(Command::new(python)
        .current_dir(root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("HANDOFF_TEST_HOOKS", expect)
        .args(["-m", "pytest", "python/tests", "-q", "-rs", "-p", "no:cacheprovider"])
        .args(only))
    .map_err(|e| format!("pytest on {} ({}): {e}", which.describe(), wheel.display()))
}

/// Builds both wheels and copies them (the hooks wheel into `hooks/`: the scripts that
/// switch routes with `_set_route` run with it, see [`RUN_STEP`]), the GPU scripts, the
/// benchmarks, the wheels of the packages the training comparison compares with
/// ([`COMPARED`]) and, for the A/B, a previous handoff wheel (into `prev/`) into the
/// bundle directory `out`; returns the bytes added.
pub fn bundle(root: &Path, out: &Path, prev_wheel: Option<&Path>) -> Result<u64, String> {
    let python = venv(root)?;
    let wheel = build_wheel(root, &python, Wheel::Shipped)?;
    let hooks_wheel = build_wheel(root, &python, Wheel::Hooks)?;
    let file_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    std::fs::create_dir_all(out.join("hooks")).map_err(|e| e.to_string())?;
    let mut files = vec![
        (wheel.clone(), file_name(&wheel)),
        (hooks_wheel.clone(), format!("hooks/{}", file_name(&hooks_wheel))),
        (root.join(GPU_SCRIPT), "python_gpu_h200.py".to_string()),
        (root.join(GPU_TRAINING_SCRIPT), "python_gpu_training.py".to_string()),
        (root.join(TRAIN_SCRIPT), "train_three_way.py".to_string()),
        (root.join(HOST_COST_SCRIPT), "python_host_cost.py".to_string()),
        (root.join("bench/dispatch_cost.py"), "dispatch_cost.py".to_string()),
        (root.join("bench/profile_step.py"), "profile_step.py".to_string()),
        (root.join("bench/layer_cost.py"), "layer_cost.py".to_string()),
        (root.join("bench/cuda_core_consumer.py"), "cuda_core_consumer.py".to_string()),
        (root.join("bench/gpu_graph_checks.py"), "gpu_graph_checks.py".to_string()),
        (root.join("bench/jax_function_checks.py"), "jax_function_checks.py".to_string()),
        (root.join("bench/graph_memory_spike.py"), "graph_memory_spike.py".to_string()),
        (root.join("bench/layer_profile.py"), "layer_profile.py".to_string()),
        (root.join("bench/crossing_parts.py"), "crossing_parts.py".to_string()),
        // What the scripts above share; they import it from their own folder.
        (root.join("bench/harness.py"), "harness.py".to_string()),
        // The DLPack structs [`GPU_SCRIPT`] builds its lifetime control with (pytest's
        // helper in the repository; beside the scripts in the bundle).
        (root.join("python/tests/dlpack_ctypes.py"), "dlpack_ctypes.py".to_string()),
    ];
    if let Some(prev) = prev_wheel {
        std::fs::create_dir_all(out.join("prev")).map_err(|e| e.to_string())?;
        files.push((prev.to_path_buf(), format!("prev/{}", file_name(prev))));
    }
    for (requirement, prefix) in COMPARED {
        let w = pypi_wheel(root, &python, requirement, prefix)?;
        let name = file_name(&w);
        files.push((w, name));
    }
    let mut size = 0;
    for (src, name) in files {
        let dst = out.join(&name);
        std::fs::copy(&src, &dst).map_err(|e| format!("cannot copy {}: {e}", src.display()))?;
        let len = std::fs::metadata(&dst).map_err(|e| e.to_string())?.len();
        println!("xtask: bundled {name:<48} {:>6.1} MiB", len as f64 / (1 << 20) as f64);
        size += len;
    }
    Ok(size)
}

/// The wheel of `requirement` (one of [`COMPARED`], its file name starting with
/// `prefix`) in `.deps/wheels/`, downloaded once (pure Python, no dependencies
/// installed: the GPU machine has torch and JAX, and no network).
fn pypi_wheel(root: &Path, python: &Path, requirement: &str, prefix: &str) -> Result<PathBuf, String> {
    let dir = root.join(".deps/wheels");
    let find = || {
        std::fs::read_dir(&dir).ok().and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(prefix) && n.ends_with("-py3-none-any.whl")
                })
            })
        })
    };
    if let Some(w) = find() {
        return Ok(w);
    }
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            requirement,
            "-d",
        ])
        .arg(&dir))?;
    find().ok_or_else(|| {
        format!(
            "pip download {requirement} left no pure-Python wheel ({prefix}*-py3-none-any.whl) in {}",
            dir.display()
        )
    })
}

/// The `run.sh` steps of the Python package, each through one shell function,
/// `py_step <name> <script> <limit s> [args...]` (the shipped wheel) or `hooks_step ...`
/// (the hooks wheel, `hooks/handoff-*.whl`: for the scripts that switch routes with the
/// test seam `_set_route`, `python_gpu_h200.py` and `python_host_cost.py`): that handoff
/// wheel (and, for the training comparison, the compared packages' wheels, [`COMPARED`])
/// installed with the GPU machine's Python into a temporary directory (no network:
/// `--no-index`, else unzipped), the script run with it on `PYTHONPATH` under a time
/// limit, the wheel it used and its JSON lines shown, its log (the wheel's name first) in
/// `$LOGS/<name>.log`, a non-zero exit a failed step. `ONLY=<name>`
/// runs the steps whose name contains it. Then, only where the bundle holds a previous
/// handoff wheel (`prev/handoff-*.whl`), the A/B of the two wheels at the GPU-bound
/// sizes (step `wheel_ab`): the training script's light run (pure PyTorch and handoff,
/// 3 × 10 steps) with each wheel in turns, `AB_ROUNDS` times (default 2), then its
/// `--ab` report.
pub const RUN_STEP: &str = include_str!("python_steps.sh");

fn base_python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    println!("xtask: {cmd:?}");
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed ({status})")) }
}

#[cfg(test)]
mod tests {
    /// The Python part of `cargo xtask test` alone (venv, lint, both wheels, pytest on
    /// each): `cargo test -p xtask -- --ignored python_suite`.
    #[test]
    #[ignore = "builds the wheel and runs pytest; part of `cargo xtask test`"]
    fn python_suite() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        super::test(&root, true).unwrap();
    }
}
