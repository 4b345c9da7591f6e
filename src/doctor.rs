//! `handoff doctor`: what a user needs when something does not work — the registered
//! adapters and their capabilities, and for libtorch, PJRT plugins and CUDA whether
//! they were found, and why not. It never fails: every line says found or not.
//!
//! Each check is answered by the adapter of that name when it is linked into the
//! program and registers a [`probe`](crate::registry::Adapter::probe) (`torch` for
//! libtorch, `xla` for PJRT plugins, `cuda` for CUDA devices); otherwise the line says
//! the adapter is not built, with what a look at the file system found.
//!
//! ```
//! let report = handoff::doctor::report();
//! assert!(report.contains("mock"));
//! assert!(report.contains("libtorch"));
//! ```

use crate::registry::{self, Adapter, Probe, ProbeStatus, RegistryError};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// A check of the environment that a built-in adapter answers.
struct Check {
    subject: &'static str,
    adapter: &'static str,
    /// What can be told without the adapter.
    fallback: fn() -> Vec<Probe>,
}

const CHECKS: &[Check] = &[
    Check { subject: "libtorch", adapter: "torch", fallback: libtorch_files },
    Check { subject: "PJRT plugins", adapter: "xla", fallback: pjrt_files },
    Check { subject: "CUDA devices", adapter: "cuda", fallback: cuda_files },
];

/// Runs an adapter's probe, turning a panic into a line.
pub fn run_probe(adapter: &Adapter) -> Vec<Probe> {
    let Some(probe) = adapter.probe else {
        return vec![Probe::not_checked(adapter.name, "the adapter registers no probe")];
    };
    catch_unwind(AssertUnwindSafe(probe)).unwrap_or_else(|_| {
        vec![Probe::not_found(adapter.name, "its probe panicked; please report this as a bug of the adapter")]
    })
}

/// The environment checks: libtorch, PJRT plugins, CUDA devices, then the probes of
/// any other registered adapter.
pub fn checks() -> Vec<Probe> {
    let mut out = Vec::new();
    for check in CHECKS {
        match registry::find(check.adapter) {
            Ok(adapter) => out.extend(run_probe(adapter)),
            Err(e @ RegistryError::Ambiguous { .. }) => {
                // Every one of them is probed: the user has to pick one to unlink.
                out.push(Probe::not_found(check.subject, e.to_string()));
                for adapter in registry::list().into_iter().filter(|a| a.name == check.adapter) {
                    out.extend(run_probe(adapter));
                }
            }
            Err(_) => {
                out.push(Probe::not_checked(
                    check.subject,
                    format!("adapter `{}` not built into this program", check.adapter),
                ));
                out.extend(catch_unwind(check.fallback).unwrap_or_default());
            }
        }
    }
    for adapter in registry::list() {
        if adapter.probe.is_some() && !CHECKS.iter().any(|c| c.adapter == adapter.name) {
            out.extend(run_probe(adapter));
        }
    }
    out
}

/// One line per registered adapter: name, version, capability, devices, dtypes.
pub fn adapter_lines() -> Vec<String> {
    let adapters = registry::list();
    let mut lines: Vec<String> = adapters
        .iter()
        .map(|a| {
            let devices: Vec<String> = a.devices.iter().map(|d| d.to_string()).collect();
            let dtypes: Vec<String> = a.dtypes.iter().map(|&d| crate::dtype::name(d)).collect();
            let dtypes = if a.dtypes.len() == crate::dtype::ALL.len() {
                format!("all {}", dtypes.len())
            } else {
                dtypes.join(", ")
            };
            let mut line = format!(
                "{} {}: {}; devices: {}; dtypes: {}",
                a.name,
                a.version,
                a.capability(),
                if devices.is_empty() { "none".into() } else { devices.join(", ") },
                if dtypes.is_empty() { "none".into() } else { dtypes },
            );
            if !a.about.is_empty() {
                line.push_str(&format!(" — {}", a.about));
            }
            line
        })
        .collect();
    // A name registered twice: the warning is the registry's own refusal.
    let mut names: Vec<&str> = adapters.iter().map(|a| a.name).collect();
    names.dedup(); // `list` is sorted by name
    for name in names {
        if let Err(e @ RegistryError::Ambiguous { .. }) = registry::find(name) {
            lines.push(format!("warning: {e}"));
        }
    }
    lines
}

/// The whole report, as `handoff doctor` prints it.
pub fn report() -> String {
    let mut s = format!("handoff {} doctor\n\n", env!("CARGO_PKG_VERSION"));
    let adapters = adapter_lines();
    s.push_str(&format!("adapters ({} registered):\n", registry::list().len()));
    for l in adapters {
        s.push_str(&format!("  {l}\n"));
    }
    s.push_str("\nenvironment:\n");
    for p in checks() {
        let mark = match p.status {
            ProbeStatus::Found => "ok ",
            ProbeStatus::NotFound => "no ",
            ProbeStatus::NotChecked => " - ",
        };
        s.push_str(&format!("  {mark} {p}\n"));
    }
    s
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/cuda/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn find_in(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| p.exists())
}

fn libtorch_files() -> Vec<Probe> {
    let subject = "libtorch files";
    let Some(root) = env_path("LIBTORCH") else {
        return vec![Probe::not_found(
            subject,
            "LIBTORCH is not set; set it to a libtorch install (or build with the torch adapter, \
             which can also use PyTorch's own libtorch)",
        )];
    };
    let lib = root.join("lib");
    let mut out = Vec::new();
    for (what, file) in [("libtorch (CPU)", "libtorch_cpu.so"), ("libtorch CUDA part", "libtorch_cuda.so")] {
        let p = lib.join(file);
        out.push(if p.exists() {
            Probe::found(what, format!("{} exists (not loaded: the torch adapter loads it)", p.display()))
        } else {
            Probe::not_found(what, format!("{} does not exist (LIBTORCH={})", p.display(), root.display()))
        });
    }
    out
}

fn pjrt_files() -> Vec<Probe> {
    let subject = "PJRT plugin files";
    let mut dirs = library_dirs();
    for var in ["PJRT_PLUGIN_PATH", "PJRT_PLUGIN_LIBRARY_PATH"] {
        if let Some(p) = env_path(var) {
            if p.is_file() {
                return vec![Probe::found(
                    subject,
                    format!("{var}={} exists (API version: not read without the xla adapter)", p.display()),
                )];
            }
            dirs.insert(0, p);
        }
    }
    let mut found = Vec::new();
    for d in &dirs {
        if let Ok(entries) = std::fs::read_dir(d) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.contains("pjrt") && name.ends_with(".so") {
                    found.push(e.path());
                }
            }
        }
    }
    if found.is_empty() {
        vec![Probe::not_found(
            subject,
            "no *pjrt*.so in PJRT_PLUGIN_PATH, LD_LIBRARY_PATH or the system library directories",
        )]
    } else {
        found
            .iter()
            .map(|p| {
                Probe::found(
                    subject,
                    format!("{} (API version: not read without the xla adapter)", p.display()),
                )
            })
            .collect()
    }
}

fn cuda_files() -> Vec<Probe> {
    let mut out = Vec::new();
    out.push(match find_in(&library_dirs(), "libcuda.so.1") {
        Some(p) => Probe::found("CUDA driver library", format!("{} exists", p.display())),
        None => Probe::not_found(
            "CUDA driver library",
            "no libcuda.so.1 in LD_LIBRARY_PATH or the system library directories (no NVIDIA driver installed?)",
        ),
    });
    let version = Path::new("/proc/driver/nvidia/version");
    out.push(match std::fs::read_to_string(version) {
        Ok(v) => Probe::found("NVIDIA kernel driver", v.lines().next().unwrap_or("").trim().to_string()),
        Err(e) => Probe::not_found("NVIDIA kernel driver", format!("cannot read {}: {e}", version.display())),
    });
    let devices = std::fs::read_dir("/dev")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix("nvidia")
                        .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0);
    out.push(if devices > 0 {
        Probe::found(
            "NVIDIA device nodes",
            format!("{devices} /dev/nvidiaN (names and memory: not read without the cuda adapter)"),
        )
    } else {
        Probe::not_found("NVIDIA device nodes", "no /dev/nvidiaN: no GPU visible to this process")
    });
    out
}
