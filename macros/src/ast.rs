//! The derive's input, parsed into a model: the struct, its attributes, its fields
//! and their roles.

use crate::attr::{self, Role, StructAttrs};
use proc_macro2::Span;
use syn::{Data, DeriveInput, Fields, Generics, Ident, Member, Type};

pub struct Input<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub attrs: StructAttrs,
    pub fields: Vec<Field<'a>>,
}

pub struct Field<'a> {
    pub member: Member,
    pub ty: &'a Type,
    pub role: Option<(Role, Span)>,
    pub span: Span,
}

impl Field<'_> {
    /// The field's name, as errors name it.
    pub fn name(&self) -> String {
        match &self.member {
            Member::Named(i) => i.to_string(),
            Member::Unnamed(i) => i.index.to_string(),
        }
    }
}

impl<'a> Input<'a> {
    /// Parses a struct; an enum or union is an error spanned on its keyword.
    pub fn from_syn(input: &'a DeriveInput, errors: &mut Vec<syn::Error>) -> syn::Result<Input<'a>> {
        let fields = match &input.data {
            Data::Struct(s) => &s.fields,
            Data::Enum(e) => {
                return Err(syn::Error::new(
                    e.enum_token.span,
                    "DlpackExchange is derived for structs only: a tensor is one struct with a \
                     `#[dlpack(data)]` field; for an enum, implement `handoff::Export` by hand, \
                     matching on its variants",
                ));
            }
            Data::Union(u) => {
                return Err(syn::Error::new(
                    u.union_token.span,
                    "DlpackExchange is derived for structs only: write a struct with a \
                     `#[dlpack(data)]` field instead of a union",
                ));
            }
        };
        let attrs = attr::struct_attrs(&input.attrs, errors);
        let fields = match fields {
            Fields::Named(f) => f.named.iter().collect::<Vec<_>>(),
            Fields::Unnamed(f) => f.unnamed.iter().collect(),
            Fields::Unit => Vec::new(),
        };
        let fields = fields
            .into_iter()
            .enumerate()
            .map(|(i, f)| Field {
                member: match &f.ident {
                    Some(id) => Member::Named(id.clone()),
                    None => {
                        Member::Unnamed(syn::Index { index: i as u32, span: syn::spanned::Spanned::span(f) })
                    }
                },
                ty: &f.ty,
                role: attr::field_role(&f.attrs, errors),
                span: syn::spanned::Spanned::span(f),
            })
            .collect();
        Ok(Input { ident: &input.ident, generics: &input.generics, attrs, fields })
    }

    /// The field with `role`, if any (the first; `valid` reports others).
    pub fn field(&self, role: Role) -> Option<&Field<'a>> {
        self.fields.iter().find(|f| f.role.map(|(r, _)| r) == Some(role))
    }
}
