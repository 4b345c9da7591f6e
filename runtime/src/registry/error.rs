//! Why the registry refused, and the value it gives back.

use super::*;

/// Why the registry refused. Each variant names the adapter and the value at fault.
///
/// # What a caller of bad input sees
///
/// Each variant below says when [`find`], [`convert`], [`convert_into`] or an
/// [`Adapter`]'s `export`/`import` returns it and shows its message for the values of
/// its test (in `tests/tests/registry.rs`, or the registry module's unit tests in
/// `runtime/src/registry/tests.rs`). The `registry_convert` fuzz target checks every
/// outcome with random names, values and descriptors. A refusal before anything was
/// exported gives the caller's value back ([`ConvertError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No adapter of this name is registered: a misspelt name, or an adapter whose crate
    /// is not linked into the program (`torch` without the feature, for one). Names the
    /// first unknown name and lists the registered ones.
    ///
    /// ```text
    /// no adapter named `pytorch` is registered (registered: ...); link the adapter's crate into the program (`use my_adapter as _;`) or enable its feature of `handoff`
    /// ```
    ///
    /// Tests: `registry::unknown_names_and_unsupported_pairs_are_clear_errors`; unit test
    /// `basics::mock_is_registered_and_unknown_names_are_refused`.
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
    /// [`find`] and [`convert`] refuse to pick one by link order. Each candidate is named
    /// with its version and the types it exports and imports.
    ///
    /// ```text
    /// 2 adapters are registered as `test-twice` (test-twice 0.0.1 exporting `registry::Frame<f32>` and importing ...; test-twice 0.0.2 exporting `registry::Frame<i32>` and importing nothing); `find` and `convert` take none of them: link only one (`cargo tree -i <adapter crate>` shows who pulls in each; `handoff doctor` lists them)
    /// ```
    ///
    /// Tests: `registry::two_adapters_with_one_name_are_refused`; unit test
    /// `refusals::a_name_registered_twice_is_refused_naming_both`.
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
    /// The adapter given as `from` does not export (it only imports).
    ///
    /// ```text
    /// adapter `<name>` cannot export (it only imports); convert from an adapter that exports
    /// ```
    ///
    /// No test of its own.
    #[error("adapter `{adapter}` cannot export (it only imports); convert from an adapter that exports")]
    CannotExport {
        /// The adapter.
        adapter: &'static str,
    },
    /// The adapter given as `to` does not import (it only exports).
    ///
    /// ```text
    /// adapter `test-frame-i32` cannot import (it only exports); convert to an adapter that imports
    /// ```
    ///
    /// Test: `registry::unknown_names_and_unsupported_pairs_are_clear_errors`.
    #[error("adapter `{adapter}` cannot import (it only exports); convert to an adapter that imports")]
    CannotImport {
        /// The adapter.
        adapter: &'static str,
    },
    /// The value is not the `from` adapter's export type; names that adapter and the
    /// type it exports.
    ///
    /// ```text
    /// adapter `test-frame-i32` exports `registry::Frame<i32>`, and the value given is another type; pass a `Box<registry::Frame<i32>>`
    /// ```
    ///
    /// Tests: `registry::unknown_names_and_unsupported_pairs_are_clear_errors`; unit tests
    /// `basics::wrong_types_and_devices_are_refused_before_any_work`,
    /// `refusals::adapter_export_gives_a_refused_value_back`.
    #[error(
        "adapter `{adapter}` exports `{expected}`, and the value given is another type; pass a `Box<{expected}>`"
    )]
    WrongType {
        /// The adapter.
        adapter: &'static str,
        /// The type it exports.
        expected: &'static str,
    },
    /// The adapter does not take memory of this device; refused before any export or
    /// device work.
    ///
    /// ```text
    /// adapter `ndarray` does not take mock:0 memory (it takes: host); move the tensor to one of those devices first, or convert to an adapter that takes mock:0
    /// ```
    ///
    /// Tests: `registry::unknown_names_and_unsupported_pairs_are_clear_errors`; unit test
    /// `refusals::a_refused_convert_gives_the_value_back`.
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
    /// The adapter does not take elements of this dtype; refused before any export or
    /// device work.
    ///
    /// ```text
    /// adapter `ndarray` does not take dtype i32 (it takes: f32); cast the tensor first
    /// ```
    ///
    /// Tests: `registry::unknown_names_and_unsupported_pairs_are_clear_errors`; unit test
    /// `refusals::a_refused_convert_gives_the_value_back`.
    #[error("adapter `{adapter}` does not take dtype {dtype} (it takes: {supported}); cast the tensor first")]
    UnsupportedDtype {
        /// The adapter.
        adapter: &'static str,
        /// The dtype of the value.
        dtype: String,
        /// The dtypes it takes.
        supported: String,
    },
    /// The adapter imports into another context than the one given (`xla` imports into
    /// a client: [`convert`], which passes a stream, is refused for it).
    ///
    /// ```text
    /// adapter `xla` imports into a `handoff_xla::client::Client`, and the context given is another type; pass a `handoff_xla::client::Client` (to `registry::convert_into`; `convert` passes a `Stream`)
    /// ```
    ///
    /// Tests: unit test `refusals::a_refused_convert_gives_the_value_back`; handoff-xla's
    /// `kernel_cpu::registry_imports_into_the_client_it_is_given`.
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
    /// The adapter's own entry point failed: its export or import refused the value, the
    /// value could not be described (step `describe`), or the import context named no
    /// stream for the value's device (step `pick a stream`).
    ///
    /// ```text
    /// adapter `mock` failed to import: ...
    /// ```
    ///
    /// Test: unit test `refusals::a_refused_convert_gives_the_value_back` (a mock tensor
    /// imported on the host); the `registry_convert` fuzz target.
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
    value: Option<Box<Mutex<AnyTensor>>>,
}

impl ConvertError {
    /// A refusal before any export: `value` goes back to the caller.
    pub fn refused(error: RegistryError, value: AnyTensor) -> ConvertError {
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
    pub fn take_value(&mut self) -> Option<AnyTensor> {
        self.value.take().map(|v| v.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// The caller's value, when no export happened (see the type's docs).
    pub fn into_value(self) -> Option<AnyTensor> {
        self.into_parts().1
    }

    /// The error and the caller's value.
    pub fn into_parts(mut self) -> (RegistryError, Option<AnyTensor>) {
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
