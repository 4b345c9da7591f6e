//! The adapter registry: every adapter (the built-in torch, xla, cuda and mock
//! adapters, and any third-party crate) registers itself once, and values move
//! between any two registered adapters by name.
//!
//! # How an adapter registers itself
//!
//! One `submit!` anywhere in the adapter's crate, with a `const` [`Adapter`] built
//! from [`Adapter::new`] and its `const` builder methods. The crate needs no
//! dependency but `handoff` (or `handoff-runtime`): `submit!` is re-exported here.
//!
//! ```
//! use handoff_runtime::registry::{self, Adapter, DeviceKind, Probe};
//! use handoff_runtime::dtype::DataType;
//! # use handoff_runtime::mock::MockTensor as MyTensor; // your tensor type: Export + Import
//!
//! fn probe() -> Vec<Probe> {
//!     vec![Probe::found("my runtime", "libmy.so 1.2 loaded")]
//! }
//!
//! registry::submit! {
//!     Adapter::new("my-adapter", "0.1.0")         // name (unique) and version
//!         .about("tensors of my framework")        // one line for `handoff doctor`
//!         .devices(&[DeviceKind::Host, DeviceKind::Cuda])
//!         .dtypes(&[DataType::F32, DataType::F64]) // or `handoff_runtime::dtype::ALL`
//!         .exports::<MyTensor>()                   // needs `MyTensor: Export`
//!         .imports::<MyTensor>()                   // needs `MyTensor: Import + Send`
//!         .probe(probe)                            // optional: lines for `handoff doctor`
//! }
//!
//! let me = registry::find("my-adapter").unwrap();
//! assert!(me.can_export() && me.can_import());
//! ```
//!
//! An adapter whose type imports into a context (an XLA buffer needs its client)
//! registers with [`Adapter::imports_into`]; values reach it with [`convert_into`],
//! which takes that context. Ordering and releasing memory an adapter's own way
//! belongs in its [`Export`] and [`ImportInto`] impls, which the registry calls.
//!
//! Built-in adapters use these names, which `handoff doctor` looks for: `torch`
//! (libtorch), `xla` (PJRT plugins), `cuda` (CUDA devices and driver), `mock`.
//!
//! # Converting
//!
//! ```
//! use handoff_runtime::{mock::{Mock, MockTensor}, registry};
//! let mock = Mock::new();
//! let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
//! let x = mock.tensor_f32(&a, "x", &[2], &[1.0, 2.0]);
//! let y = registry::convert(Box::new(x), "mock", "mock", &b).unwrap();
//! let y: Box<MockTensor> = y.downcast().unwrap();
//! assert_eq!(y.stream(), &b);
//! ```
//!
//! # Errors
//!
//! [`find`] refuses a name no adapter has ([`RegistryError::UnknownAdapter`]) and a
//! name two adapters have ([`RegistryError::Ambiguous`]: two versions of one adapter
//! crate linked into one program; `handoff doctor` lists them). [`convert`] and
//! [`convert_into`] fail with a [`ConvertError`]: the [`RegistryError`] to match on,
//! in its public `error` field, and the caller's value given back whenever the
//! conversion was refused before anything was exported (wrong name, type, context,
//! device or dtype):
//!
//! ```
//! use handoff_runtime::{mock::{Mock, MockTensor}, registry::{self, RegistryError}};
//! let mock = Mock::new();
//! let s = mock.stream(0, "s");
//! let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
//! let err = registry::convert(Box::new(x), "mock", "nope", &s).unwrap_err();
//! assert!(matches!(err.error, RegistryError::UnknownAdapter { .. }));
//! let x: Box<MockTensor> = err.into_value().unwrap().downcast().unwrap(); // not lost
//! assert_eq!(x.shape(), &[2]);
//! ```

use crate::device::Device;
use crate::dtype::{self, DataType};
use crate::error::{Error, Result};
use crate::handoff::{Export, Handoff, Import};
use crate::stream::Stream;
use crate::transfer::ImportInto;
use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Mutex;

pub use inventory::submit;

/// A type-erased value in or out of an adapter: a `Box` of the adapter's tensor type.
pub type Erased = Box<dyn Any + Send>;

/// The export entry point of an adapter: makes the value ready on the consumer
/// stream and wraps it in a [`Handoff`].
pub type ExportFn = fn(Erased, &Stream) -> Result<Handoff>;

/// The import entry point of an adapter: takes a [`Handoff`] in as the adapter's
/// tensor type, boxed, into its context (a [`Stream`] for plain imports).
pub type ImportFn = fn(Handoff, &dyn Any) -> Result<Erased>;

/// The stream an import context reads memory of a device on.
pub type ReadyStreamFn = fn(&dyn Any, Device) -> Result<Stream>;

/// Tells the device and dtype of a value without exporting it (`None` when it cannot).
pub type InspectFn = fn(&(dyn Any + Send)) -> Option<(Device, DataType)>;

/// What an adapter checks about its environment, for `handoff doctor`.
pub type ProbeFn = fn() -> Vec<Probe>;

/// A kind of device an adapter takes (the ordinal does not matter to the registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// Host memory.
    Host,
    /// CUDA device memory.
    Cuda,
    /// Memory of the simulated device of [`crate::mock`].
    Mock,
}

impl DeviceKind {
    /// The kind of `device`.
    ///
    /// ```
    /// use handoff_runtime::{Device, registry::DeviceKind};
    /// assert_eq!(DeviceKind::of(Device::Cuda(3)), DeviceKind::Cuda);
    /// ```
    pub const fn of(device: Device) -> DeviceKind {
        match device {
            Device::Host => DeviceKind::Host,
            Device::Cuda(_) => DeviceKind::Cuda,
            Device::Mock(_) => DeviceKind::Mock,
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Host => "host",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Mock => "mock",
        })
    }
}

/// How an adapter exports: the Rust type it takes, and its entry point.
#[derive(Clone, Copy)]
pub struct ExportEntry {
    /// The name of the type it takes.
    pub type_name: fn() -> &'static str,
    /// The type it takes (checked before `export` is called).
    pub type_id: fn() -> TypeId,
    /// The device and dtype of a value, without exporting it (lets [`convert`] refuse
    /// an unsupported pair before any device work; `None` when it cannot tell).
    pub inspect: InspectFn,
    /// The entry point.
    pub export: ExportFn,
}

impl ExportEntry {
    /// The entry of a type that implements [`Export`].
    pub const fn of<T: Export>() -> ExportEntry {
        ExportEntry {
            type_name: std::any::type_name::<T>,
            type_id: TypeId::of::<T>,
            inspect: inspect_as::<T>,
            export: export_as::<T>,
        }
    }
}

/// How an adapter imports: the Rust type it makes, the context it imports into, and
/// its entry points.
#[derive(Clone, Copy)]
pub struct ImportEntry {
    /// The name of the type it makes.
    pub type_name: fn() -> &'static str,
    /// The name of the context type it imports into ([`Stream`] for plain imports).
    pub context_name: fn() -> &'static str,
    /// The context type (checked before any work).
    pub context_id: fn() -> TypeId,
    /// The stream the context reads memory of a device on: the producer exports there.
    pub ready_stream: ReadyStreamFn,
    /// The entry point.
    pub import: ImportFn,
}

impl ImportEntry {
    /// The entry of a type that implements [`Import`]: its context is the consumer [`Stream`].
    pub const fn of<T: Import + Send + 'static>() -> ImportEntry {
        ImportEntry::of_context::<T, Stream>()
    }

    /// The entry of a type that imports into a context `C` ([`ImportInto<C>`]).
    pub const fn of_context<T: ImportInto<C> + Send + 'static, C: Any>() -> ImportEntry {
        ImportEntry {
            type_name: std::any::type_name::<T>,
            context_name: std::any::type_name::<C>,
            context_id: TypeId::of::<C>,
            ready_stream: ready_stream_in::<T, C>,
            import: import_into_as::<T, C>,
        }
    }
}

/// The generic export entry point of a type that implements [`Export`].
///
/// # Errors
/// [`Error::Adapter`] when `value` is not a `T`; any error of [`Export::export`].
pub fn export_as<T: Export>(value: Erased, consumer: &Stream) -> Result<Handoff> {
    match value.downcast::<T>() {
        Ok(v) => v.export(consumer),
        Err(_) => Err(Error::Adapter {
            adapter: "registry",
            message: format!("the value given is not a `{}`", std::any::type_name::<T>()),
        }),
    }
}

fn context<C: Any>(ctx: &dyn Any) -> Result<&C> {
    ctx.downcast_ref::<C>().ok_or_else(|| Error::Adapter {
        adapter: "registry",
        message: format!("the import context given is not a `{}`", std::any::type_name::<C>()),
    })
}

/// The generic import entry point of a type that implements [`ImportInto<C>`].
///
/// # Errors
/// [`Error::Adapter`] when `ctx` is not a `C`; any error of [`ImportInto::import_into`].
pub fn import_into_as<T: ImportInto<C> + Send + 'static, C: Any>(
    handoff: Handoff,
    ctx: &dyn Any,
) -> Result<Erased> {
    Ok(Box::new(T::import_into(handoff, context::<C>(ctx)?)?))
}

fn ready_stream_in<T: ImportInto<C>, C: Any>(ctx: &dyn Any, device: Device) -> Result<Stream> {
    T::ready_stream(context::<C>(ctx)?, device)
}

fn inspect_as<T: Export>(value: &(dyn Any + Send)) -> Option<(Device, DataType)> {
    let v = value.downcast_ref::<T>()?;
    let dtype = v.describe().ok()?.dtype;
    Some((v.device(), dtype))
}

/// An adapter's registration: what it is, what it takes, and its entry points.
///
/// Build it with [`Adapter::new`] and the `const` builder methods, and give it to
/// [`submit!`] (see the [module docs](self)).
#[derive(Clone, Copy)]
pub struct Adapter {
    /// The unique name that [`find`] and [`convert`] take (`torch`, `xla`, `ndarray`).
    pub name: &'static str,
    /// The adapter's version (its crate's `CARGO_PKG_VERSION`, usually).
    pub version: &'static str,
    /// One line on what it exchanges.
    pub about: &'static str,
    /// The kinds of device whose memory it takes and gives.
    pub devices: &'static [DeviceKind],
    /// The dtypes it takes and gives.
    pub dtypes: &'static [DataType],
    /// How it exports, if it does.
    pub export: Option<ExportEntry>,
    /// How it imports, if it does.
    pub import: Option<ImportEntry>,
    /// What `handoff doctor` runs to check its environment (never panics, never blocks long).
    pub probe: Option<ProbeFn>,
}

impl Adapter {
    /// An adapter that takes nothing yet: add devices, dtypes and entry points.
    pub const fn new(name: &'static str, version: &'static str) -> Adapter {
        Adapter {
            name,
            version,
            about: "",
            devices: &[],
            dtypes: &[],
            export: None,
            import: None,
            probe: None,
        }
    }

    /// One line on what it exchanges.
    pub const fn about(mut self, about: &'static str) -> Adapter {
        self.about = about;
        self
    }

    /// The kinds of device it takes.
    pub const fn devices(mut self, devices: &'static [DeviceKind]) -> Adapter {
        self.devices = devices;
        self
    }

    /// The dtypes it takes.
    pub const fn dtypes(mut self, dtypes: &'static [DataType]) -> Adapter {
        self.dtypes = dtypes;
        self
    }

    /// It exports values of `T`.
    pub const fn exports<T: Export>(mut self) -> Adapter {
        self.export = Some(ExportEntry::of::<T>());
        self
    }

    /// It imports into values of `T`, on the consumer stream [`convert`] is given.
    pub const fn imports<T: Import + Send + 'static>(mut self) -> Adapter {
        self.import = Some(ImportEntry::of::<T>());
        self
    }

    /// It imports into values of `T` in a context `C` (an XLA client), which
    /// [`convert_into`] is given.
    pub const fn imports_into<T: ImportInto<C> + Send + 'static, C: Any>(mut self) -> Adapter {
        self.import = Some(ImportEntry::of_context::<T, C>());
        self
    }

    /// What `handoff doctor` runs to check its environment.
    pub const fn probe(mut self, probe: ProbeFn) -> Adapter {
        self.probe = Some(probe);
        self
    }

    /// Whether it exports.
    pub fn can_export(&self) -> bool {
        self.export.is_some()
    }

    /// Whether it imports.
    pub fn can_import(&self) -> bool {
        self.import.is_some()
    }

    /// Whether it takes memory of `device`.
    pub fn supports_device(&self, device: Device) -> bool {
        self.devices.contains(&DeviceKind::of(device))
    }

    /// Whether it takes elements of `dtype`.
    pub fn supports_dtype(&self, dtype: DataType) -> bool {
        self.dtypes.contains(&dtype)
    }

    /// `import`, `export`, `import, export`, or `none`.
    pub fn capability(&self) -> &'static str {
        match (self.can_import(), self.can_export()) {
            (true, true) => "import, export",
            (true, false) => "import",
            (false, true) => "export",
            (false, false) => "none",
        }
    }

    /// Exports `value` (a `Box` of the adapter's export type) to `consumer`.
    ///
    /// # Errors
    /// [`RegistryError::CannotExport`], [`RegistryError::WrongType`],
    /// [`RegistryError::UnsupportedDevice`] / [`RegistryError::UnsupportedDtype`]
    /// when the value is one the adapter does not take (the value is given back in
    /// the [`ConvertError`]), or [`RegistryError::Failed`] with the adapter's own
    /// error (the value was consumed by the export).
    pub fn export(&self, value: Erased, consumer: &Stream) -> Result<Handoff, ConvertError> {
        let entry = match self.export_entry(&*value) {
            Ok(entry) => entry,
            Err(error) => return Err(ConvertError::refused(error, value)),
        };
        if let Some((device, dtype)) = (entry.inspect)(&*value)
            && let Err(error) = self.check(device, dtype)
        {
            return Err(ConvertError::refused(error, value));
        }
        (entry.export)(value, consumer).map_err(|source| {
            ConvertError::consumed(RegistryError::Failed { adapter: self.name, step: "export", source })
        })
    }

    /// The export entry, when it takes `value`'s type.
    fn export_entry(&self, value: &(dyn Any + Send)) -> Result<ExportEntry, RegistryError> {
        let entry = self.export.ok_or(RegistryError::CannotExport { adapter: self.name })?;
        if value.type_id() != (entry.type_id)() {
            return Err(RegistryError::WrongType { adapter: self.name, expected: (entry.type_name)() });
        }
        Ok(entry)
    }

    /// Imports `handoff` as the adapter's import type, boxed, into `ctx` (a
    /// [`Stream`] for plain imports, else the adapter's context type).
    ///
    /// # Errors
    /// [`RegistryError::CannotImport`], [`RegistryError::WrongContext`],
    /// [`RegistryError::UnsupportedDevice`] / [`RegistryError::UnsupportedDtype`], or
    /// [`RegistryError::Failed`].
    pub fn import(&self, handoff: Handoff, ctx: &dyn Any) -> Result<Erased, RegistryError> {
        let entry = self.import_entry(ctx)?;
        self.check(handoff.device(), handoff.dtype())?;
        (entry.import)(handoff, ctx).map_err(|source| RegistryError::Failed {
            adapter: self.name,
            step: "import",
            source,
        })
    }

    fn import_entry(&self, ctx: &dyn Any) -> Result<ImportEntry, RegistryError> {
        let entry = self.import.ok_or(RegistryError::CannotImport { adapter: self.name })?;
        if ctx.type_id() != (entry.context_id)() {
            return Err(RegistryError::WrongContext { adapter: self.name, expected: (entry.context_name)() });
        }
        Ok(entry)
    }

    /// Checks that the adapter takes `device` memory of `dtype`.
    ///
    /// # Errors
    /// [`RegistryError::UnsupportedDevice`] or [`RegistryError::UnsupportedDtype`].
    pub fn check(&self, device: Device, dtype: DataType) -> Result<(), RegistryError> {
        if !self.supports_device(device) {
            return Err(RegistryError::UnsupportedDevice {
                adapter: self.name,
                device,
                supported: join(self.devices.iter().map(|d| d.to_string())),
            });
        }
        if !self.supports_dtype(dtype) {
            return Err(RegistryError::UnsupportedDtype {
                adapter: self.name,
                dtype: dtype::name(dtype),
                supported: join(self.dtypes.iter().map(|&d| dtype::name(d))),
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adapter")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("devices", &self.devices)
            .field("dtypes", &self.dtypes.iter().map(|&d| dtype::name(d)).collect::<Vec<_>>())
            .field("export", &self.export.map(|e| (e.type_name)()))
            .field("import", &self.import.map(|e| (e.type_name)()))
            .finish()
    }
}

inventory::collect!(Adapter);

/// Whether a probed thing was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStatus {
    /// Found and usable.
    Found,
    /// Looked for and not found (the detail says where and why).
    NotFound,
    /// Not looked for (the detail says why: an adapter not built, a feature off).
    NotChecked,
}

/// One line of `handoff doctor`: what was checked, whether it was found, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What was checked (`libtorch`, `PJRT plugin /opt/...`, `CUDA device 0`).
    pub subject: String,
    /// Found or not.
    pub status: ProbeStatus,
    /// What was found (a version, a path) or why not.
    pub detail: String,
}

impl Probe {
    /// Something found.
    pub fn found(subject: impl Into<String>, detail: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::Found, detail: detail.into() }
    }
    /// Something looked for and not found.
    pub fn not_found(subject: impl Into<String>, why: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::NotFound, detail: why.into() }
    }
    /// Something not looked for.
    pub fn not_checked(subject: impl Into<String>, why: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::NotChecked, detail: why.into() }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            ProbeStatus::Found => "found",
            ProbeStatus::NotFound => "not found",
            ProbeStatus::NotChecked => "not checked yet",
        };
        write!(f, "{}: {status} ({})", self.subject, self.detail)
    }
}

/// Why the registry refused. Each variant names the adapter and the value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No adapter of this name is registered.
    #[error(
        "no adapter named `{name}` is registered (registered: {known}); link the adapter's \
         crate into the program (`use my_adapter as _;`) or enable its feature of `handoff`"
    )]
    UnknownAdapter {
        /// The name asked for.
        name: String,
        /// The names registered.
        known: String,
    },
    /// Two or more adapters are registered under one name (two versions of one
    /// adapter crate linked into the program, or two crates that chose one name):
    /// [`find`] and [`convert`] refuse to pick one by link order.
    #[error(
        "{} adapters are registered as `{name}` ({candidates}); `find` and `convert` take none of them: \
         link only one (`cargo tree -i <adapter crate>` shows who pulls in each; `handoff doctor` lists them)",
        versions.len()
    )]
    Ambiguous {
        /// The name asked for.
        name: String,
        /// The versions registered under it, sorted.
        versions: Vec<&'static str>,
        /// Each of them with the types it exports and imports.
        candidates: String,
    },
    /// The adapter does not export.
    #[error("adapter `{adapter}` cannot export (it only imports); convert from an adapter that exports")]
    CannotExport {
        /// The adapter.
        adapter: &'static str,
    },
    /// The adapter does not import.
    #[error("adapter `{adapter}` cannot import (it only exports); convert to an adapter that imports")]
    CannotImport {
        /// The adapter.
        adapter: &'static str,
    },
    /// The value is not the adapter's export type.
    #[error(
        "adapter `{adapter}` exports `{expected}`, and the value given is another type; pass a `Box<{expected}>`"
    )]
    WrongType {
        /// The adapter.
        adapter: &'static str,
        /// The type it exports.
        expected: &'static str,
    },
    /// The adapter does not take memory of this device.
    #[error(
        "adapter `{adapter}` does not take {device} memory (it takes: {supported}); move the tensor \
         to one of those devices first, or convert to an adapter that takes {device}"
    )]
    UnsupportedDevice {
        /// The adapter.
        adapter: &'static str,
        /// The device of the value.
        device: Device,
        /// The devices it takes.
        supported: String,
    },
    /// The adapter does not take elements of this dtype.
    #[error("adapter `{adapter}` does not take dtype {dtype} (it takes: {supported}); cast the tensor first")]
    UnsupportedDtype {
        /// The adapter.
        adapter: &'static str,
        /// The dtype of the value.
        dtype: String,
        /// The dtypes it takes.
        supported: String,
    },
    /// The adapter imports into another context than the one given.
    #[error(
        "adapter `{adapter}` imports into a `{expected}`, and the context given is another type; \
         pass a `{expected}` (to `registry::convert_into`; `convert` passes a `Stream`)"
    )]
    WrongContext {
        /// The adapter.
        adapter: &'static str,
        /// The context type it imports into.
        expected: &'static str,
    },
    /// The adapter's own entry point failed.
    #[error("adapter `{adapter}` failed to {step}: {source}")]
    Failed {
        /// The adapter.
        adapter: &'static str,
        /// `export` or `import` (the value was consumed), or, before any export
        /// (the value is given back, see [`ConvertError`]), `describe` (the export
        /// type could not describe the value) or `pick a stream` (the import context
        /// named no stream for the value's device).
        step: &'static str,
        /// Its error.
        #[source]
        source: Error,
    },
}

/// Why [`convert`], [`convert_into`] or [`Adapter::export`] failed: the
/// [`RegistryError`] (match on the public `error` field), and the caller's value,
/// given back when the call was refused before anything was exported — an unknown or
/// ambiguous name, an adapter that cannot export or import, a value of another type,
/// a context of another type, a device or dtype an adapter does not take, a value
/// that cannot be described, or an import context that names no stream. Once the
/// export ran (an export or import failure, [`RegistryError::Failed`] with step
/// `export` or `import`), the value is gone: the export consumed it, and what it
/// became was released.
///
/// It displays as its `error`, converts into it (`?` in a function returning
/// `RegistryError`), and is `Send + Sync`, so it also converts into
/// `Box<dyn Error + Send + Sync>`.
///
/// ```
/// use handoff_runtime::{mock::Mock, registry::{self, RegistryError}};
/// let mock = Mock::new();
/// let s = mock.stream(0, "s");
/// let err = registry::convert(Box::new(7u8), "mock", "mock", &s).unwrap_err();
/// assert!(matches!(err.error, RegistryError::WrongType { adapter: "mock", .. }), "{err}");
/// assert!(err.has_value());
/// assert_eq!(*err.into_value().unwrap().downcast::<u8>().unwrap(), 7);
/// ```
pub struct ConvertError {
    /// Why.
    pub error: RegistryError,
    /// The caller's value, when no export happened. In a `Mutex` only so that the
    /// error is `Sync`, as error types are expected to be (it is never locked: only
    /// `&mut self` and `self` reach it), and boxed to keep the error small.
    value: Option<Box<Mutex<Erased>>>,
}

impl ConvertError {
    /// A refusal before any export: `value` goes back to the caller.
    pub fn refused(error: RegistryError, value: Erased) -> ConvertError {
        ConvertError { error, value: Some(Box::new(Mutex::new(value))) }
    }

    /// A failure after the export took the value.
    pub fn consumed(error: RegistryError) -> ConvertError {
        ConvertError { error, value: None }
    }

    /// Whether the caller's value is given back.
    pub fn has_value(&self) -> bool {
        self.value.is_some()
    }

    /// Takes the caller's value back, when no export happened (see the type's docs);
    /// the error stays.
    pub fn take_value(&mut self) -> Option<Erased> {
        self.value.take().map(|v| v.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// The caller's value, when no export happened (see the type's docs).
    pub fn into_value(self) -> Option<Erased> {
        self.into_parts().1
    }

    /// The error and the caller's value.
    pub fn into_parts(mut self) -> (RegistryError, Option<Erased>) {
        let value = self.take_value();
        (self.error, value)
    }
}

impl From<ConvertError> for RegistryError {
    fn from(e: ConvertError) -> RegistryError {
        e.error
    }
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConvertError")
            .field("error", &self.error)
            .field("value", &if self.has_value() { "given back" } else { "consumed" })
            .finish()
    }
}

impl std::error::Error for ConvertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() { "nothing".into() } else { v.join(", ") }
}

/// Every registered adapter, sorted by name.
///
/// ```
/// let names: Vec<_> = handoff_runtime::registry::list().iter().map(|a| a.name).collect();
/// assert!(names.contains(&"mock"));
/// ```
pub fn list() -> Vec<&'static Adapter> {
    let mut v: Vec<&'static Adapter> = inventory::iter::<Adapter>.into_iter().collect();
    v.sort_by(|a, b| a.name.cmp(b.name).then(a.version.cmp(b.version)));
    v
}

/// The adapter registered as `name`.
///
/// # Errors
/// [`RegistryError::UnknownAdapter`], which lists the names registered;
/// [`RegistryError::Ambiguous`] when more than one adapter is registered as `name`
/// (it lists their versions and types): the registry never picks one by link order.
///
/// ```
/// let mock = handoff_runtime::registry::find("mock").unwrap();
/// assert_eq!(mock.capability(), "import, export");
/// assert!(handoff_runtime::registry::find("nope").is_err());
/// ```
pub fn find(name: &str) -> Result<&'static Adapter, RegistryError> {
    let mut found: Vec<&'static Adapter> =
        inventory::iter::<Adapter>.into_iter().filter(|a| a.name == name).collect();
    match found.len() {
        1 => Ok(found[0]),
        0 => Err(RegistryError::UnknownAdapter {
            name: name.into(),
            known: join(list().iter().map(|a| a.name.into())),
        }),
        _ => {
            found.sort_by(|a, b| a.version.cmp(b.version));
            Err(RegistryError::Ambiguous {
                name: name.into(),
                versions: found.iter().map(|a| a.version).collect(),
                candidates: found
                    .iter()
                    .map(|a| {
                        let export = a.export.map_or("nothing".into(), |e| format!("`{}`", (e.type_name)()));
                        let import = a.import.map_or("nothing".into(), |e| format!("`{}`", (e.type_name)()));
                        format!("{} {} exporting {export} and importing {import}", a.name, a.version)
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            })
        }
    }
}

/// Converts `value` (a `Box` of adapter `from`'s tensor type) into adapter `to`'s
/// tensor type, made ready on `consumer_stream` without a copy: `from` exports to
/// `consumer_stream`, `to` imports. Downcast the result to `to`'s type. For an
/// adapter that imports into a context (`xla`: a `handoff_xla::Client`), use
/// [`convert_into`].
///
/// # Errors
/// A [`ConvertError`], whose `error` is: [`RegistryError::UnknownAdapter`] or
/// [`RegistryError::Ambiguous`] for either name; [`RegistryError::CannotExport`] /
/// [`RegistryError::CannotImport`]; [`RegistryError::WrongType`];
/// [`RegistryError::WrongContext`] when `to` imports into a context;
/// [`RegistryError::UnsupportedDevice`] / [`RegistryError::UnsupportedDtype`] when
/// either adapter does not take the value's device or dtype (checked before any
/// device work); [`RegistryError::Failed`]. For all but `Failed` with step `export`
/// or `import`, the error gives `value` back ([`ConvertError::into_value`]).
pub fn convert(
    value: Erased,
    from: &str,
    to: &str,
    consumer_stream: &Stream,
) -> Result<Erased, ConvertError> {
    convert_into(value, from, to, consumer_stream)
}

/// Converts `value` into adapter `to`'s tensor type inside `ctx`, the context `to`
/// imports into (`&client` for `xla`; a [`Stream`] for plain imports, as
/// [`convert`] passes): `from` exports straight to the stream the context reads on,
/// and `to` imports there.
///
/// ```
/// use handoff_runtime::{mock::{Mock, MockTensor}, registry};
/// let mock = Mock::new();
/// let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
/// let x = mock.tensor_f32(&a, "x", &[2], &[1.0, 2.0]);
/// let y = registry::convert_into(Box::new(x), "mock", "mock", &b).unwrap();
/// assert_eq!(y.downcast::<MockTensor>().unwrap().stream(), &b);
/// // The mock adapter imports on a stream: another context is refused before any work.
/// let z = mock.tensor_f32(&a, "z", &[1], &[1.0]);
/// assert!(registry::convert_into(Box::new(z), "mock", "mock", &5u32).is_err());
/// ```
///
/// # Errors
/// As [`convert`]; [`RegistryError::WrongContext`] when `ctx` is not `to`'s context
/// type (the value is given back).
pub fn convert_into(value: Erased, from: &str, to: &str, ctx: &dyn Any) -> Result<Erased, ConvertError> {
    let (from, export, to, stream) = match prepare(&*value, from, to, ctx) {
        Ok(prepared) => prepared,
        Err(error) => return Err(ConvertError::refused(error, value)),
    };
    // From here on the value is the export's.
    let handoff = (export.export)(value, &stream).map_err(|source| {
        ConvertError::consumed(RegistryError::Failed { adapter: from.name, step: "export", source })
    })?;
    to.import(handoff, ctx).map_err(ConvertError::consumed)
}

type Prepared = (&'static Adapter, ExportEntry, &'static Adapter, Stream);

/// Everything [`convert_into`] checks before the export takes the value: both names,
/// the context, the value's type, device and dtype, and the stream to export to.
fn prepare(value: &(dyn Any + Send), from: &str, to: &str, ctx: &dyn Any) -> Result<Prepared, RegistryError> {
    let (from, to) = (find(from)?, find(to)?);
    let entry = to.import_entry(ctx)?;
    let export = from.export_entry(value)?;
    let Some((device, dtype)) = (export.inspect)(value) else {
        return Err(RegistryError::Failed {
            adapter: from.name,
            step: "describe",
            source: Error::Adapter {
                adapter: "registry",
                message: format!("cannot describe the `{}` given", (export.type_name)()),
            },
        });
    };
    from.check(device, dtype)?;
    to.check(device, dtype)?;
    let stream = (entry.ready_stream)(ctx, device).map_err(|source| RegistryError::Failed {
        adapter: to.name,
        step: "pick a stream",
        source,
    })?;
    Ok((from, export, to, stream))
}

submit! {
    Adapter::new("mock", env!("CARGO_PKG_VERSION"))
        .about("handoff's simulated device with a hazard checker (handoff::mock::MockTensor)")
        .devices(&[DeviceKind::Mock])
        .dtypes(dtype::ALL)
        .exports::<crate::mock::MockTensor>()
        .imports::<crate::mock::MockTensor>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{Mock, MockTensor};

    #[test]
    fn mock_is_registered_and_unknown_names_are_refused() {
        let mock = find("mock").unwrap();
        assert_eq!((mock.can_export(), mock.can_import()), (true, true));
        assert!(mock.supports_device(Device::Mock(3)) && !mock.supports_device(Device::Host));
        let err = find("torchh").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(&err, RegistryError::UnknownAdapter { name, .. } if name == "torchh"), "{msg}");
        assert!(msg.contains("mock"), "{msg}");
    }

    #[test]
    fn wrong_types_and_devices_are_refused_before_any_work() {
        let m = Mock::new();
        let s = m.stream(0, "s");
        let err = convert(Box::new(5u32), "mock", "mock", &s).unwrap_err();
        assert!(matches!(err.error, RegistryError::WrongType { adapter: "mock", .. }), "{err}");
        let x = m.tensor_f32(&s, "x", &[1], &[1.0]);
        let y = convert(Box::new(x), "mock", "mock", &s).unwrap();
        assert!(y.downcast::<MockTensor>().is_ok());
    }
}

#[cfg(test)]
mod refusals {
    use super::*;
    use crate::mock::{Mock, MockTensor};

    submit! {
        Adapter::new("unit-twice", "1.0.0").devices(&[DeviceKind::Mock]).dtypes(dtype::ALL).exports::<MockTensor>()
    }
    submit! {
        Adapter::new("unit-twice", "2.0.0").devices(&[DeviceKind::Mock]).dtypes(dtype::ALL).imports::<MockTensor>()
    }

    submit! {
        Adapter::new("unit-host", "1.0.0").devices(&[DeviceKind::Host]).dtypes(dtype::ALL).imports::<MockTensor>()
    }
    submit! {
        Adapter::new("unit-f64", "1.0.0").devices(&[DeviceKind::Mock]).dtypes(&[DataType::F64]).imports::<MockTensor>()
    }

    #[test]
    fn a_name_registered_twice_is_refused_naming_both() {
        let err = find("unit-twice").unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, RegistryError::Ambiguous { name, versions, .. }
                if name == "unit-twice" && versions == &["1.0.0", "2.0.0"]),
            "{msg}"
        );
        assert!(
            msg.contains("unit-twice 1.0.0 exporting `handoff_runtime::mock::tensor::MockTensor`"),
            "{msg}"
        );
        assert!(msg.contains("2.0.0 exporting nothing and importing"), "{msg}");
        // Both are still listed (for `handoff doctor`).
        assert_eq!(list().iter().filter(|a| a.name == "unit-twice").count(), 2);
    }

    /// Every refusal before the export gives the value back, untouched.
    #[test]
    fn a_refused_convert_gives_the_value_back() {
        let m = Mock::new();
        let s = m.stream(0, "s");
        type Case<'a> = (&'a str, &'a str, &'a dyn Any, fn(&RegistryError) -> bool);
        let cases: [Case<'_>; 5] = [
            ("mock", "nope", &s, |e| matches!(e, RegistryError::UnknownAdapter { .. })),
            ("unit-twice", "mock", &s, |e| matches!(e, RegistryError::Ambiguous { .. })),
            ("mock", "mock", &5u32, |e| matches!(e, RegistryError::WrongContext { adapter: "mock", .. })),
            ("mock", "unit-host", &s, |e| {
                matches!(e, RegistryError::UnsupportedDevice { adapter: "unit-host", .. })
            }),
            ("mock", "unit-f64", &s, |e| {
                matches!(e, RegistryError::UnsupportedDtype { adapter: "unit-f64", .. })
            }),
        ];
        for (from, to, ctx, expected) in cases {
            let x = m.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
            let (buffer, ptr) = (x.buffer(), x.data_ptr());
            let (err, delta) =
                crate::stats::measure(|| convert_into(Box::new(x), from, to, ctx).unwrap_err());
            assert!(expected(&err.error), "{from} -> {to}: {err}");
            assert_eq!(delta.exports, 0, "{from} -> {to}: refused before any export");
            let back: Box<MockTensor> = err.into_value().expect("given back").downcast().unwrap();
            assert_eq!((back.buffer(), back.data_ptr()), (buffer, ptr));
            drop(back);
            m.synchronize();
            assert!(m.is_released(buffer));
        }
        let err = convert(Box::new(5u32), "mock", "mock", &s).unwrap_err();
        assert_eq!(*err.into_value().unwrap().downcast::<u32>().unwrap(), 5);
        // Once exported, the value is gone: a mock tensor does not import on the host.
        let x = m.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
        let (err, delta) =
            crate::stats::measure(|| convert(Box::new(x), "mock", "mock", &Stream::host()).unwrap_err());
        assert!(matches!(err.error, RegistryError::Failed { adapter: "mock", step: "import", .. }), "{err}");
        assert_eq!(delta.exports, 1);
        assert!(!err.has_value());
    }

    #[test]
    fn adapter_export_gives_a_refused_value_back() {
        let err = find("mock").unwrap().export(Box::new("text"), &Stream::host()).unwrap_err();
        assert!(matches!(err.error, RegistryError::WrongType { adapter: "mock", .. }), "{err}");
        let mut err = err;
        assert!(err.has_value());
        assert_eq!(*err.take_value().unwrap().downcast::<&str>().unwrap(), "text");
        assert!(!err.has_value());
        // The error converts into a plain `RegistryError` and a boxed `Send + Sync` error.
        let boxed: Box<dyn std::error::Error + Send + Sync> = err.into();
        assert!(boxed.to_string().contains("adapter `mock` exports"), "{boxed}");
    }

    /// The mock adapter advertises every dtype: its import takes every one.
    #[test]
    fn the_mock_imports_every_dtype_it_advertises() {
        struct Retyped(MockTensor, DataType);
        impl crate::StreamOrdered for Retyped {
            fn device(&self) -> Device {
                crate::StreamOrdered::device(&self.0)
            }
            fn stream(&self) -> Option<Stream> {
                Some(self.0.stream().clone())
            }
        }
        impl Export for Retyped {
            fn describe(&self) -> Result<crate::TensorDesc<'_>> {
                Ok(crate::TensorDesc::new(
                    self.0.data_ptr().cast(),
                    crate::StreamOrdered::device(&self.0),
                    self.1,
                    &[1i64][..],
                ))
            }
        }
        let m = Mock::new();
        let s = m.stream(0, "s");
        let mock = find("mock").unwrap();
        let entry = mock.import.unwrap();
        for &dtype in mock.dtypes {
            let h = Retyped(m.tensor_f32(&s, "x", &[4], &[0.0; 4]), dtype).export(&s).unwrap();
            let t = (entry.import)(h, &s).unwrap_or_else(|e| panic!("{}: {e}", dtype::name(dtype)));
            assert!(t.is::<MockTensor>());
        }
    }
}
