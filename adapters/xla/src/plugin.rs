//! Loading PJRT plugins: from a path, from `HANDOFF_PJRT_PLUGIN`, or JAX's CUDA
//! plugin found in a Python site-packages. Each plugin is initialized once and never
//! unloaded (plugins register process-wide state that outlives a `dlclose`).

use crate::error::{Result, XlaError};
use crate::options::{self, Value};
use crate::result::{self, Api};
use crate::sys::{self, Struct};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming the plugin [`Plugin::from_env`] loads.
pub const PLUGIN_ENV: &str = "HANDOFF_PJRT_PLUGIN";

/// A loaded, initialized PJRT plugin. Lives for the rest of the process.
///
/// ```no_run
/// let plugin = handoff_xla::Plugin::from_env()?;
/// let (major, minor) = plugin.api_version();
/// println!("PJRT {major}.{minor}, extensions {:?}", plugin.extensions());
/// # Ok::<(), handoff_xla::XlaError>(())
/// ```
pub struct Plugin {
    api: Api,
    path: PathBuf,
    version: (i32, i32),
    extensions: Vec<String>,
    stream: Option<&'static sys::PJRT_Stream_Extension>,
    /// Where the plugin's library is mapped (the `dli_fbase` of its `GetPjrtApi`): a
    /// code address is the plugin's when it is in that same object.
    base: usize,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("extensions", &self.extensions)
            .finish()
    }
}

// SAFETY: the plugin's table and extensions are immutable process-lifetime data, and
// PJRT's functions are thread-safe.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

static LOADED: Mutex<Vec<&'static Plugin>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads and initializes the plugin at `path`, or returns the one already
    /// loaded from that file.
    pub fn load(path: impl AsRef<Path>) -> Result<&'static Plugin> {
        let given = path.as_ref();
        let load_err = |reason: String| XlaError::PluginLoad { path: given.to_path_buf(), reason };
        let path = given.canonicalize().map_err(|e| load_err(format!("{e}")))?;
        let mut loaded = LOADED.lock().map_err(|_| load_err("the plugin registry is poisoned".into()))?;
        if let Some(p) = loaded.iter().find(|p| p.path == path) {
            return Ok(p);
        }
        // SAFETY: loading a PJRT plugin runs its initializers, which is what a plugin
        // is for; the library is never unloaded (leaked below).
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| load_err(e.to_string()))?;
        type GetApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: GetApi = unsafe { lib.get::<GetApi>(b"GetPjrtApi\0") }
            .map(|s| *s)
            .map_err(|e| load_err(format!("no GetPjrtApi symbol, so not a PJRT plugin ({e})")))?;
        // SAFETY: as above; the table is static data of the plugin.
        let raw = unsafe { get() };
        if raw.is_null() {
            return Err(load_err("GetPjrtApi returned null".into()));
        }
        let base = object_base(get as *const std::ffi::c_void);
        // Never unload: the table and the plugin's threads live as long as the process.
        std::mem::forget(lib);
        // SAFETY: non-null, returned by GetPjrtApi, and the library is never unloaded.
        let raw: &'static sys::PJRT_Api = unsafe { &*raw };
        let version = (raw.pjrt_api_version.major_version, raw.pjrt_api_version.minor_version);
        if version.0 != sys::API_MAJOR || version.1 < sys::API_MINOR || raw.struct_size < sys::PJRT_Api_SIZE {
            return Err(XlaError::ApiVersion {
                path,
                major: version.0,
                minor: version.1,
                api_size: raw.struct_size,
                bound_major: sys::API_MAJOR,
                bound_minor: sys::API_MINOR,
            });
        }
        // SAFETY: a valid table for the rest of the process.
        let api = unsafe { Api::new(raw) };
        let mut extensions = Vec::new();
        let mut stream = None;
        let mut ext = raw.extension_start;
        while !ext.is_null() {
            // SAFETY: the plugin's extension chain: each node is a valid base followed
            // by its type's fields, and lives as long as the table.
            let base = unsafe { &*ext };
            let name = usize::try_from(base.type_)
                .ok()
                .and_then(|t| sys::EXTENSION_NAMES.get(t))
                .map(|n| n.to_string())
                .unwrap_or_else(|| format!("Type{}", base.type_));
            if base.type_ == sys::EXTENSION_TYPE_STREAM
                && base.struct_size >= sys::PJRT_Stream_Extension::SIZE
            {
                // SAFETY: a Stream extension at least as large as the bound struct.
                stream = Some(unsafe { &*(ext as *const sys::PJRT_Stream_Extension) });
            }
            extensions.push(name);
            ext = base.next;
        }
        result::plugin::initialize(api)?;
        let plugin: &'static Plugin =
            Box::leak(Box::new(Plugin { api, path, version, extensions, stream, base }));
        loaded.push(plugin);
        Ok(plugin)
    }

    /// Loads the plugin named by `HANDOFF_PJRT_PLUGIN`.
    pub fn from_env() -> Result<&'static Plugin> {
        match std::env::var_os(PLUGIN_ENV) {
            Some(p) if !p.is_empty() => Plugin::load(PathBuf::from(p)),
            _ => Err(XlaError::PluginEnvUnset),
        }
    }

    /// Finds and loads JAX's CUDA plugin (`jax_plugins/xla_cuda13/xla_cuda_plugin.so`,
    /// or `xla_cuda12`) in the Python site-packages of `$VIRTUAL_ENV`, `/opt/torch/.venv`,
    /// `$HANDOFF_PYTHON_SITE_PACKAGES` and the usual system prefixes.
    pub fn cuda() -> Result<&'static Plugin> {
        let candidates = cuda_plugin_candidates();
        match candidates.iter().find(|p| p.is_file()) {
            Some(p) => Plugin::load(p),
            None => Err(XlaError::NoCudaPlugin {
                searched: candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The raw API table wrappers.
    pub(crate) fn api(&self) -> Api {
        self.api
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PJRT C API version the plugin reports (`(0, 115)` for JAX 0.11.2's plugins).
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// The names of the extensions the plugin offers (`Stream`, `Layouts`, ...).
    pub fn extensions(&self) -> &[String] {
        &self.extensions
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> Result<Vec<(String, Value)>> {
        let raw = result::plugin::attributes(self.api)?;
        // SAFETY: the plugin's attributes, valid for the process.
        Ok(unsafe { options::named_values(raw) })
    }

    /// The stream extension (CUDA plugins have it; the CPU plugin does not).
    pub(crate) fn stream_extension(&self) -> Option<&'static sys::PJRT_Stream_Extension> {
        self.stream
    }

    /// Whether code at `address` is the plugin's (its host callbacks, found in a graph).
    pub(crate) fn owns_code(&self, address: usize) -> bool {
        self.base != 0 && object_base(address as *const std::ffi::c_void) == self.base
    }

    /// Whether the plugin drives GPUs (it has the stream extension).
    pub fn is_gpu(&self) -> bool {
        self.stream.is_some()
    }
}

/// The base address of the loaded object that holds `address` (0 if none does).
fn object_base(address: *const std::ffi::c_void) -> usize {
    // SAFETY: a plain C struct, for which all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only reads the loader's tables; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(address, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

fn cuda_plugin_candidates() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    let mut sites: Vec<PathBuf> = Vec::new();
    if let Some(s) = std::env::var_os("HANDOFF_PYTHON_SITE_PACKAGES") {
        sites.extend(std::env::split_paths(&s));
    }
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(v));
    }
    prefixes.push(PathBuf::from("/opt/torch/.venv"));
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr"].map(PathBuf::from));
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            sites.push(py.join("site-packages"));
            sites.push(py.join("dist-packages"));
        }
    }
    let mut out = Vec::new();
    for site in sites {
        for cuda in ["xla_cuda13", "xla_cuda12"] {
            out.push(site.join("jax_plugins").join(cuda).join("xla_cuda_plugin.so"));
        }
    }
    out
}
