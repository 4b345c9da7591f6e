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
pub type AnyTensor = Box<dyn Any + Send>;

/// The export entry point of an adapter: makes the value ready on the consumer
/// stream and wraps it in a [`Handoff`].
pub type ExportFn = fn(AnyTensor, &Stream) -> Result<Handoff>;

/// The import entry point of an adapter: takes a [`Handoff`] in as the adapter's
/// tensor type, boxed, into its context (a [`Stream`] for plain imports).
pub type ImportFn = fn(Handoff, &dyn Any) -> Result<AnyTensor>;

/// The stream an import context reads memory of a device on.
pub type ReadyStreamFn = fn(&dyn Any, Device) -> Result<Stream>;

/// Tells the device and dtype of a value without exporting it (`None` when it cannot).
pub type InspectFn = fn(&(dyn Any + Send)) -> Option<(Device, DataType)>;

/// What an adapter checks about its environment, for `handoff doctor`.
pub type ProbeFn = fn() -> Vec<Probe>;

mod adapter;
mod entry;
mod error;
mod probe;
#[cfg(test)]
mod tests;

pub use adapter::Adapter;
pub use entry::*;
pub use error::{ConvertError, RegistryError};
pub use probe::{Probe, ProbeStatus};

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
    value: AnyTensor,
    from: &str,
    to: &str,
    consumer_stream: &Stream,
) -> Result<AnyTensor, ConvertError> {
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
pub fn convert_into(
    value: AnyTensor,
    from: &str,
    to: &str,
    ctx: &dyn Any,
) -> Result<AnyTensor, ConvertError> {
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
