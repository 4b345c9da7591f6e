//! Named values: the options a client is created with ([`ClientOptions`],
//! [`OptionValue`]) and the attributes a plugin reports ([`Value`]), and their
//! conversion to and from PJRT's `PJRT_NamedValue`.

use crate::error::{Result, XlaError};
use crate::result::string;
use crate::sys::{self, Struct};
use std::ptr::null_mut;

/// Options for [`Client::new`](crate::Client::new). On GPU plugins `preallocate`
/// defaults to `false`, so that XLA shares the GPU with PyTorch instead of taking most
/// of its memory.
///
/// ```
/// let opts = handoff_xla::ClientOptions::default().memory_fraction(0.25);
/// assert_eq!(opts.memory_fraction, Some(0.25));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientOptions {
    /// `preallocate` (GPU). `None`: `false` on GPU plugins, unset on others.
    pub preallocate: Option<bool>,
    /// `memory_fraction` (GPU): the share of device memory XLA's allocator may use.
    pub memory_fraction: Option<f32>,
    /// Further platform-specific options, passed as they are.
    pub extra: Vec<(&'static str, OptionValue)>,
}

impl ClientOptions {
    /// Sets `preallocate`.
    pub fn preallocate(mut self, on: bool) -> Self {
        self.preallocate = Some(on);
        self
    }

    /// Sets `memory_fraction`.
    pub fn memory_fraction(mut self, fraction: f32) -> Self {
        self.memory_fraction = Some(fraction);
        self
    }

    /// Adds a platform-specific option.
    pub fn option(mut self, name: &'static str, value: OptionValue) -> Self {
        self.extra.push((name, value));
        self
    }

    /// The options to pass to a client of a GPU (`gpu`) or other plugin.
    pub(crate) fn resolve(&self, gpu: bool) -> Result<Vec<(&'static str, OptionValue)>> {
        let mut out = Vec::new();
        match (self.preallocate, gpu) {
            (Some(p), _) => out.push(("preallocate", OptionValue::Bool(p))),
            (None, true) => out.push(("preallocate", OptionValue::Bool(false))),
            (None, false) => {}
        }
        if let Some(f) = self.memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(XlaError::invalid("ClientOptions.memory_fraction", f, "it must be in (0, 1]"));
            }
            out.push(("memory_fraction", OptionValue::Float(f)));
        }
        out.extend(self.extra.iter().cloned());
        Ok(out)
    }
}

/// A client-creation option value.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// An integer.
    Int64(i64),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
}

/// One plugin attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    String(String),
    /// An integer.
    Int64(i64),
    /// A list of integers.
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// A named value to pass in; it points into `name` and `value`, which must outlive
/// the call it is passed to.
pub(crate) fn named_value(name: &'static str, value: &OptionValue) -> sys::PJRT_NamedValue {
    let (type_, v, size) = match value {
        OptionValue::Int64(i) => (sys::NAMED_VALUE_INT64, sys::PJRT_NamedValue_Value { int64_value: *i }, 1),
        OptionValue::Float(f) => (sys::NAMED_VALUE_FLOAT, sys::PJRT_NamedValue_Value { float_value: *f }, 1),
        OptionValue::Bool(b) => (sys::NAMED_VALUE_BOOL, sys::PJRT_NamedValue_Value { bool_value: *b }, 1),
        OptionValue::String(s) => (
            sys::NAMED_VALUE_STRING,
            sys::PJRT_NamedValue_Value { string_value: s.as_ptr() as *const _ },
            s.len(),
        ),
    };
    sys::PJRT_NamedValue {
        struct_size: sys::PJRT_NamedValue::SIZE,
        extension_start: null_mut(),
        name: name.as_ptr() as *const _,
        name_size: name.len(),
        type_,
        value: v,
        value_size: size,
    }
}

/// Copies out named values the plugin returned.
///
/// # Safety
/// Each value's pointers (its name, and its string or list) must be valid for the
/// sizes it gives.
pub(crate) unsafe fn named_values(values: &[sys::PJRT_NamedValue]) -> Vec<(String, Value)> {
    values
        .iter()
        .map(|v| {
            // SAFETY: each value's union member is the one its type names; its
            // pointers are valid (forwarded from the caller).
            unsafe {
                let name = string(v.name, v.name_size);
                let value = match v.type_ {
                    sys::NAMED_VALUE_STRING => Value::String(string(v.value.string_value, v.value_size)),
                    sys::NAMED_VALUE_INT64 => Value::Int64(v.value.int64_value),
                    sys::NAMED_VALUE_INT64_LIST if !v.value.int64_array_value.is_null() => Value::Int64List(
                        std::slice::from_raw_parts(v.value.int64_array_value, v.value_size).to_vec(),
                    ),
                    sys::NAMED_VALUE_INT64_LIST => Value::Int64List(Vec::new()),
                    sys::NAMED_VALUE_FLOAT => Value::Float(v.value.float_value),
                    _ => Value::Bool(v.value.bool_value),
                };
                (name, value)
            }
        })
        .collect()
}
