//! Loading bytes the program does not trust: the plugin parses and compiles them first
//! in a child process, so that whatever it does with them (a damaged module has made the
//! CPU plugin's StableHLO reader write out of bounds and abort), the calling process
//! survives and gets a typed error. Only bytes that passed there are compiled in-process.
//!
//! **The child is the calling program itself**, executed afresh (never forked: a
//! process that runs PJRT or CUDA threads cannot be), with [`CHILD_ENV`] set. A hook in
//! the program's `.init_array`, which handoff-xla puts into every program that uses the
//! isolated loader, sees the variable before `main`, checks the bytes it reads on
//! standard input and exits. So a Rust program depending on handoff-xla, its tests and
//! the GPU bundle's binaries need no helper binary. A program that is not Rust (a Python
//! interpreter hosting handoff-xla) names a program that is in [`CHECKER_ENV`]: the
//! `handoff-check` binary of this crate. The child answers a handshake line first, so
//! a program without the hook is reported, never run on the bytes.
//!
//! The child loads the same plugin as the caller's client (the CUDA plugin without
//! preallocating the GPU's memory) and compiles the module, and an artifact's VJP
//! module, for the same device: a full compile, since a plugin can fail anywhere from
//! parsing to code generation (on the GPU without autotuning, which would run every
//! candidate kernel to choose among kernels the child throws away). It runs under a
//! time limit (the caller kills it) and a memory limit (`RLIMIT_DATA`, which counts
//! the heap but not the CUDA driver's address reservations, which `RLIMIT_AS` would),
//! with glibc's heap consistency checks on (`glibc.malloc.check=3` through
//! `libc_malloc_debug.so` when the system has it, and `MALLOC_PERTURB_`), so that heap
//! corruption aborts there rather than passing quietly.
//! No core file is written.
//!
//! Verdicts are kept for the life of the process, keyed by the bytes, the plugin (path
//! and platform version), the device and the limits, so a file is checked once per
//! plugin in a process. Passes are also kept on disk when the caller names a directory
//! ([`LoadOptions::verdict_cache`], [`VERDICT_CACHE_ENV`]): then a file is checked once
//! per plugin on the machine (the `disk` module says what a kept pass holds).

use crate::client::Client;
use crate::error::{Result, XlaError};
use crate::executable::CompileOptions;
use crate::kernel::{Kernel, Source};

mod child;
mod disk;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Set (to the device index) in the environment of the child the isolated loader runs.
pub const CHILD_ENV: &str = "HANDOFF_XLA_ISOLATED_CHILD";
/// An executable that links handoff-xla, run as the child instead of the calling program
/// (which must then be something else, such as a Python interpreter).
pub const CHECKER_ENV: &str = "HANDOFF_XLA_CHECKER";
/// A directory where passes are kept for later processes, when
/// [`LoadOptions::verdict_cache`] names none (unset or empty: none kept).
pub const VERDICT_CACHE_ENV: &str = "HANDOFF_XLA_VERDICT_CACHE";
/// The plugin the child loads.
const PLUGIN_VAR: &str = "HANDOFF_XLA_ISOLATED_PLUGIN";
/// The child's first line on standard output.
const HANDSHAKE: &str = "handoff-xla isolated check 1";
/// The argument the child gets: a program without the hook refuses it (Python: "unknown
/// option") instead of reading the bytes.
const CHILD_ARG: &str = "--handoff-xla-isolated-check";
/// The exit status of a child whose plugin refused the bytes with an error.
const REFUSED: i32 = 3;
/// The exit status of a child that could not load the plugin or make its client.
const NO_CLIENT: i32 = 4;

/// How a kernel is loaded from a file or bytes ([`Kernel::load_with`](crate::Kernel::load_with)).
///
/// ```
/// use std::time::Duration;
/// let o = handoff_xla::LoadOptions::default().time_limit(Duration::from_secs(30));
/// assert!(matches!(o.isolation, handoff_xla::Isolation::Child { .. }));
/// let trusted = handoff_xla::LoadOptions::trusted();
/// assert!(matches!(trusted.isolation, handoff_xla::Isolation::InProcess));
/// ```
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// How the kernel is compiled in this process.
    pub compile: CompileOptions,
    /// Where the bytes are first checked.
    pub isolation: Isolation,
}

impl LoadOptions {
    /// No child: for bytes the program trusts (its own, or checked before).
    pub fn trusted() -> LoadOptions {
        LoadOptions { isolation: Isolation::InProcess, ..LoadOptions::default() }
    }

    /// The child's time limit.
    pub fn time_limit(mut self, limit: Duration) -> Self {
        if let Isolation::Child { time_limit, .. } = &mut self.isolation {
            *time_limit = limit;
        }
        self
    }

    /// The child's memory limit (`RLIMIT_DATA`), in bytes.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        if let Isolation::Child { memory_limit, .. } = &mut self.isolation {
            *memory_limit = bytes;
        }
        self
    }

    /// The program run as the child (one that links handoff-xla).
    pub fn checker(mut self, program: impl Into<PathBuf>) -> Self {
        if let Isolation::Child { checker, .. } = &mut self.isolation {
            *checker = Some(program.into());
        }
        self
    }

    /// Keeps passes in `dir` for the processes that come after (created when missing):
    /// a file that passed there is not checked again with the same plugin, device and
    /// limits. Worth it where a process starts often: a CUDA child takes seconds per
    /// file, the most for an artifact and its VJP (BENCHMARKS.md, "isolated load").
    ///
    /// ```
    /// let dir = std::env::temp_dir().join("handoff-verdicts");
    /// let o = handoff_xla::LoadOptions::default().verdict_cache(&dir);
    /// assert!(matches!(o.isolation, handoff_xla::Isolation::Child { verdict_cache: Some(_), .. }));
    /// ```
    pub fn verdict_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        if let Isolation::Child { verdict_cache, .. } = &mut self.isolation {
            *verdict_cache = Some(dir.into());
        }
        self
    }
}

/// Where untrusted bytes are checked before this process compiles them.
#[derive(Debug, Clone)]
pub enum Isolation {
    /// Parsed and compiled first in a child process (see the module docs). The default.
    Child {
        /// The child is killed after this long (default 120 s).
        time_limit: Duration,
        /// The child's `RLIMIT_DATA` (default 8 GiB).
        memory_limit: u64,
        /// The program run as the child (default: [`CHECKER_ENV`] when set, else this
        /// program). It must link handoff-xla (the `handoff-check` binary does).
        checker: Option<PathBuf>,
        /// Where passes are kept for later processes (default: [`VERDICT_CACHE_ENV`]
        /// when set, else nowhere).
        verdict_cache: Option<PathBuf>,
    },
    /// Compiled in this process only: a plugin defect reached by the bytes can end it.
    InProcess,
}

impl Default for Isolation {
    fn default() -> Isolation {
        Isolation::Child {
            time_limit: Duration::from_secs(120),
            memory_limit: 8 << 30,
            checker: None,
            verdict_cache: None,
        }
    }
}

// Loading from untrusted bytes: each load is checked here first, then compiled in-process.
impl Kernel {
    /// Loads and compiles a kernel file (see [`Source::from_file`]) for the client's
    /// first device.
    pub fn load(client: &Client, path: impl AsRef<Path>) -> Result<Kernel> {
        Kernel::load_with(client, path, &LoadOptions::default())
    }

    /// [`Kernel::load`] with options: [`LoadOptions::trusted`] compiles in this process
    /// only, for files the program trusts.
    ///
    /// ```no_run
    /// use handoff_xla::{Client, Kernel, LoadOptions};
    /// let client = Client::from_env()?;
    /// let path = "adapters/xla/programs/ln_gelu_f32_8x16_cpu.jaxexport";
    /// let k = Kernel::load_with(&client, path, &LoadOptions::default().memory_limit(2 << 30))?;
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn load_with(client: &Client, path: impl AsRef<Path>, options: &LoadOptions) -> Result<Kernel> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| XlaError::invalid("kernel path", path.display(), e.to_string()))?;
        // What handoff checks itself (format, emptiness) is refused before any child runs.
        let source = Source::read_from(path, bytes.clone())?;
        check(client, &bytes, &path.display().to_string(), options)?;
        Kernel::compile(client, source, &options.compile)
    }

    /// A kernel from bytes the program does not trust (StableHLO text or bytecode, or a
    /// `jax.export` artifact, recognized as [`Source::from_bytes`] does), checked first
    /// in a child process as [`Kernel::load`] checks a file.
    pub fn load_bytes(client: &Client, bytes: Vec<u8>, options: &LoadOptions) -> Result<Kernel> {
        let source = Source::from_bytes(bytes.clone(), None)?;
        check(client, &bytes, &format!("kernel bytes ({} bytes)", bytes.len()), options)?;
        Kernel::compile(client, source, &options.compile)
    }
}

/// Checks `bytes` (a StableHLO module or a `jax.export` artifact, named `name` in
/// errors) in a child process with `client`'s plugin, as `options` say. `Ok` when the
/// child compiled them (and an artifact's VJP); an error naming `name` otherwise.
pub(crate) fn check(client: &Client, bytes: &[u8], name: &str, options: &LoadOptions) -> Result<()> {
    let Isolation::Child { time_limit, memory_limit, checker, verdict_cache } = &options.isolation else {
        return Ok(());
    };
    // Keeps the hook (and with it the child) in every program that reaches this.
    std::hint::black_box(&child::CHILD_HOOK);
    let plugin = client.plugin().path().to_path_buf();
    let device = options.compile.device.unwrap_or(0);
    // The limits too: a child that ran out of time or memory says nothing of other limits.
    let key = Key {
        bytes: (hasher().hash_one(bytes), bytes.len()),
        plugin: (plugin.clone(), client.platform_version().to_owned()),
        device,
        limits: (*time_limit, *memory_limit),
    };
    if let Some(verdict) = verdicts().lock().ok().and_then(|v| v.get(&key).cloned()) {
        return verdict.map_err(|outcome| refused(name, outcome));
    }
    let kept = verdict_cache
        .clone()
        .or_else(|| std::env::var_os(VERDICT_CACHE_ENV).filter(|d| !d.is_empty()).map(PathBuf::from))
        .and_then(|dir| {
            let header = disk::header(&plugin, client.platform_version(), device, key.limits, bytes)?;
            Some((dir, header))
        });
    let verdict = if kept.as_ref().is_some_and(|(dir, header)| disk::passed(dir, header, bytes)) {
        Ok(())
    } else {
        CHILDREN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let verdict = run_child(
            &plugin,
            client.is_gpu(),
            device,
            bytes,
            *time_limit,
            *memory_limit,
            checker.as_deref(),
        )?;
        if let (Ok(()), Some((dir, header))) = (&verdict, &kept) {
            disk::keep_pass(dir, header, bytes);
        }
        verdict
    };
    if let Ok(mut v) = verdicts().lock() {
        v.insert(key, verdict.clone());
    }
    verdict.map_err(|outcome| refused(name, outcome))
}

/// How many children the isolated loader has run in this process (a verdict found in
/// the cache runs none).
///
/// ```
/// let before = handoff_xla::isolation::children_run();
/// assert!(handoff_xla::isolation::children_run() >= before);
/// ```
pub fn children_run() -> u64 {
    CHILDREN.load(std::sync::atomic::Ordering::Relaxed)
}

static CHILDREN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a verdict holds for: the bytes (hash, length), the plugin (path, platform
/// version), the device, the child's limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    bytes: (u64, usize),
    plugin: (PathBuf, String),
    device: usize,
    limits: (Duration, u64),
}

fn verdicts() -> &'static Mutex<HashMap<Key, std::result::Result<(), Outcome>>> {
    static VERDICTS: OnceLock<Mutex<HashMap<Key, std::result::Result<(), Outcome>>>> = OnceLock::new();
    VERDICTS.get_or_init(Default::default)
}

/// One hasher per process: its keys are random, so bytes cannot be made to collide
/// with a verdict of other bytes.
fn hasher() -> &'static RandomState {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::new)
}

/// Why the child did not pass the bytes.
#[derive(Debug, Clone)]
struct Outcome {
    /// What happened to the child: "the plugin refused them", "killed by signal 6
    /// (SIGABRT)", "exited with status 101", "still running after 120 s (killed)".
    what: String,
    /// The last line the child wrote on standard error (the plugin's message).
    last_line: String,
}

fn refused(name: &str, o: Outcome) -> XlaError {
    XlaError::Refused { name: name.to_owned(), outcome: o.what, last_line: o.last_line }
}

/// Runs the child on `bytes`; `Err` for an outcome that is the bytes' verdict, the outer
/// `Err` when no child could run.
fn run_child(
    plugin: &std::path::Path,
    gpu: bool,
    device: usize,
    bytes: &[u8],
    time_limit: Duration,
    memory_limit: u64,
    checker: Option<&std::path::Path>,
) -> Result<std::result::Result<(), Outcome>> {
    let no_child = |reason: String| XlaError::invalid("isolated check", "the child process", reason);
    let program = match (checker, std::env::var_os(CHECKER_ENV)) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(p)) if !p.is_empty() => PathBuf::from(p),
        _ => std::env::current_exe().map_err(|e| no_child(format!("cannot find this program: {e}")))?,
    };
    let mut cmd = Command::new(&program);
    cmd.arg(CHILD_ARG)
        .env(CHILD_ENV, device.to_string())
        .env(PLUGIN_VAR, plugin)
        .env("MALLOC_PERTURB_", "165")
        .env("GLIBC_TUNABLES", "glibc.malloc.check=3:glibc.malloc.perturb=165")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(debug) = malloc_debug_library() {
        cmd.env("LD_PRELOAD", debug);
    }
    if gpu {
        // No autotuning: it would run every candidate kernel on the GPU, seconds per
        // module in a fresh process, to choose kernels the child throws away.
        let flags = std::env::var("XLA_FLAGS").unwrap_or_default();
        cmd.env("XLA_FLAGS", format!("{flags} --xla_gpu_autotune_level=0").trim_start());
    }
    // SAFETY: `setrlimit` is async-signal-safe, the only call made between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let data = libc::rlimit { rlim_cur: memory_limit, rlim_max: memory_limit };
            let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::setrlimit(libc::RLIMIT_DATA, &data) != 0
                || libc::setrlimit(libc::RLIMIT_CORE, &core) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| no_child(format!("cannot run {}: {e}", program.display())))?;
    let (mut stdin, mut stdout, mut stderr) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    // A child that does not read (not the hook) closes the pipe: its answer says more.
    let _ = stdin.write_all(bytes);
    drop(stdin);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > time_limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(no_child(format!("cannot wait for the child: {e}"))),
        }
    };
    let out = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    let last_line = last_message(&err);
    if !out.starts_with(HANDSHAKE) {
        return Err(no_child(format!(
            "{} is not a program that links handoff-xla (it did not answer the handshake; its last line: \
             {last_line}): set {CHECKER_ENV} to the handoff-check binary",
            program.display()
        )));
    }
    let what = match status {
        None => format!("still running after {time_limit:?} (killed)"),
        Some(s) if s.success() => return Ok(Ok(())),
        Some(s) if s.code() == Some(NO_CLIENT) => {
            return Err(no_child(format!("the child could not make a client of the plugin: {last_line}")));
        }
        Some(s) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.code(), s.signal()) {
                (Some(REFUSED), _) => "the plugin refused them".to_owned(),
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
                (None, None) => format!("ended: {s}"),
            }
        }
    };
    Ok(Err(Outcome { what, last_line }))
}

/// The last line of `stderr` that says something: not blank, and not a frame of the
/// stack trace a crash handler prints after the message.
fn last_message(stderr: &str) -> String {
    let frame = |l: &str| l.starts_with('@') || l.starts_with("PC: ") || l.starts_with("*** ");
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    lines().rfind(|l| !frame(l)).or_else(|| lines().next_back()).unwrap_or("(nothing)").to_owned()
}

/// glibc's heap checking library (glibc >= 2.34 checks the heap only with it preloaded).
fn malloc_debug_library() -> Option<PathBuf> {
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib/aarch64-linux-gnu"]
        .iter()
        .map(|d| PathBuf::from(d).join("libc_malloc_debug.so.0"))
        .find(|p| p.exists())
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTRAP => "SIGTRAP",
        _ => "?",
    }
}
