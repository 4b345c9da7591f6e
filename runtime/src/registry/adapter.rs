//! An adapter's registration: what it is, what it takes, its entry points.

use super::*;

/// An adapter's registration: what it is, what it takes, and its entry points.
///
/// Build it with [`Adapter::new`] and the `const` builder methods, and give it to
/// [`submit!`] (see the [registry docs](crate::registry)).
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
    pub fn export(&self, value: AnyTensor, consumer: &Stream) -> Result<Handoff, ConvertError> {
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
    pub(super) fn export_entry(&self, value: &(dyn Any + Send)) -> Result<ExportEntry, RegistryError> {
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
    pub fn import(&self, handoff: Handoff, ctx: &dyn Any) -> Result<AnyTensor, RegistryError> {
        let entry = self.import_entry(ctx)?;
        self.check(handoff.device(), handoff.dtype())?;
        (entry.import)(handoff, ctx).map_err(|source| RegistryError::Failed {
            adapter: self.name,
            step: "import",
            source,
        })
    }

    pub(super) fn import_entry(&self, ctx: &dyn Any) -> Result<ImportEntry, RegistryError> {
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
