//! `jax.export` artifacts: the bytes of `Exported.serialize()`, a flatbuffer of JAX's
//! schema `jax/_src/export/serialization.fbs` (serialization versions up to
//! [`SERIALIZATION_VERSION`]), holding the StableHLO module and its calling convention.
//!
//! The schema is transcribed by hand (module `fb`, in `fb.rs`) the way `flatc` writes Rust:
//! each table is a [`flatbuffers::Table`] with accessors at its vtable slots and a
//! [`Verifiable`](flatbuffers::Verifiable) impl, both generated from one field list so
//! the accessors read exactly what the verifier checked. [`flatbuffers::root_with_opts`]
//! (module `verify`, with limits sized to the input) verifies the whole buffer before
//! anything is read: malformed bytes are an [`XlaError::Invalid`] naming the field
//! (`Exported.in_avals[1].shape`) and the byte offset, never a panic or an
//! out-of-bounds read.

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

mod fb;
mod verify;

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
/// Serialized with `vjp_order=1` or more (`Exported.serialize(vjp_order=1)`), it also
/// carries its VJP, an artifact of its own: [`vjp`](Artifact::vjp).
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
    float0_inputs: Vec<usize>,
    float0_outputs: Vec<usize>,
    vjp: Option<Vjp>,
}

/// The VJP an artifact carries, as read.
#[derive(Clone, PartialEq, Eq)]
enum Vjp {
    Read(Box<Artifact>),
    /// Read, but using what handoff does not support yet: the refusal's message (the
    /// primal stays usable).
    Refused(String),
}

/// JAX's dtype code of `float0`, the dtype of the cotangent of an integer or boolean
/// value (no data): the module has an `i1` array of that shape in its place.
const FLOAT0: i8 = 22;

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
            .field("float0_inputs", &self.float0_inputs)
            .field("float0_outputs", &self.float0_outputs)
            .field(
                "vjp",
                &match &self.vjp {
                    None => "none".to_owned(),
                    Some(Vjp::Read(v)) => format!("{v:?}"),
                    Some(Vjp::Refused(why)) => format!("refused: {why}"),
                },
            )
            .finish()
    }
}

impl Artifact {
    /// Reads the bytes of `Exported.serialize()`.
    ///
    /// Malformed bytes are [`XlaError::Invalid`], naming the field and the byte offset
    /// at fault; an artifact using what handoff does not support yet is
    /// [`XlaError::Unsupported`], naming the feature.
    ///
    /// **Truncated bytes.** A flatbuffer records no total length, so an artifact with
    /// bytes cut off its end is refused only when a cut byte is one that some field
    /// uses. The builder writes from the end of its buffer backwards, and JAX's
    /// serializer writes `function_name` first, so the artifact ends with that string,
    /// its NUL terminator and 0 to 3 bytes of alignment padding (`residual`: 8
    /// characters, a NUL, 3 padding bytes). Cutting padding loads, and safely: the
    /// verifier checks that every byte each field refers to lies inside the slice
    /// given, and nothing refers to the padding, so the artifact read is exactly the
    /// uncut one (test `truncated_artifacts_load_identically_or_are_refused_by_field`).
    /// Cutting the terminator or anything before it is refused, naming the field
    /// (`Exported.function_name`) and the bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact> {
        read(verify::root(bytes)?)
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

    /// The user-visible inputs (JAX's `in_avals`, flattened). A `float0` input (see
    /// [`float0_inputs`](Artifact::float0_inputs)) is listed as a `bool` array.
    pub fn inputs(&self) -> &[ArraySpec] {
        &self.inputs
    }

    /// The user-visible outputs (JAX's `out_avals`, flattened): the module's results. A
    /// `float0` output (see [`float0_outputs`](Artifact::float0_outputs)) is listed as
    /// the `bool` array the module returns (all `false`).
    pub fn outputs(&self) -> &[ArraySpec] {
        &self.outputs
    }

    /// Which [`inputs`](Artifact::inputs) are of JAX's dtype `float0`: the cotangents a
    /// VJP takes for integer and boolean outputs, which hold no data. The module never
    /// reads them (an artifact whose module does is refused), so a
    /// [`Kernel`](crate::Kernel) does not take them.
    pub fn float0_inputs(&self) -> &[usize] {
        &self.float0_inputs
    }

    /// Which [`outputs`](Artifact::outputs) are of JAX's dtype `float0`: the cotangents
    /// a VJP gives for integer and boolean inputs, returned by the module as `bool`
    /// arrays of zeros (`false`).
    pub fn float0_outputs(&self) -> &[usize] {
        &self.float0_outputs
    }

    /// Whether the artifact carries its VJP (it was serialized with `vjp_order` >= 1),
    /// readable or not (see [`vjp`](Artifact::vjp)).
    pub fn has_vjp(&self) -> bool {
        self.vjp.is_some()
    }

    /// The VJP (vector-Jacobian product) JAX serialized with the artifact
    /// (`Exported.serialize(vjp_order=1)`; JAX's `Exported.vjp()`): an artifact taking
    /// the primal inputs, then one cotangent per output, and returning one cotangent
    /// per input, exported for the same platforms (so a multi-platform VJP takes its
    /// own platform index first).
    ///
    /// The cotangent of an integer or boolean output is `float0` (see
    /// [`float0_inputs`](Artifact::float0_inputs)), and that of such an input comes back
    /// as a `bool` array of zeros (see [`float0_outputs`](Artifact::float0_outputs)).
    ///
    /// [`XlaError::NoVjp`] when the artifact was serialized without one (`vjp_order=0`,
    /// JAX's default) or its VJP uses what handoff does not support yet (the primal
    /// still loads).
    ///
    /// ```no_run
    /// use handoff_xla::Artifact;
    /// let primal = Artifact::from_bytes(&std::fs::read("f.jaxexport").unwrap())?;
    /// let vjp = primal.vjp()?;
    /// assert_eq!(vjp.inputs().len(), primal.inputs().len() + primal.outputs().len());
    /// assert_eq!(vjp.outputs().len(), primal.inputs().len());
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn vjp(&self) -> Result<&Artifact> {
        let reason = match &self.vjp {
            Some(Vjp::Read(v)) => return Ok(v),
            Some(Vjp::Refused(why)) => format!("its VJP is refused: {why}"),
            None => "the jax.export artifact was serialized without one: \
                     serialize it with `exported.serialize(vjp_order=1)`"
                .to_owned(),
        };
        Err(XlaError::NoVjp { program: self.function_name.clone(), reason })
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

    let float0 = |avals: &[fb::AbstractValue<'_>]| -> Vec<usize> {
        avals.iter().enumerate().filter(|(_, a)| a.dtype() == Some(FLOAT0)).map(|(i, _)| i).collect()
    };
    let (float0_inputs, float0_outputs) = (float0(&in_avals), float0(&out_avals));
    if let Some(i) = float0_inputs.iter().find(|i| kept_inputs.contains(i)) {
        return Err(unsupported(
            "a float0 input read by the module",
            format!(
                "input {i} of {function_name} is float0 (no data) but its module takes it \
                 (JAX's VJPs drop the cotangents of integer outputs)"
            ),
        ));
    }

    let vjp = match exp.vjp().map(read) {
        None => None,
        Some(Ok(vjp)) => {
            check_vjp(function_name, &platforms, &inputs, &outputs, &vjp)?;
            Some(Vjp::Read(Box::new(vjp)))
        }
        // The primal stays usable; `Artifact::vjp` says why its VJP is not.
        Some(Err(e @ XlaError::Unsupported { .. })) => Some(Vjp::Refused(e.to_string())),
        Some(Err(XlaError::Invalid { field, value, reason })) => {
            return Err(XlaError::Invalid {
                field: format!("{field} (in the VJP, Exported.vjp)"),
                value,
                reason,
            });
        }
        Some(Err(e)) => return Err(e),
    };

    Ok(Artifact {
        function_name: function_name.to_owned(),
        platforms,
        inputs,
        outputs,
        kept_inputs,
        module: module.to_vec(),
        calling_convention_version,
        float0_inputs,
        float0_outputs,
        vjp,
    })
}

/// Checks that a VJP follows JAX's calling convention (`_get_vjp_fun` in jax 0.11.2):
/// the same platforms; the primal inputs then one cotangent per primal output in; one
/// cotangent per primal input out; a cotangent has its primal's shape and dtype, or
/// `float0` (integer and boolean primals).
fn check_vjp(
    name: &str,
    platforms: &[String],
    inputs: &[ArraySpec],
    outputs: &[ArraySpec],
    vjp: &Artifact,
) -> Result<()> {
    let convention = "JAX's VJP is exported for the primal's platforms, takes the primal inputs then one \
                      cotangent per output, and returns one cotangent per input";
    let bad =
        |what: &str, value: String| invalid(&format!("vjp {what}"), value, format!("{name}: {convention}"));
    if vjp.platforms != platforms {
        return Err(bad("platforms", format!("{:?} (the primal's: {platforms:?})", vjp.platforms)));
    }
    let (n, m) = (inputs.len(), outputs.len());
    if vjp.inputs.len() != n + m || vjp.outputs.len() != n {
        return Err(bad(
            "arity",
            format!(
                "{} inputs and {} outputs (the primal has {n} inputs and {m} outputs)",
                vjp.inputs.len(),
                vjp.outputs.len()
            ),
        ));
    }
    let cotangent = |ct: &ArraySpec, float0: bool, primal: &ArraySpec| {
        ct.shape == primal.shape && (float0 || ct.dtype == primal.dtype)
    };
    for (i, (p, v)) in inputs.iter().zip(&vjp.inputs).enumerate() {
        if p != v {
            return Err(bad(&format!("input {i}"), format!("{v} (the primal input is {p})")));
        }
    }
    for (j, out) in outputs.iter().enumerate() {
        let ct = &vjp.inputs[n + j];
        if !cotangent(ct, vjp.float0_inputs.contains(&(n + j)), out) {
            return Err(bad(
                &format!("input {}", n + j),
                format!("{ct} (the cotangent of output {j}, {out})"),
            ));
        }
    }
    for (i, (p, ct)) in inputs.iter().zip(&vjp.outputs).enumerate() {
        if !cotangent(ct, vjp.float0_outputs.contains(&i), p) {
            return Err(bad(&format!("output {i}"), format!("{ct} (the cotangent of input {i}, {p})")));
        }
    }
    Ok(())
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
        // No data: the module holds an i1 array in its place (see `Artifact::float0_inputs`).
        _ if code == FLOAT0 => DataType::BOOL,
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
mod tests;
