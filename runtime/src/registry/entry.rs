//! How an adapter's type is reached through the registry: its entry points, made
//! generically from the `Export` and `ImportInto` impls.

use super::*;

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
pub fn export_as<T: Export>(value: AnyTensor, consumer: &Stream) -> Result<Handoff> {
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
) -> Result<AnyTensor> {
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
