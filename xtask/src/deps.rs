//! What the adapters need that cargo does not fetch, installed from PyPI into
//! `.deps/` (git-ignored) and reused when already there:
//!
//! - PyTorch 2.11.0's libraries for `tch` 0.24 (when `adapters/torch` exists), with
//!   the three small CUDA wheels `libtorch_cpu.so` links against;
//! - the PJRT CPU plugin for the XLA tests (when `adapters/xla` exists).

use std::path::{Path, PathBuf};
use std::process::Command;

const TORCH_WHEELS: &[&str] = &[
    "torch==2.11.0",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cupti==13.0.85",
    "nvidia-cuda-crt==13.0.88",
];
const PJRT_CPU_WHEEL: &str = "lammps-jax-pjrt-cpu==0.11.2";
const PJRT_CPU_SO: &str = "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so";

/// The environment the build and the tests run with.
#[derive(Default)]
pub struct Env {
    pub libtorch: Option<PathBuf>,
    pub pjrt_plugin: Option<PathBuf>,
}

impl Env {
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        if let Some(t) = &self.libtorch {
            v.push(("LIBTORCH".into(), t.display().to_string()));
            let lib = t.join("lib").display().to_string();
            let ld = match std::env::var("LD_LIBRARY_PATH") {
                Ok(old) if !old.is_empty() => format!("{lib}:{old}"),
                _ => lib,
            };
            v.push(("LD_LIBRARY_PATH".into(), ld));
        }
        if let Some(p) = &self.pjrt_plugin {
            v.push(("HANDOFF_PJRT_PLUGIN".into(), p.display().to_string()));
        }
        v
    }
}

pub fn setup(root: &Path) -> Result<Env, String> {
    let deps = root.join(".deps");
    let mut env = Env::default();
    if root.join("adapters/torch").exists() {
        env.libtorch = Some(torch(&deps)?);
    }
    if root.join("adapters/xla").exists() {
        env.pjrt_plugin = Some(pjrt_cpu(&deps)?);
    }
    Ok(env)
}

fn torch(deps: &Path) -> Result<PathBuf, String> {
    let target = deps.join("python");
    let libtorch = target.join("torch");
    let marker = deps.join("torch-2.11.0.ok");
    if marker.exists() && libtorch.join("lib/libtorch_cpu.so").exists() {
        return Ok(libtorch);
    }
    println!("xtask: installing PyTorch 2.11.0 libraries into {} (about 1.3 GB, once)", target.display());
    let mut args = vec!["-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target"];
    let t = target.display().to_string();
    args.push(&t);
    args.extend(TORCH_WHEELS);
    run(Command::new(python()).args(&args))?;
    if !libtorch.join("lib/libtorch_cpu.so").exists() {
        return Err(format!("pip ran but {} has no lib/libtorch_cpu.so", libtorch.display()));
    }
    std::fs::write(&marker, "").map_err(|e| e.to_string())?;
    Ok(libtorch)
}

fn pjrt_cpu(deps: &Path) -> Result<PathBuf, String> {
    let dir = deps.join("pjrt");
    let so = dir.join("pjrt_c_api_cpu_plugin.so");
    if so.exists() {
        return Ok(so);
    }
    println!("xtask: fetching the PJRT CPU plugin ({PJRT_CPU_WHEEL}, about 200 MB unpacked, once)");
    let wheels = deps.join("wheels");
    let w = wheels.display().to_string();
    run(Command::new(python()).args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        PJRT_CPU_WHEEL,
        "-d",
        &w,
    ]))?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("lammps_jax_pjrt_cpu-")))
        .ok_or("pip download left no lammps_jax_pjrt_cpu wheel")?;
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let script = "import sys, zipfile, shutil\nz = zipfile.ZipFile(sys.argv[1])\nwith z.open(sys.argv[2]) as s, open(sys.argv[3], 'wb') as d: shutil.copyfileobj(s, d)";
    let tmp = dir.join("plugin.so.part");
    run(Command::new(python()).args([
        "-c",
        script,
        &wheel.display().to_string(),
        PJRT_CPU_SO,
        &tmp.display().to_string(),
    ]))?;
    std::fs::rename(&tmp, &so).map_err(|e| e.to_string())?;
    Ok(so)
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed ({status})")) }
}
