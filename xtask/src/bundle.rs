//! `cargo xtask gpu-bundle`: builds the GPU test and benchmark binaries here (the
//! GPU machine has no Rust and no network), strips them and puts them with a
//! `run.sh` into `gpu-bundle/` (git-ignored, at most 64 MiB), ready to carry.
//!
//! On the GPU machine, `gpu-bundle/run.sh` runs every binary with the machine's
//! PyTorch libraries on `LD_LIBRARY_PATH`, the CUDA PJRT plugin in
//! `HANDOFF_PJRT_PLUGIN` and `HANDOFF_REQUIRE_GPU=1` (a GPU test that would skip
//! fails instead), writes one log per binary under `$OUT/gpu-logs/`, then runs
//! `bench/python_pipeline.py` (the Python side of the pipeline benchmark; `$PYTHON`,
//! else `/opt/torch/.venv/bin/python3`, else `python3`), then the Python package's GPU
//! script with the bundled `handoff` wheel (see `python.rs`), and exits non-zero if
//! anything failed.
//!
//! To add a package, add a [`Package`] to [`PACKAGES`]: which of its targets to build
//! and whether it needs the set-up environment (`LIBTORCH`, ...) to build.

mod baseline;

use crate::deps;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A kind of target to bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The library's unit tests (libtest harness).
    Lib,
    /// Every integration test in `tests/` (libtest harness).
    Tests,
    /// Every bench target; must be `harness = false` programs that print their
    /// figures (run without arguments).
    Benches,
    /// One integration test target, by name (`tests/<name>.rs`).
    Test(&'static str),
    /// One bench target, by name (`harness = false`, run without arguments).
    Bench(&'static str),
    /// One example, by name, run once with each argument list (its own log each).
    Example(&'static str, &'static [&'static [&'static str]]),
}

/// A package whose binaries go into the bundle.
pub struct Package {
    /// The cargo package name.
    pub name: &'static str,
    /// Its targets to build and run.
    pub kinds: &'static [Kind],
    /// Cargo features to enable (`--features`).
    pub features: &'static [&'static str],
    /// Whether building it needs `cargo xtask setup`'s environment (libtorch, ...).
    pub needs_setup: bool,
}

/// What the bundle holds, in run order.
pub const PACKAGES: &[Package] = &[
    // The runtime's own tests, now with a real driver behind the CUDA backend.
    Package { name: "handoff-runtime", kinds: &[Kind::Lib], features: &[], needs_setup: false },
    Package {
        name: "handoff-cuda",
        kinds: &[Kind::Lib, Kind::Tests, Kind::Benches],
        features: &[],
        needs_setup: false,
    },
    Package {
        name: "handoff-torch",
        kinds: &[
            Kind::Test("gpu_no_host_sync"),
            Kind::Test("gpu_side_streams"),
            Kind::Test("gpu_hazard"),
            Kind::Test("gpu_stress"),
            // One CUDA graph of a step with an XLA program, against eager; refusals.
            Kind::Test("gpu_graph"),
        ],
        features: &[],
        needs_setup: true,
    },
    // The CPU tests of handoff-xla need the CPU plugin, which the GPU machine lacks.
    Package {
        name: "handoff-xla",
        kinds: &[
            Kind::Test("gpu_exchange"),
            // The isolated loader's cost per load with the CUDA plugin, beside an
            // in-process load.
            Kind::Example("isolation_cost", &[&["5"]]),
            // One PJRT execution captured into a CUDA graph and replayed (the spike of
            // the mixed-step graph): where the capture stands, or the exact error.
            Kind::Example("graph_spike", &[&["--replays", "1000"]]),
        ],
        features: &["cuda"],
        needs_setup: true,
    },
    // The kernel call on PyTorch CUDA tensors, and the pipeline benchmark (tch -> XLA ->
    // tch); run.sh then runs bench/python_pipeline.py.
    Package {
        name: "handoff-examples",
        kinds: &[
            Kind::Test("kernel_call"),
            // A jax.export kernel's VJP on PyTorch CUDA tensors (the ("cpu", "cuda") artifact).
            Kind::Test("train_step"),
            Kind::Bench("pipeline_gpu"),
            // The step replayed as one CUDA graph (mixed and PyTorch alone) beside eager.
            Kind::Bench("pipeline_graph"),
            // The demo as a user runs it on the GPU: its defaults (4096² bf16, one
            // stream), two streams, and the host-bound 256².
            Kind::Example(
                "pipeline",
                &[
                    &["--device", "cuda"],
                    &["--device", "cuda", "--streams", "two"],
                    &["--device", "cuda", "--size", "256", "--iters", "2000"],
                    &["--device", "cuda", "--size", "256", "--iters", "2000", "--streams", "two"],
                    &["--device", "cuda", "--size", "256", "--iters", "2000", "--graph"],
                ],
            ),
        ],
        features: &[],
        needs_setup: true,
    },
];

const LIMIT: u64 = 64 * 1024 * 1024;
const TORCH_LIB: &str = "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib";
const PJRT_PLUGIN: &str =
    "/opt/torch/.venv/lib/python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so";

/// One binary of the bundle.
pub(crate) struct Binary {
    /// The file name in `bin/`: `<package>__<target>`.
    pub name: String,
    /// Whether it is a libtest harness (run with `--test-threads=1 --nocapture`).
    harness: bool,
    pub source: PathBuf,
    /// The argument lists it runs with, one run (and log) each; none: once, bare.
    runs: &'static [&'static [&'static str]],
}

/// `cargo xtask gpu-bundle [--only <package>]... [--baseline <rev>] [--prev-wheel <file>]`
/// (for `--baseline`, see `bundle/baseline.rs`; `--prev-wheel`: a handoff wheel of an earlier
/// commit, which `run.sh` compares this one with in its training A/B).
pub fn gpu_bundle(root: &Path, args: &[String]) -> Result<(), String> {
    let only: Vec<&str> = args.windows(2).filter(|w| w[0] == "--only").map(|w| w[1].as_str()).collect();
    let baseline = args.windows(2).find(|w| w[0] == "--baseline").map(|w| w[1].as_str());
    let prev_wheel = args.windows(2).find(|w| w[0] == "--prev-wheel").map(|w| Path::new(w[1].as_str()));
    let selected: Vec<&Package> =
        PACKAGES.iter().filter(|p| only.is_empty() || only.contains(&p.name)).collect();
    if selected.is_empty() {
        return Err(format!("no bundled package matches {only:?}"));
    }
    let env = if selected.iter().any(|p| p.needs_setup) { Some(deps::setup(root)?) } else { None };
    let mut binaries = Vec::new();
    for p in &selected {
        binaries.extend(build(root, None, p, env.as_ref())?);
    }
    let out = root.join("gpu-bundle");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("cannot create {}: {e}", bin.display()))?;
    let mut total = 0;
    for b in &binaries {
        let dst = bin.join(&b.name);
        std::fs::copy(&b.source, &dst).map_err(|e| format!("cannot copy {}: {e}", b.source.display()))?;
        strip(&dst);
        let size = std::fs::metadata(&dst).map_err(|e| e.to_string())?.len();
        total += size;
        println!("xtask: bundled {:<48} {:>6.1} MiB", b.name, size as f64 / (1 << 20) as f64);
    }
    // The Python package's abi3 wheel and its GPU script (python.rs).
    total += crate::python::bundle(root, &out, prev_wheel)?;
    let script = out.join("run.sh");
    std::fs::write(&script, run_script(&binaries)).map_err(|e| format!("cannot write run.sh: {e}"))?;
    set_executable(&script)?;
    total += std::fs::metadata(&script).map_err(|e| e.to_string())?.len();
    if let Some(rev) = baseline {
        let set_up;
        let env = match &env {
            Some(env) => env,
            None => {
                set_up = deps::setup(root)?;
                &set_up
            }
        };
        total += baseline::bundle(root, rev, env, &out)?;
    }
    if total > LIMIT {
        return Err(format!(
            "the bundle is {:.1} MiB, over the 64 MiB a device run can carry",
            total as f64 / (1 << 20) as f64
        ));
    }
    println!(
        "xtask: gpu-bundle/ holds {} binaries, {:.1} MiB; on the GPU machine run `gpu-bundle/run.sh` (logs in $OUT/gpu-logs)",
        binaries.len(),
        total as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// Builds package `p`'s targets in the workspace at `root` (into `target_dir`, else
/// its own `target/`) and lists the executables.
pub(crate) fn build(
    root: &Path,
    target_dir: Option<&Path>,
    p: &Package,
    env: Option<&deps::Env>,
) -> Result<Vec<Binary>, String> {
    // Tests and benches through `cargo test --no-run` (benches then build with their
    // own `harness = false` main); examples through `cargo build`, as programs.
    let (mut tests, mut examples) = (Vec::new(), Vec::new());
    for k in p.kinds {
        match k {
            Kind::Lib => tests.push("--lib".to_string()),
            Kind::Tests => tests.push("--tests".into()),
            Kind::Benches => tests.push("--benches".into()),
            Kind::Test(name) => tests.extend(["--test".into(), name.to_string()]),
            Kind::Bench(name) => tests.extend(["--bench".into(), name.to_string()]),
            Kind::Example(name, _) => examples.extend(["--example".into(), name.to_string()]),
        }
    }
    let mut found: Vec<Binary> = Vec::new();
    for (command, targets) in [(&["test", "--no-run"][..], tests), (&["build"][..], examples)] {
        if targets.is_empty() {
            continue;
        }
        for artifact in cargo_artifacts(root, target_dir, p, command, &targets, env)? {
            let runs = p.kinds.iter().find_map(|k| match k {
                Kind::Example(name, runs) if artifact.is_example && *name == artifact.target => Some(*runs),
                _ => None,
            });
            if found.iter().any(|b| b.source == artifact.executable) {
                continue;
            }
            found.push(Binary {
                name: format!("{}__{}", p.name, artifact.label()),
                harness: !artifact.is_bench && runs.is_none(),
                source: artifact.executable,
                runs: runs.unwrap_or(&[]),
            });
        }
    }
    if found.is_empty() {
        return Err(format!("cargo built no executable for {}", p.name));
    }
    Ok(found)
}

/// An executable cargo built.
struct Artifact {
    executable: PathBuf,
    target: String,
    is_lib: bool,
    is_bench: bool,
    is_example: bool,
}

impl Artifact {
    /// Its name in the bundle, after the package's: `lib` for the library's tests.
    fn label(&self) -> &str {
        if self.is_lib { "lib" } else { &self.target }
    }
}

/// Runs `cargo <command> --release` on `targets` of package `p` and lists the
/// executables it built.
fn cargo_artifacts(
    root: &Path,
    target_dir: Option<&Path>,
    p: &Package,
    command: &[&str],
    targets: &[String],
    env: Option<&deps::Env>,
) -> Result<Vec<Artifact>, String> {
    let mut args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    args.extend(["--release", "--message-format=json-render-diagnostics", "-p", p.name].map(String::from));
    args.extend(targets.iter().cloned());
    if !p.features.is_empty() {
        args.push("--features".into());
        args.push(p.features.join(","));
    }
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(&args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    if let Some(dir) = target_dir {
        cmd.env("CARGO_TARGET_DIR", dir);
    }
    if let Some(env) = env {
        for (k, v) in env.vars() {
            cmd.env(k, v);
        }
    }
    println!("xtask: cargo {}", args.join(" "));
    let output = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo {} failed ({})", args.join(" "), output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut found = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let Ok(msg) = json::parse(line) else { continue };
        if msg.get("reason").and_then(json::Value::as_str) != Some("compiler-artifact") {
            continue;
        }
        let Some(exe) = msg.get("executable").and_then(json::Value::as_str) else { continue };
        let target = msg.get("target");
        // A package's programs (`[[bin]]`), which cargo builds for its integration tests,
        // are not tests: only test harnesses, benches and examples go into the bundle.
        let is_test = msg.get("profile").and_then(|p| p.get("test")).and_then(json::Value::as_bool);
        let name = target.and_then(|t| t.get("name")).and_then(json::Value::as_str).unwrap_or("?");
        let kinds: Vec<&str> = target
            .and_then(|t| t.get("kind"))
            .and_then(json::Value::as_array)
            .map(|a| a.iter().filter_map(json::Value::as_str).collect())
            .unwrap_or_default();
        let is_program = kinds == ["bin"] && is_test == Some(false);
        if is_program {
            continue;
        }
        found.push(Artifact {
            executable: PathBuf::from(exe),
            target: name.to_string(),
            is_lib: kinds.iter().any(|k| k.ends_with("lib")),
            is_bench: kinds.contains(&"bench"),
            is_example: kinds.contains(&"example"),
        });
    }
    Ok(found)
}

pub(crate) fn strip(path: &Path) {
    // The release profile strips already; `strip` is a second pass where it exists.
    let _ = Command::new("strip").arg("--strip-all").arg(path).stderr(Stdio::null()).status();
}

#[cfg(unix)]
pub(crate) fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

#[cfg(not(unix))]
pub(crate) fn set_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

/// The lines of a bundle script that point the binaries at the GPU machine's PyTorch
/// libraries and CUDA PJRT plugin, and make a GPU test that would skip fail.
pub(crate) fn machine_env() -> String {
    format!(
        r#"export LD_LIBRARY_PATH="{TORCH_LIB}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export HANDOFF_PJRT_PLUGIN="${{HANDOFF_PJRT_PLUGIN:-{PJRT_PLUGIN}}}"
# On the GPU machine a GPU test that would skip for want of a device fails instead.
export HANDOFF_REQUIRE_GPU="${{HANDOFF_REQUIRE_GPU:-1}}"
"#
    )
}

/// The lines of a bundle script that print the host-cost tables and their targets
/// (`bench/summarize.py`, from the working tree carried beside the bundle) from the
/// logs `files` (shell words), and keep them in `into`. A report only: it never fails
/// the script.
pub(crate) fn tables_step(files: &str, into: &str) -> String {
    format!(
        r#"
# The host-cost tables and their targets, from these logs.
SUMMARIZE="$HERE/../bench/summarize.py"
TPY="${{PYTHON:-python3}}"
if [ -z "${{PYTHON:-}}" ] && [ -x /opt/torch/.venv/bin/python3 ]; then TPY=/opt/torch/.venv/bin/python3; fi
if [ -f "$SUMMARIZE" ]; then
  echo "== tables"
  "$TPY" "$SUMMARIZE" {files} > {into} 2>&1; cat {into}
fi
"#
    )
}

fn run_script(binaries: &[Binary]) -> String {
    let machine_env = machine_env();
    let mut s = String::new();
    s.push_str(&format!(
        r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`. Runs every bundled GPU test and benchmark
# binary; one log per binary in $OUT/gpu-logs/ (OUT defaults to ./out); exits
# non-zero if any failed. ONLY=<name> runs the binaries whose name contains it.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${{OUT:-$HERE/out}}"
LOGS="$OUT/gpu-logs"
mkdir -p "$LOGS"
{machine_env}export RUST_BACKTRACE=1
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
{{ date -u; uname -a; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; }} > "$LOGS/machine.txt"
failed=0

# run <harness 0|1> <binary> [<log name> <args>...]
run() {{
  local harness="$1" name="$2" logname="${{3:-$2}}"
  shift $(( $# < 3 ? $# : 3 ))
  if [ -n "${{ONLY:-}}" ] && [[ "$logname" != *"$ONLY"* ]]; then return; fi
  local log="$LOGS/$logname.log" rc
  echo "== $logname $*"
  local t0=$(date +%s%N)
  if [ "$harness" = 1 ]; then
    "$HERE/bin/$name" --test-threads=1 --nocapture > "$log" 2>&1; rc=$?
  else
    "$HERE/bin/$name" "$@" > "$log" 2>&1; rc=$?
  fi
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  grep -E 'test result|SKIPPED:|^BENCH|no-host-sync:|control \(|pool:|release \(|elision:|cross-stream /|same-stream:|kernel call|^result:|^wall time|streams:|host syncs  ' "$log" | sed 's/^/   /'
  local skipped=$(grep -c 'SKIPPED:' "$log")
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    echo "   FAILED (exit $rc); last lines of $log:"; tail -n 30 "$log" | sed 's/^/   | /'
    echo "FAIL $logname exit=$rc" >> "$SUMMARY"
  else
    echo "ok   $logname skipped=$skipped ms=$ms" >> "$SUMMARY"
  fi
}}

"#
    ));
    for b in binaries {
        if b.runs.is_empty() {
            let _ = writeln!(s, "run {} {}", u8::from(b.harness), b.name);
        }
        for args in b.runs {
            let log = format!(
                "{}.{}",
                b.name,
                args.iter().map(|a| a.trim_start_matches('-')).collect::<Vec<_>>().join("_")
            );
            let _ = writeln!(s, "run {} {} {log} {}", u8::from(b.harness), b.name, args.join(" "));
        }
    }
    s.push_str(crate::python::RUN_STEP);
    s.push_str(
        r#"
# The Python side of the pipeline benchmark (torch + JAX), next to the Rust one.
PY_BENCH="$HERE/../bench/python_pipeline.py"
if [ -z "${ONLY:-}" ] || [[ "python_pipeline" == *"$ONLY"* ]]; then
  if [ -f "$PY_BENCH" ]; then
    echo "== python_pipeline"
    PY="${PYTHON:-python3}"
    if [ -z "${PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; fi
    "$PY" "$PY_BENCH" > "$LOGS/python_pipeline.log" 2>&1; rc=$?
    grep -E '^\{' "$LOGS/python_pipeline.log" | sed 's/^/   /'
    if [ "$rc" -ne 0 ]; then
      failed=$((failed + 1)); tail -n 30 "$LOGS/python_pipeline.log" | sed 's/^/   | /'
      echo "FAIL python_pipeline exit=$rc" >> "$SUMMARY"
    else
      echo "ok   python_pipeline" >> "$SUMMARY"
    fi
  else
    echo "SKIP python_pipeline: $PY_BENCH not found" >> "$SUMMARY"
  fi
fi

"#,
    );
    s.push_str(&tables_step(
        r#""$LOGS/handoff-examples__pipeline_gpu.log" "$LOGS/python_pipeline.log" "$LOGS/handoff-cuda__handoff_cuda.log""#,
        r#""$LOGS/tables.md""#,
    ));
    s.push_str(
        r#"
echo "== summary"; cat "$SUMMARY"
if [ "$failed" -ne 0 ]; then echo "$failed binaries failed"; exit 1; fi
echo "all passed"
"#,
    );
    s
}

/// Just enough JSON to read cargo's messages (no dependency for xtask).
mod json {
    /// A JSON value.
    pub enum Value {
        Null,
        Bool(bool),
        Num(#[allow(dead_code)] f64),
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::Str(s) => Some(s),
                _ => None,
            }
        }
        pub fn as_bool(&self) -> Option<bool> {
            match self {
                Value::Bool(b) => Some(*b),
                _ => None,
            }
        }
        pub fn as_array(&self) -> Option<&[Value]> {
            match self {
                Value::Arr(a) => Some(a),
                _ => None,
            }
        }
    }

    pub fn parse(s: &str) -> Result<Value, String> {
        let mut p = Parser { b: s.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() { Err(format!("trailing data at {}", p.i)) } else { Ok(v) }
    }

    struct Parser<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.b.get(self.i) == Some(&c) {
                self.i += 1;
                Ok(())
            } else {
                Err(format!("expected '{}' at {}", c as char, self.i))
            }
        }
        fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.b.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    let mut m = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(Value::Obj(m));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(b':')?;
                        m.push((k, self.value()?));
                        self.ws();
                        match self.b.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                return Ok(Value::Obj(m));
                            }
                            _ => return Err(format!("bad object at {}", self.i)),
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(Value::Arr(a));
                    }
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        match self.b.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                return Ok(Value::Arr(a));
                            }
                            _ => return Err(format!("bad array at {}", self.i)),
                        }
                    }
                }
                Some(b'"') => Ok(Value::Str(self.string()?)),
                Some(b't') => self.word("true", Value::Bool(true)),
                Some(b'f') => self.word("false", Value::Bool(false)),
                Some(b'n') => self.word("null", Value::Null),
                Some(_) => {
                    let start = self.i;
                    while self.i < self.b.len()
                        && matches!(self.b[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        self.i += 1;
                    }
                    let t = std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?;
                    t.parse().map(Value::Num).map_err(|_| format!("bad number {t:?} at {start}"))
                }
                None => Err("unexpected end".into()),
            }
        }
        fn word(&mut self, w: &str, v: Value) -> Result<Value, String> {
            if self.b[self.i..].starts_with(w.as_bytes()) {
                self.i += w.len();
                Ok(v)
            } else {
                Err(format!("bad literal at {}", self.i))
            }
        }
        fn string(&mut self) -> Result<String, String> {
            if self.b.get(self.i) != Some(&b'"') {
                return Err(format!("expected a string at {}", self.i));
            }
            self.i += 1;
            let mut out: Vec<u8> = Vec::new();
            loop {
                match self.b.get(self.i) {
                    None => return Err("unterminated string".into()),
                    Some(b'"') => {
                        self.i += 1;
                        return String::from_utf8(out).map_err(|e| e.to_string());
                    }
                    Some(b'\\') => {
                        let c = *self.b.get(self.i + 1).ok_or("bad escape")?;
                        self.i += 2;
                        match c {
                            b'n' => out.push(b'\n'),
                            b't' => out.push(b'\t'),
                            b'r' => out.push(b'\r'),
                            b'b' => out.push(8),
                            b'f' => out.push(12),
                            b'u' => {
                                let hex = self.b.get(self.i..self.i + 4).ok_or("bad \\u escape")?;
                                let hex = std::str::from_utf8(hex).map_err(|e| e.to_string())?;
                                let code = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                self.i += 4;
                                let ch = char::from_u32(code).unwrap_or('\u{fffd}');
                                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                            }
                            c => out.push(c),
                        }
                    }
                    Some(&c) => {
                        out.push(c);
                        self.i += 1;
                    }
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn reads_a_cargo_artifact_message() {
            let m = super::parse(
                r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"gpu"},"profile":{"test":true,"opt_level":"3"},"executable":"/t/a\"b\\c\u0041","fresh":false,"n":-1.5e3,"x":null}"#,
            )
            .unwrap();
            assert_eq!(m.get("reason").and_then(super::Value::as_str), Some("compiler-artifact"));
            assert_eq!(m.get("executable").and_then(super::Value::as_str), Some("/t/a\"b\\cA"));
            let t = m.get("target").unwrap();
            assert_eq!(t.get("kind").and_then(super::Value::as_array).map(|a| a.len()), Some(1));
            assert!(super::parse("{\"a\":").is_err());
        }
    }
}

#[cfg(test)]
mod tables_tests {
    use std::process::Command;

    /// `bench/summarize.py`, which run.sh and ab.sh end with, read on the logs of the H200
    /// run whose figures BENCHMARKS.md shows.
    #[test]
    fn summarize_reads_an_h200_runs_logs_into_its_tables_and_verdicts() {
        let root = crate::root();
        let logs = [
            "docs/gpu-runs/2026-12-05-h200-hostcost11-284c25d-run1-handoff-examples__pipeline_gpu.log",
            "docs/gpu-runs/2026-12-05-h200-hostcost11-284c25d-run1-python_pipeline.log",
            "docs/gpu-runs/2026-12-05-h200-hostcost11-284c25d-run1-handoff-cuda__handoff_cuda.log",
        ];
        let out = Command::new("python3")
            .current_dir(&root)
            .arg("bench/summarize.py")
            .args(logs)
            .output()
            .expect("python3 runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        for expected in [
            "| torch -> XLA | 0.83 / 0.58 / 1.34 / 0.91 |",
            "| kernel call | 1.52 / 1.24 / 0.81 / 1.36 |",
            "- torch -> XLA <= 1 µs: 3 of 4 cells",
            "- kernel call <= 2 µs: 4 of 4 cells",
            "0.0547 (0.661; 1.899x jax.jit)",
            "0.2430 (0.485; 1.074x jax.jit)",
            "- 4096² <= 1.1x one `jax.jit`: 2 of 2 steps",
            "| 375 | 560 | 1.49 | 135 | 106 |",
            "- cross-stream <= 1.5x the raw pair (one at a time): 1 of 1 runs",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        let none =
            Command::new("python3").current_dir(&root).args(["bench/summarize.py", "Cargo.toml"]).output();
        assert_eq!(
            none.expect("python3 runs").status.code(),
            Some(1),
            "a file with no benchmark lines is an error"
        );
    }
}
