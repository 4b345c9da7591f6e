//! Every misuse of the derive, as an error spanned on the offending field or
//! attribute, saying what to write instead.

use crate::ast::Input;
use crate::attr::Role;

/// Reports duplicates, missing fields (unless an attribute already failed to parse,
/// which may be the missing one misspelt) and a dtype given twice.
pub fn validate(input: &Input<'_>, attrs_failed: bool, errors: &mut Vec<syn::Error>) {
    for role in Role::ALL {
        let mut marked = input.fields.iter().filter(|f| f.role.map(|(r, _)| r) == Some(role));
        if let Some(first) = marked.next() {
            for again in marked {
                let span = again.role.map_or(again.span, |(_, s)| s);
                errors.push(syn::Error::new(
                    span,
                    format!(
                        "a second `#[dlpack({key})]` field: `{}` is already the {key}; keep one `#[dlpack({key})]`",
                        first.name(),
                        key = role.key()
                    ),
                ));
            }
        }
    }
    if input.field(Role::Data).is_none() && !attrs_failed {
        errors.push(syn::Error::new(
            input.ident.span(),
            "missing a `#[dlpack(data)]` field: mark the field that holds the memory (a `Vec<T>`, \
             `Box<[T]>`, `Arc<[T]>` or `handoff::storage::Elements<T>`) with `#[dlpack(data)]`",
        ));
    }
    if input.field(Role::Shape).is_none() && !attrs_failed {
        errors.push(syn::Error::new(
            input.ident.span(),
            "missing a `#[dlpack(shape)]` field: mark the field that holds the dimensions \
             (such as `shape: Vec<i64>`) with `#[dlpack(shape)]`",
        ));
    }
    if let (Some(field), Some((_, struct_span))) = (input.field(Role::Dtype), &input.attrs.dtype) {
        let span = field.role.map_or(field.span, |(_, s)| s);
        let mut e = syn::Error::new(
            span,
            format!(
                "dtype given twice: by `#[dlpack(dtype = ...)]` on the struct and by the field `{}`; \
                 keep the struct's `dtype = ...` for a fixed element type, or the field for one chosen at run time",
                field.name()
            ),
        );
        e.combine(syn::Error::new(*struct_span, "the struct's `dtype = ...` is here"));
        errors.push(e);
    }
}
