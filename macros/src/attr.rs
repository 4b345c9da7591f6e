//! The `#[dlpack(...)]` attributes of the struct and of its fields.

use proc_macro2::Span;
use syn::{Attribute, LitStr, Path, Token, Type};

/// What a field is to the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Data,
    Shape,
    Strides,
    ByteOffset,
    Dtype,
    Device,
    Stream,
}

impl Role {
    pub const ALL: [Role; 7] =
        [Role::Data, Role::Shape, Role::Strides, Role::ByteOffset, Role::Dtype, Role::Device, Role::Stream];

    pub fn key(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Shape => "shape",
            Role::Strides => "strides",
            Role::ByteOffset => "byte_offset",
            Role::Dtype => "dtype",
            Role::Device => "device",
            Role::Stream => "stream",
        }
    }

    fn from_path(path: &Path) -> Option<Role> {
        Role::ALL.into_iter().find(|r| path.is_ident(r.key()))
    }
}

const FIELD_KEYS: &str = "`data`, `shape`, `strides`, `byte_offset`, `dtype`, `device` or `stream`";

/// `#[dlpack(crate = "...", dtype = T)]` on the struct.
#[derive(Default)]
pub struct StructAttrs {
    pub krate: Option<Path>,
    pub dtype: Option<(Type, Span)>,
}

/// Parses the struct's `#[dlpack]` attributes.
pub fn struct_attrs(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> StructAttrs {
    let mut out = StructAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("dlpack")) {
        let parsed = attr.parse_nested_meta(|meta| {
            let span = meta.path.segments.first().map_or_else(Span::call_site, |s| s.ident.span());
            if meta.path.is_ident("crate") {
                let lit: LitStr = meta.value()?.parse()?;
                let path: Path = lit.parse().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        "`crate` takes a path in a string, such as `crate = \"::handoff\"`",
                    )
                })?;
                if out.krate.replace(path).is_some() {
                    errors.push(syn::Error::new(span, "`crate` given twice: keep one `crate = \"...\"`"));
                }
                Ok(())
            } else if meta.path.is_ident("dtype") {
                if !meta.input.peek(Token![=]) {
                    return Err(meta.error(
                        "on the struct, `dtype` takes the element type: write `#[dlpack(dtype = f32)]`, \
                         or put `#[dlpack(dtype)]` on a `DataType` field",
                    ));
                }
                let ty: Type = meta.value()?.parse()?;
                if out.dtype.replace((ty, span)).is_some() {
                    errors.push(syn::Error::new(
                        span,
                        "dtype given twice on the struct: keep one `dtype = ...`",
                    ));
                }
                Ok(())
            } else if let Some(role) = Role::from_path(&meta.path) {
                Err(meta.error(format!(
                    "`{}` marks a field, not the struct: put `#[dlpack({})]` on the field that holds it",
                    role.key(),
                    role.key()
                )))
            } else {
                Err(meta.error(format!(
                    "unknown key `{}` in `#[dlpack(...)]` on a struct: it takes `dtype = <element type>` \
                     and `crate = \"<path to handoff>\"`",
                    path_name(&meta.path)
                )))
            }
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    out
}

/// Parses a field's `#[dlpack]` attributes: its role, with the span of the key.
pub fn field_role(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> Option<(Role, Span)> {
    let mut role: Option<(Role, Span)> = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("dlpack")) {
        let parsed = attr.parse_nested_meta(|meta| {
            let span = meta.path.segments.first().map_or_else(Span::call_site, |s| s.ident.span());
            let Some(r) = Role::from_path(&meta.path) else {
                let hint = if meta.path.is_ident("crate") {
                    " (`crate = \"...\"` goes on the struct)".to_string()
                } else {
                    String::new()
                };
                return Err(meta.error(format!(
                    "unknown key `{}` in `#[dlpack(...)]` on a field: a field is one of {FIELD_KEYS}{hint}",
                    path_name(&meta.path)
                )));
            };
            if meta.input.peek(Token![=]) {
                let hint = if r == Role::Dtype {
                    "; to fix the element type write `#[dlpack(dtype = f32)]` on the struct"
                } else {
                    ""
                };
                return Err(meta.error(format!(
                    "`{}` takes no value on a field: write `#[dlpack({})]`{hint}",
                    r.key(),
                    r.key()
                )));
            }
            match role {
                Some((prev, _)) if prev == r => errors.push(syn::Error::new(
                    span,
                    format!("`{}` given twice on this field: write it once", r.key()),
                )),
                Some((prev, _)) => errors.push(syn::Error::new(
                    span,
                    format!(
                        "this field is already marked `{}`: a field has one role; put `{}` on its own field",
                        prev.key(),
                        r.key()
                    ),
                )),
                None => role = Some((r, span)),
            }
            Ok(())
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    role
}

fn path_name(path: &Path) -> String {
    path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::")
}
