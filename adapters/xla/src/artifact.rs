//! `jax.export` artifacts: the bytes of `Exported.serialize()`, a flatbuffer of JAX's
//! schema `jax/_src/export/serialization.fbs` (serialization versions up to
//! [`SERIALIZATION_VERSION`]), holding the StableHLO module and its calling convention.
//!
//! The schema is transcribed by hand below (module `fb`) the way `flatc` writes Rust:
//! each table is a [`flatbuffers::Table`] with accessors at its vtable slots and a
//! [`Verifiable`](flatbuffers::Verifiable) impl, both generated from one field list so
//! the accessors read exactly what the verifier checked. [`flatbuffers::root`] verifies
//! the whole buffer before anything is read: malformed bytes are an
//! [`XlaError::Invalid`], never a panic or an out-of-bounds read.

use crate::error::{Result, XlaError};
use crate::hlo::ArraySpec;
use handoff_runtime::dtype::DataType;

/// The newest `Exported` serialization version this reader knows (jax 0.11.2 writes 12;
/// 0 means an artifact older than the field, which JAX started filling in version 12).
const SERIALIZATION_VERSION: u16 = 12;

/// The calling convention versions whose module signature this reader understands
/// (JAX's `minimum/maximum_supported_calling_convention_version` in jax 0.11.2).
const CALLING_CONVENTIONS: std::ops::RangeInclusive<u16> = 9..=10;

/// The magic number of MLIR bytecode (StableHLO portable artifacts).
const MLIR_BYTECODE_MAGIC: &[u8] = b"ML\xefR";

/// The schema, as `flatc --rust` would generate it (only what is needed: accessors for
/// the fields read, verification of every field).
mod fb {
    use flatbuffers::{Follow, ForwardsUOffset, InvalidFlatbuffer, Table, Vector, Verifiable, Verifier};

    /// Declares a table: its struct, its `Follow` impl, one accessor per `read` field
    /// (returning `None` where the field is absent) and a `Verifiable` impl visiting
    /// every field, `read` and `verified` alike. Each field is `name: vtable slot => type`,
    /// the slot being `4 + 2 * (field index in the schema)`.
    macro_rules! table {
        (
            $(#[$doc:meta])*
            $name:ident {
                read { $($field:ident: $slot:literal => $ty:ty,)* }
                verified { $($vfield:ident: $vslot:literal => $vty:ty,)* }
            }
        ) => {
            $(#[$doc])*
            #[derive(Clone, Copy)]
            pub(super) struct $name<'a> {
                #[allow(dead_code, reason = "tables only verified (`read {}`) have no accessor")]
                tab: Table<'a>,
            }

            impl<'a> Follow<'a> for $name<'a> {
                type Inner = $name<'a>;
                unsafe fn follow(buf: &'a [u8], loc: usize) -> Self::Inner {
                    // SAFETY: `Follow::follow`'s contract: the caller guarantees that a
                    // table of this type starts at `loc` in `buf` (its soffset to a valid
                    // vtable); every caller here follows offsets the verifier checked.
                    $name { tab: unsafe { Table::new(buf, loc) } }
                }
            }

            impl<'a> $name<'a> {
                $(
                    pub(super) fn $field(&self) -> Option<<$ty as Follow<'a>>::Inner> {
                        // SAFETY: a `$name` is only made by following a verified offset
                        // (from `flatbuffers::root`), and its `Verifiable` impl below,
                        // generated from this same field list, checked that this slot, if
                        // present, holds a valid `$ty` inside the buffer.
                        unsafe { self.tab.get::<$ty>($slot, None) }
                    }
                )*
            }

            impl<'a> Verifiable for $name<'a> {
                fn run_verifier(v: &mut Verifier, pos: usize) -> Result<(), InvalidFlatbuffer> {
                    v.visit_table(pos)?
                        $(.visit_field::<$ty>(stringify!($field), $slot, false)?)*
                        $(.visit_field::<$vty>(stringify!($vfield), $vslot, false)?)*
                        .finish();
                    Ok(())
                }
            }
        };
    }

    /// A string field.
    type Str<'a> = ForwardsUOffset<&'a str>;
    /// A vector field of scalars or strings.
    type Array<'a, T> = ForwardsUOffset<Vector<'a, T>>;
    /// A vector field of tables.
    type Tables<'a, T> = ForwardsUOffset<Vector<'a, ForwardsUOffset<T>>>;

    table! {
        /// `table PyTreeDef` (verified only).
        PyTreeDef {
            read {}
            verified {
                kind: 4 => i8,
                children: 6 => Tables<'a, PyTreeDef<'a>>,
                children_names: 8 => Array<'a, Str<'a>>,
                custom_name: 10 => Str<'a>,
                custom_auxdata: 12 => Array<'a, i8>,
            }
        }
    }

    table! {
        /// `table AbstractDevice` (verified only).
        AbstractDevice {
            read {}
            verified {
                device_kind: 4 => Str<'a>,
                num_cores: 6 => u32,
                platform: 8 => Str<'a>,
            }
        }
    }

    table! {
        /// `table AbstractMesh`.
        AbstractMesh {
            read {
                axis_sizes: 4 => Array<'a, u32>,
            }
            verified {
                axis_names: 6 => Array<'a, Str<'a>>,
                axis_types: 8 => Array<'a, i8>,
                abstract_device: 10 => ForwardsUOffset<AbstractDevice<'a>>,
            }
        }
    }

    table! {
        /// `table PartitionSpecOneAxis` (verified only).
        PartitionSpecOneAxis {
            read {}
            verified {
                axes: 4 => Array<'a, Str<'a>>,
            }
        }
    }

    table! {
        /// `table PartitionSpec` (verified only).
        PartitionSpec {
            read {}
            verified {
                partitions: 4 => Tables<'a, PartitionSpecOneAxis<'a>>,
                reduced: 6 => Array<'a, Str<'a>>,
                unreduced: 8 => Array<'a, Str<'a>>,
            }
        }
    }

    table! {
        /// `table NamedSharding`.
        NamedSharding {
            read {
                mesh: 4 => ForwardsUOffset<AbstractMesh<'a>>,
                memory_kind: 8 => Str<'a>,
                abstract_mesh_idx: 10 => u32,
            }
            verified {
                spec: 6 => ForwardsUOffset<PartitionSpec<'a>>,
            }
        }
    }

    table! {
        /// `table AbstractValue`: `kind` is `AbstractValueKind` (0 shapedArray,
        /// 1 abstractToken), `dtype` is `DType`, `memory_space` is `MemorySpace`
        /// (0 Missing, 1 Device, 2 Host, 3 Any); `shape` holds one string per dimension.
        AbstractValue {
            read {
                kind: 4 => i8,
                shape: 6 => Array<'a, Str<'a>>,
                dtype: 8 => i8,
                memory_space: 10 => i8,
            }
            verified {}
        }
    }

    table! {
        /// `table Sharding` (before serialization version 10; `kind` is
        /// `ShardingKind`, no longer written).
        Sharding {
            read {
                hlo_sharding_proto: 6 => Array<'a, i8>,
                named_sharding: 8 => ForwardsUOffset<NamedSharding<'a>>,
            }
            verified {
                kind: 4 => i8,
            }
        }
    }

    table! {
        /// `table Effect` (verified only).
        Effect {
            read {}
            verified {
                type_name: 4 => Str<'a>,
            }
        }
    }

    table! {
        /// `table DisabledSafetyCheck` (verified only).
        DisabledSafetyCheck {
            read {}
            verified {
                kind: 4 => i8,
                custom_call_target: 6 => Str<'a>,
            }
        }
    }

    table! {
        /// `table Exported`, the root.
        Exported {
            read {
                serialization_version: 4 => u16,
                function_name: 6 => Str<'a>,
                in_avals: 10 => Tables<'a, AbstractValue<'a>>,
                out_avals: 14 => Tables<'a, AbstractValue<'a>>,
                nr_devices_short: 16 => i16,
                in_shardings: 18 => Tables<'a, Sharding<'a>>,
                out_shardings: 20 => Tables<'a, Sharding<'a>>,
                platforms: 22 => Array<'a, Str<'a>>,
                ordered_effects: 24 => Tables<'a, Effect<'a>>,
                unordered_effects: 26 => Tables<'a, Effect<'a>>,
                mlir_module_serialized: 30 => Array<'a, u8>,
                calling_convention_version: 32 => u16,
                module_kept_var_idx: 34 => Array<'a, u16>,
                nr_devices: 40 => u32,
                unique_avals: 42 => Tables<'a, AbstractValue<'a>>,
                unique_abstract_meshes: 44 => Tables<'a, AbstractMesh<'a>>,
                unique_named_shardings: 46 => Tables<'a, NamedSharding<'a>>,
                in_avals_idxs: 48 => Array<'a, u32>,
                out_avals_idxs: 50 => Array<'a, u32>,
                in_shardings_idxs: 52 => Array<'a, u32>,
                out_shardings_idxs: 54 => Array<'a, u32>,
                jax_version: 56 => Str<'a>,
            }
            verified {
                in_tree: 8 => ForwardsUOffset<PyTreeDef<'a>>,
                out_tree: 12 => ForwardsUOffset<PyTreeDef<'a>>,
                disabled_checks: 28 => Tables<'a, DisabledSafetyCheck<'a>>,
                uses_global_constants: 36 => bool,
                vjp: 38 => ForwardsUOffset<Exported<'a>>,
            }
        }
    }
}

/// JAX's `DType` enum: its name in the schema and the DLPack dtype, where there is one.
const DTYPES: &[(i8, &str, Option<DataType>)] = &[
    (0, "bool", Some(DataType::BOOL)),
    (1, "i8", Some(DataType::I8)),
    (2, "i16", Some(DataType::I16)),
    (3, "i32", Some(DataType::I32)),
    (4, "i64", Some(DataType::I64)),
    (5, "ui8", Some(DataType::U8)),
    (6, "ui16", Some(DataType::U16)),
    (7, "ui32", Some(DataType::U32)),
    (8, "ui64", Some(DataType::U64)),
    (9, "f16", Some(DataType::F16)),
    (10, "f32", Some(DataType::F32)),
    (11, "f64", Some(DataType::F64)),
    (12, "c64", Some(DataType::C64)),
    (13, "c128", Some(DataType::C128)),
    (14, "bf16", Some(DataType::BF16)),
    (15, "i4", None),
    (16, "ui4", None),
    (17, "f8_e4m3b11fnuz", Some(DataType::F8E4M3B11FNUZ)),
    (18, "f8_e4m3fn", Some(DataType::F8E4M3FN)),
    (19, "f8_e4m3fnuz", Some(DataType::F8E4M3FNUZ)),
    (20, "f8_e5m2", Some(DataType::F8E5M2)),
    (21, "f8_e5m2fnuz", Some(DataType::F8E5M2FNUZ)),
    (22, "f0 (float0)", None),
    (23, "f8_e4m3", Some(DataType::F8E4M3)),
    (24, "f8_e3m4", Some(DataType::F8E3M4)),
    (25, "f8_e8m0fnu", Some(DataType::F8E8M0FNU)),
    (26, "f4_e2m1fn", Some(DataType::F4E2M1FN)),
    (27, "key<fry> (PRNG key)", None),
    (28, "key<rbg> (PRNG key)", None),
    (29, "key<unsafe_rbg> (PRNG key)", None),
];

/// A `jax.export` artifact: the StableHLO module and its calling convention.
///
/// The module's parameters are, in order: the platform index (an `i32` scalar) when
/// [`takes_platform_index`](Artifact::takes_platform_index), then the inputs listed by
/// [`kept_inputs`](Artifact::kept_inputs). Its results are the
/// [`outputs`](Artifact::outputs).
///
/// What handoff does not support yet is refused with [`XlaError::Unsupported`]: shape
/// polymorphism, effects, sharding over several devices, non-device memory, token
/// values, dtypes DLPack has no code for, a serialization version newer than those read
/// here, and calling convention versions other than 9 and 10 (the ones jax 0.11 writes).
///
/// ```no_run
/// use handoff_xla::{Artifact, Program};
/// let artifact = Artifact::from_bytes(&std::fs::read("f.jaxexport").unwrap())?;
/// let program = Program::bytecode(artifact.module());
/// // Exported for several platforms, the module's first parameter is the platform
/// // index, e.g. `artifact.platform_index("cuda")`.
/// assert_eq!(artifact.takes_platform_index(), artifact.platforms().len() > 1);
/// # Ok::<(), handoff_xla::XlaError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Artifact {
    function_name: String,
    platforms: Vec<String>,
    inputs: Vec<ArraySpec>,
    outputs: Vec<ArraySpec>,
    kept_inputs: Vec<usize>,
    module: Vec<u8>,
    calling_convention_version: u16,
}

impl std::fmt::Debug for Artifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Artifact")
            .field("function_name", &self.function_name)
            .field("platforms", &self.platforms)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("kept_inputs", &self.kept_inputs)
            .field("module", &format_args!("<{} bytes>", self.module.len()))
            .field("calling_convention_version", &self.calling_convention_version)
            .finish()
    }
}

impl Artifact {
    /// Reads the bytes of `Exported.serialize()`.
    ///
    /// Malformed bytes are [`XlaError::Invalid`]; an artifact using what handoff does
    /// not support yet is [`XlaError::Unsupported`], naming the feature.
    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact> {
        let exp = flatbuffers::root::<fb::Exported>(bytes).map_err(|e| {
            XlaError::invalid(
                "jax.export artifact",
                format!("{} bytes", bytes.len()),
                format!("not a jax.export flatbuffer (Exported.serialize()): {e}"),
            )
        })?;
        read(exp)
    }

    /// The function name JAX recorded.
    pub fn function_name(&self) -> &str {
        &self.function_name
    }

    /// The platforms it was exported for, lower case as JAX writes them ("cpu", "cuda",
    /// "rocm", "tpu").
    pub fn platforms(&self) -> &[String] {
        &self.platforms
    }

    /// Index of `platform` in [`platforms`](Artifact::platforms): the value of the
    /// platform-index parameter to run on it.
    pub fn platform_index(&self, platform: &str) -> Option<usize> {
        self.platforms.iter().position(|p| p == platform)
    }

    /// Whether the module's first parameter is the platform index (JAX adds it when
    /// exported for more than one platform).
    pub fn takes_platform_index(&self) -> bool {
        self.platforms.len() > 1
    }

    /// The user-visible inputs (JAX's `in_avals`, flattened).
    pub fn inputs(&self) -> &[ArraySpec] {
        &self.inputs
    }

    /// The user-visible outputs (JAX's `out_avals`, flattened): the module's results.
    pub fn outputs(&self) -> &[ArraySpec] {
        &self.outputs
    }

    /// Which of the [`inputs`](Artifact::inputs) the module actually takes, in order
    /// (JAX's `module_kept_var_idx`: unused inputs are dropped from the module).
    pub fn kept_inputs(&self) -> &[usize] {
        &self.kept_inputs
    }

    /// The serialized StableHLO module (portable artifact bytecode, starts with
    /// `b"ML\xefR"`).
    pub fn module(&self) -> &[u8] {
        &self.module
    }

    /// The calling convention version (9 or 10: see JAX's "Calling convention
    /// versions").
    pub fn calling_convention_version(&self) -> u16 {
        self.calling_convention_version
    }
}

fn invalid(part: &str, value: impl ToString, reason: impl Into<String>) -> XlaError {
    XlaError::invalid(format!("jax.export artifact: {part}"), value, reason)
}

fn unsupported(feature: impl Into<String>, detail: impl Into<String>) -> XlaError {
    XlaError::Unsupported { feature: feature.into(), detail: detail.into() }
}

/// A vector field's elements (an absent vector reads as empty, as in flatbuffers).
fn elements<'a, T: flatbuffers::Follow<'a> + 'a>(v: Option<flatbuffers::Vector<'a, T>>) -> Vec<T::Inner> {
    v.map(|v| v.iter().collect()).unwrap_or_default()
}

fn read(exp: fb::Exported<'_>) -> Result<Artifact> {
    let version = exp.serialization_version().unwrap_or(0);
    if version > SERIALIZATION_VERSION {
        let jax = exp.jax_version().map(|v| format!(" (written by jax {v})")).unwrap_or_default();
        return Err(unsupported(
            format!("serialization version {version}"),
            format!("handoff-xla reads versions up to {SERIALIZATION_VERSION}{jax}"),
        ));
    }
    let function_name =
        exp.function_name().ok_or_else(|| invalid("function_name", "absent", "JAX always writes it"))?;
    let platforms: Vec<String> = elements(exp.platforms()).into_iter().map(String::from).collect();
    if platforms.is_empty() {
        return Err(invalid("platforms", "[]", "an artifact is exported for at least one platform"));
    }
    let module = exp.mlir_module_serialized().map(|v| v.bytes()).unwrap_or_default();
    if !module.starts_with(MLIR_BYTECODE_MAGIC) {
        return Err(invalid(
            "mlir_module_serialized",
            format!("{} bytes", module.len()),
            "not MLIR bytecode (no ML\\xefR magic)",
        ));
    }

    let calling_convention_version = exp.calling_convention_version().unwrap_or(0);
    if !CALLING_CONVENTIONS.contains(&calling_convention_version) {
        return Err(unsupported(
            format!("calling convention version {calling_convention_version}"),
            format!(
                "handoff-xla knows the module signature of versions {}..={}",
                CALLING_CONVENTIONS.start(),
                CALLING_CONVENTIONS.end()
            ),
        ));
    }

    let ordered = exp.ordered_effects().map_or(0, |v| v.len());
    let unordered = exp.unordered_effects().map_or(0, |v| v.len());
    if ordered + unordered > 0 {
        return Err(unsupported(
            "effects",
            format!(
                "{function_name} has {ordered} ordered and {unordered} unordered effects \
                 (ordered effects add token parameters and results to the module)"
            ),
        ));
    }

    // Serialization version 5 widened nr_devices to 32 bits; older artifacts have the short.
    let nr_devices = match exp.nr_devices().unwrap_or(0) {
        0 => i64::from(exp.nr_devices_short().unwrap_or(0)),
        n => i64::from(n),
    };
    if nr_devices > 1 {
        return Err(unsupported(
            "sharding over several devices",
            format!("{function_name} was exported for {nr_devices} devices"),
        ));
    }
    if nr_devices < 1 {
        return Err(invalid("nr_devices", nr_devices, "an artifact is exported for at least one device"));
    }

    let unique_avals = elements(exp.unique_avals());
    let in_avals = avals("in_avals_idxs", exp.in_avals_idxs(), exp.in_avals(), &unique_avals)?;
    let out_avals = avals("out_avals_idxs", exp.out_avals_idxs(), exp.out_avals(), &unique_avals)?;
    let inputs = in_avals
        .iter()
        .enumerate()
        .map(|(i, a)| array_spec(&format!("input {i} of {function_name}"), *a))
        .collect::<Result<Vec<_>>>()?;
    let outputs = out_avals
        .iter()
        .enumerate()
        .map(|(i, a)| array_spec(&format!("output {i} of {function_name}"), *a))
        .collect::<Result<Vec<_>>>()?;

    let unique_meshes = elements(exp.unique_abstract_meshes());
    let unique_shardings = elements(exp.unique_named_shardings());
    let shardings = [
        ("input", "in_shardings", inputs.len(), exp.in_shardings_idxs(), exp.in_shardings()),
        ("output", "out_shardings", outputs.len(), exp.out_shardings_idxs(), exp.out_shardings()),
    ];
    for (what, field, count, idxs, inline) in shardings {
        let idxs = elements(idxs);
        let inline = elements(inline);
        let n = if idxs.is_empty() { inline.len() } else { idxs.len() };
        if n != 0 && n != count {
            return Err(invalid(field, format!("{n} shardings"), format!("there are {count} {what}s")));
        }
        for i in 0..n {
            let at = format!("{what} {i} of {function_name}");
            let named = if idxs.is_empty() {
                let s = inline[i];
                if s.named_sharding().is_none() && s.hlo_sharding_proto().is_some() {
                    return Err(unsupported(
                        "an HloSharding",
                        format!(
                            "{at} has only an HloSharding (versions before 6, which JAX refuses as expired)"
                        ),
                    ));
                }
                s.named_sharding()
            } else {
                // 0 is an unspecified sharding, k the (k-1)th unique named sharding.
                match idxs[i] {
                    0 => None,
                    k => Some(
                        usize::try_from(k - 1)
                            .ok()
                            .and_then(|k| unique_shardings.get(k).copied())
                            .ok_or_else(|| {
                                invalid(
                                    &format!("{field}_idxs"),
                                    k,
                                    format!(
                                        "an index past the {} unique_named_shardings",
                                        unique_shardings.len()
                                    ),
                                )
                            })?,
                    ),
                }
            };
            if let Some(named) = named {
                check_named_sharding(&at, named, &unique_meshes)?;
            }
        }
    }

    let kept_inputs: Vec<usize> = elements(exp.module_kept_var_idx()).into_iter().map(usize::from).collect();
    if let Some(&bad) = kept_inputs.iter().find(|&&i| i >= inputs.len()) {
        return Err(invalid(
            "module_kept_var_idx",
            format!("{kept_inputs:?}"),
            format!("index {bad} is past the {} inputs", inputs.len()),
        ));
    }
    if kept_inputs.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid(
            "module_kept_var_idx",
            format!("{kept_inputs:?}"),
            "JAX writes it sorted, without repeats",
        ));
    }

    Ok(Artifact {
        function_name: function_name.to_owned(),
        platforms,
        inputs,
        outputs,
        kept_inputs,
        module: module.to_vec(),
        calling_convention_version,
    })
}

type Avals<'a> = flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<fb::AbstractValue<'a>>>;

/// The avals of the inputs or outputs: indices into `unique` when there are any (version
/// 10 stores each distinct aval once), else the inline avals (older versions).
fn avals<'a>(
    field: &str,
    idxs: Option<flatbuffers::Vector<'a, u32>>,
    inline: Option<Avals<'a>>,
    unique: &[fb::AbstractValue<'a>],
) -> Result<Vec<fb::AbstractValue<'a>>> {
    let idxs = elements(idxs);
    if idxs.is_empty() {
        return Ok(elements(inline));
    }
    idxs.into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| unique.get(i).copied())
                .ok_or_else(|| invalid(field, i, format!("an index past the {} unique_avals", unique.len())))
        })
        .collect()
}

/// An aval as an [`ArraySpec`], refusing what handoff cannot exchange.
fn array_spec(at: &str, aval: fb::AbstractValue<'_>) -> Result<ArraySpec> {
    let dims = elements(aval.shape());
    let shape_text = || format!("({})", dims.join(", "));
    match aval.kind().unwrap_or(0) {
        0 => {}
        1 => return Err(unsupported("token values", format!("{at} is a token"))),
        k => {
            return Err(invalid(
                "AbstractValue.kind",
                k,
                format!("{at}: 0 (shapedArray) or 1 (abstractToken)"),
            ));
        }
    }
    match aval.memory_space().unwrap_or(0) {
        0 | 1 => {}
        m @ (2 | 3) => {
            let space = if m == 2 { "Host" } else { "Any" };
            return Err(unsupported(
                "a memory space other than Device",
                format!("{at} is in memory space {space}"),
            ));
        }
        m => return Err(invalid("AbstractValue.memory_space", m, format!("{at}: 0 to 3 (MemorySpace)"))),
    }
    let code = aval.dtype().unwrap_or(0);
    let dtype = match DTYPES.iter().find(|(c, _, _)| *c == code) {
        Some((_, _, Some(d))) => *d,
        Some((_, name, None)) => {
            return Err(unsupported(
                format!("the dtype {name}"),
                format!("{at} is {name}{}, which DLPack has no code for", shape_text()),
            ));
        }
        None => {
            return Err(unsupported(
                format!("the dtype code {code}"),
                format!("{at} has a DType unknown to serialization version {SERIALIZATION_VERSION}"),
            ));
        }
    };
    let mut shape = Vec::with_capacity(dims.len());
    for d in &dims {
        if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unsupported(
                "shape polymorphism",
                format!("{at} has shape {}: dimension `{d}` is symbolic", shape_text()),
            ));
        }
        shape.push(d.parse::<i64>().map_err(|e| invalid("AbstractValue.shape", d, format!("{at}: {e}")))?);
    }
    Ok(ArraySpec { dtype: Some(dtype), shape })
}

/// Accepts a named sharding only on one device (a mesh of one device, in device memory).
fn check_named_sharding(
    at: &str,
    named: fb::NamedSharding<'_>,
    unique_meshes: &[fb::AbstractMesh<'_>],
) -> Result<()> {
    // Version 10 indexes unique_abstract_meshes; older versions inline the mesh (as JAX reads).
    let mesh = if unique_meshes.is_empty() {
        named.mesh().ok_or_else(|| invalid("NamedSharding.mesh", "absent", format!("{at}: no mesh")))?
    } else {
        let idx = named.abstract_mesh_idx().unwrap_or(0);
        usize::try_from(idx).ok().and_then(|i| unique_meshes.get(i).copied()).ok_or_else(|| {
            invalid(
                "NamedSharding.abstract_mesh_idx",
                idx,
                format!("{at}: an index past the {} unique_abstract_meshes", unique_meshes.len()),
            )
        })?
    };
    let sizes = elements(mesh.axis_sizes());
    let devices = sizes.iter().try_fold(1u64, |n, &s| n.checked_mul(u64::from(s)));
    if devices != Some(1) {
        let devices = devices.map_or_else(|| "too many".to_owned(), |n| n.to_string());
        return Err(unsupported(
            "sharding over several devices",
            format!("{at} is sharded over a mesh of {devices} devices (axis sizes {sizes:?})"),
        ));
    }
    if let Some(kind) = named.memory_kind().filter(|k| *k != "device") {
        return Err(unsupported("a memory kind other than device", format!("{at} is in memory kind {kind}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flatbuffers::{FlatBufferBuilder, WIPOffset};

    const LN_GELU_CPU: &[u8] = include_bytes!("../programs/ln_gelu_f32_8x16_cpu.jaxexport");
    const LN_GELU_CPU_CUDA: &[u8] = include_bytes!("../programs/ln_gelu_f32_8x16_cpu_cuda.jaxexport");
    const RESIDUAL: &[u8] = include_bytes!("../programs/residual_f32_8x16_cpu_cuda.jaxexport");
    const UNUSED_ARG: &[u8] = include_bytes!("../programs/unused_arg_f32_cpu.jaxexport");
    const POLY: &[u8] = include_bytes!("../programs/poly_f32_cpu.jaxexport");

    fn f32s(shape: &[i64]) -> ArraySpec {
        ArraySpec { dtype: Some(DataType::F32), shape: shape.to_vec() }
    }

    fn feature(e: XlaError) -> String {
        match e {
            XlaError::Unsupported { feature, .. } => feature,
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn artifact_single_platform() {
        let a = Artifact::from_bytes(LN_GELU_CPU).unwrap();
        assert_eq!(a.function_name(), "ln_gelu");
        assert_eq!(a.platforms(), ["cpu"]);
        assert_eq!(a.platform_index("cpu"), Some(0));
        assert_eq!(a.platform_index("cuda"), None);
        assert!(!a.takes_platform_index());
        assert_eq!(a.inputs(), [f32s(&[8, 16])]);
        assert_eq!(a.outputs(), [f32s(&[8, 16])]);
        assert_eq!(a.kept_inputs(), [0]);
        assert!(a.module().starts_with(b"ML\xefR"));
        assert_eq!(a.calling_convention_version(), 10);
        assert!(format!("{a:?}").contains("bytes>"));
    }

    #[test]
    fn artifact_multi_platform_takes_platform_index() {
        let a = Artifact::from_bytes(LN_GELU_CPU_CUDA).unwrap();
        assert_eq!(a.function_name(), "ln_gelu");
        assert_eq!(a.platforms(), ["cpu", "cuda"]);
        assert_eq!(a.platform_index("cuda"), Some(1));
        assert!(a.takes_platform_index());
        assert_eq!(a.inputs(), [f32s(&[8, 16])]);
        assert_eq!(a.outputs(), [f32s(&[8, 16])]);
        assert_eq!(a.kept_inputs(), [0]);
        assert!(a.module().starts_with(b"ML\xefR"));

        let r = Artifact::from_bytes(RESIDUAL).unwrap();
        assert_eq!(r.function_name(), "residual");
        assert_eq!(r.platforms(), ["cpu", "cuda"]);
        assert_eq!(r.platform_index("cpu"), Some(0));
        assert!(r.takes_platform_index());
        assert_eq!(r.inputs(), [f32s(&[8, 16]), f32s(&[16, 16])]);
        assert_eq!(r.outputs(), [f32s(&[8, 16]), f32s(&[8, 16])]);
        assert_eq!(r.kept_inputs(), [0, 1]);
        assert!(r.module().starts_with(b"ML\xefR"));
        assert_eq!(r.calling_convention_version(), 10);
    }

    #[test]
    fn artifact_unused_input_is_dropped() {
        let a = Artifact::from_bytes(UNUSED_ARG).unwrap();
        assert_eq!(a.function_name(), "unused_arg");
        assert_eq!(a.platforms(), ["cpu"]);
        assert!(!a.takes_platform_index());
        assert_eq!(a.inputs(), [f32s(&[4]), f32s(&[8])]);
        assert_eq!(a.outputs(), [f32s(&[8])]);
        assert_eq!(a.kept_inputs(), [1]);
        assert!(a.module().starts_with(b"ML\xefR"));
    }

    #[test]
    fn artifact_shape_polymorphism_is_refused() {
        let e = Artifact::from_bytes(POLY).unwrap_err();
        let msg = e.to_string();
        assert_eq!(feature(e), "shape polymorphism");
        assert!(msg.contains("`b`"), "{msg}");
    }

    #[test]
    fn artifact_malformed_bytes_are_invalid() {
        for bytes in [&b""[..], b"\0", b"abc", b"\0\0\0\0", b"\xff\xff\xff\xff", b"ML\xefR not a flatbuffer"]
        {
            let e = Artifact::from_bytes(bytes).unwrap_err();
            assert!(matches!(e, XlaError::Invalid { .. }), "{bytes:?}: {e:?}");
        }
        let e = Artifact::from_bytes(&LN_GELU_CPU[..LN_GELU_CPU.len() / 2]).unwrap_err();
        assert!(matches!(e, XlaError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().starts_with("jax.export artifact is"), "{e}");
    }

    #[test]
    fn artifact_every_truncation_is_invalid() {
        for bytes in [LN_GELU_CPU, RESIDUAL, UNUSED_ARG, POLY] {
            let whole = Artifact::from_bytes(bytes);
            // The buffer ends with the first string JAX wrote (the function name), its
            // NUL and zero padding: cutting only padding leaves the same artifact.
            let padding = bytes.iter().rev().take_while(|&&b| b == 0).count().saturating_sub(1);
            for n in 0..bytes.len() {
                match Artifact::from_bytes(&bytes[..n]) {
                    Err(XlaError::Invalid { .. }) if n < bytes.len() - padding => {}
                    Ok(a) if n >= bytes.len() - padding => assert_eq!(Ok(&a), whole.as_ref().map_err(|_| ())),
                    Err(XlaError::Unsupported { .. }) if n >= bytes.len() - padding && whole.is_err() => {}
                    other => panic!("truncated to {n} of {} bytes: {other:?}", bytes.len()),
                }
            }
        }
    }

    #[test]
    fn artifact_random_corruption_never_panics() {
        // xorshift64*: deterministic, no dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let (mut ok, mut refused) = (0, 0);
        for base in [RESIDUAL, LN_GELU_CPU_CUDA] {
            for _ in 0..3000 {
                let mut bytes = base.to_vec();
                for _ in 0..=(next() % 4) {
                    let at = (next() % bytes.len() as u64) as usize;
                    match next() % 3 {
                        0 => bytes[at] ^= 1 << (next() % 8),
                        1 => bytes[at] = next() as u8,
                        _ => bytes[at] = [0x00, 0xff, 0x7f, 0x80][(next() % 4) as usize],
                    }
                }
                match Artifact::from_bytes(&bytes) {
                    Ok(_) => ok += 1,
                    Err(XlaError::Invalid { .. } | XlaError::Unsupported { .. }) => refused += 1,
                    Err(e) => panic!("unexpected error kind: {e:?}"),
                }
            }
        }
        assert!(refused > 0 && ok > 0, "ok {ok}, refused {refused}");
    }

    /// What a synthetic artifact holds (built with the flatbuffers builder, the layout
    /// JAX writes): the defaults make a valid single-platform f32[4] -> f32[4] artifact.
    struct Fake {
        version: u16,
        calling_convention: u16,
        nr_devices: u32,
        dtype: i8,
        dims: Vec<&'static str>,
        memory_space: i8,
        ordered_effects: usize,
        mesh_axis_sizes: Option<Vec<u32>>,
        inline_avals: bool,
        kept: Vec<u16>,
        platforms: Vec<&'static str>,
    }

    impl Default for Fake {
        fn default() -> Self {
            Fake {
                version: 12,
                calling_convention: 10,
                nr_devices: 1,
                dtype: 10,
                dims: vec!["4"],
                memory_space: 1,
                ordered_effects: 0,
                mesh_axis_sizes: None,
                inline_avals: false,
                kept: vec![0],
                platforms: vec!["cpu"],
            }
        }
    }

    impl Fake {
        fn build(&self) -> Vec<u8> {
            type Off = WIPOffset<flatbuffers::TableFinishedWIPOffset>;
            let mut b = FlatBufferBuilder::new();
            let dims: Vec<_> = self.dims.iter().map(|d| b.create_string(d)).collect();
            let shape = b.create_vector(&dims);
            let t = b.start_table();
            b.push_slot::<i8>(4, 0, 0);
            b.push_slot_always(6, shape);
            b.push_slot::<i8>(8, self.dtype, 0);
            b.push_slot::<i8>(10, self.memory_space, 0);
            let aval: Off = b.end_table(t);
            let avals = b.create_vector(&[aval]);
            let name = b.create_string("fake");
            let platforms: Vec<_> = self.platforms.iter().map(|p| b.create_string(p)).collect();
            let platforms = b.create_vector(&platforms);
            let effects: Vec<Off> = (0..self.ordered_effects)
                .map(|_| {
                    let n = b.create_string("<class 'Effect'>");
                    let t = b.start_table();
                    b.push_slot_always(4, n);
                    b.end_table(t)
                })
                .collect();
            let effects = b.create_vector(&effects);
            let module = b.create_vector(&b"ML\xefR fake module"[..]);
            let kept = b.create_vector(&self.kept);
            let idxs = b.create_vector(&[0u32]);
            let (meshes, shardings, sharding_idxs) = match &self.mesh_axis_sizes {
                None => (None, None, b.create_vector(&[0u32])),
                Some(sizes) => {
                    let sizes = b.create_vector(sizes);
                    let t = b.start_table();
                    b.push_slot_always(4, sizes);
                    let mesh: Off = b.end_table(t);
                    let t = b.start_table();
                    b.push_slot_always(4, mesh);
                    b.push_slot::<u32>(10, 0, 0);
                    let named: Off = b.end_table(t);
                    let meshes = b.create_vector(&[mesh]);
                    let named = b.create_vector(&[named]);
                    (Some(meshes), Some(named), b.create_vector(&[1u32]))
                }
            };
            let t = b.start_table();
            b.push_slot::<u16>(4, self.version, 0);
            b.push_slot_always(6, name);
            if self.inline_avals {
                b.push_slot_always(10, avals);
                b.push_slot_always(14, avals);
            } else {
                b.push_slot_always(42, avals);
                b.push_slot_always(48, idxs);
                b.push_slot_always(50, idxs);
            }
            b.push_slot_always(22, platforms);
            b.push_slot_always(24, effects);
            b.push_slot_always(30, module);
            b.push_slot::<u16>(32, self.calling_convention, 0);
            b.push_slot_always(34, kept);
            b.push_slot::<u32>(40, self.nr_devices, 0);
            if let (Some(m), Some(s)) = (meshes, shardings) {
                b.push_slot_always(44, m);
                b.push_slot_always(46, s);
            }
            b.push_slot_always(52, sharding_idxs);
            b.push_slot_always(54, sharding_idxs);
            let root = b.end_table(t);
            b.finish_minimal(root);
            b.finished_data().to_vec()
        }

        fn read(self) -> Result<Artifact> {
            Artifact::from_bytes(&self.build())
        }
    }

    #[test]
    fn artifact_synthetic_valid() {
        let a = Fake::default().read().unwrap();
        assert_eq!(a.function_name(), "fake");
        assert_eq!(a.inputs(), [f32s(&[4])]);
        assert_eq!(a.outputs(), [f32s(&[4])]);
        let a = Fake { inline_avals: true, version: 0, dtype: 14, ..Fake::default() }.read().unwrap();
        assert_eq!(a.inputs(), [ArraySpec { dtype: Some(DataType::BF16), shape: vec![4] }]);
        // A named sharding on a mesh of one device is one device.
        let a = Fake { mesh_axis_sizes: Some(vec![1, 1]), ..Fake::default() }.read().unwrap();
        assert_eq!(a.kept_inputs(), [0]);
        let a = Fake { dims: vec![], ..Fake::default() }.read().unwrap();
        assert_eq!(a.inputs(), [f32s(&[])]);
    }

    #[test]
    fn artifact_unsupported_features_are_named() {
        let cases = [
            (Fake { version: 13, ..Fake::default() }, "serialization version 13"),
            (Fake { calling_convention: 11, ..Fake::default() }, "calling convention version 11"),
            (Fake { ordered_effects: 1, ..Fake::default() }, "effects"),
            (Fake { nr_devices: 8, ..Fake::default() }, "sharding over several devices"),
            (Fake { mesh_axis_sizes: Some(vec![2, 1]), ..Fake::default() }, "sharding over several devices"),
            (Fake { dtype: 22, ..Fake::default() }, "the dtype f0 (float0)"),
            (Fake { dtype: 15, ..Fake::default() }, "the dtype i4"),
            (Fake { dtype: 27, ..Fake::default() }, "the dtype key<fry> (PRNG key)"),
            (Fake { dtype: 99, ..Fake::default() }, "the dtype code 99"),
            (Fake { dims: vec!["2*b"], ..Fake::default() }, "shape polymorphism"),
            (Fake { memory_space: 2, ..Fake::default() }, "a memory space other than Device"),
        ];
        for (fake, want) in cases {
            let e = fake.read().unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("this jax.export artifact uses {want}, ")), "{msg}");
            assert_eq!(feature(e), want);
        }
    }

    #[test]
    fn artifact_inconsistent_fields_are_invalid() {
        for fake in [
            Fake { kept: vec![1], ..Fake::default() },
            Fake { platforms: vec![], ..Fake::default() },
            Fake { nr_devices: 0, ..Fake::default() },
            Fake { dims: vec!["99999999999999999999"], ..Fake::default() },
        ] {
            let e = fake.read().unwrap_err();
            assert!(matches!(e, XlaError::Invalid { .. }), "{e:?}");
        }
    }

    #[test]
    fn artifact_dtype_table_matches_dlpack() {
        for (code, name, dtype) in DTYPES {
            if let Some(d) = dtype {
                assert!(handoff_runtime::dtype::check(*d).is_ok(), "{name}");
                assert!(crate::dtype::to_pjrt(*d).is_some(), "{name}");
            }
            assert_eq!(DTYPES.iter().filter(|(c, _, _)| c == code).count(), 1);
        }
    }
}
