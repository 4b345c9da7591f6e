//! The impls a person would write by hand, through a hygienic path to handoff.

use crate::ast::{Field, Input};
use crate::attr::Role;
use crate::valid;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::DeriveInput;
use syn::spanned::Spanned;

/// The impls, or every error (combined) followed by placeholder impls of
/// `StreamOrdered` and `Export`, so that uses of the type do not pile more errors
/// onto the real ones (as thiserror does).
pub fn derive(input: &DeriveInput) -> TokenStream {
    let mut errors = Vec::new();
    let parsed = match Input::from_syn(input, &mut errors) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_compile_error(),
    };
    let attrs_failed = !errors.is_empty();
    valid::validate(&parsed, attrs_failed, &mut errors);
    match errors.into_iter().reduce(|mut first, e| {
        first.combine(e);
        first
    }) {
        None => impls(&parsed),
        Some(e) => {
            let mut out = e.into_compile_error();
            out.extend(fallback(&parsed));
            out
        }
    }
}

fn krate(input: &Input<'_>) -> TokenStream {
    match &input.attrs.krate {
        Some(path) => quote!(#path),
        None => quote!(::handoff),
    }
}

/// Impls that compile whatever the fields are, and are never run: the type already
/// failed to derive.
fn fallback(input: &Input<'_>) -> TokenStream {
    let krate = krate(input);
    let ident = input.ident;
    let (impl_g, ty_g, where_c) = input.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_g #krate::StreamOrdered for #ident #ty_g #where_c {
            fn device(&self) -> #krate::Device {
                ::core::unreachable!()
            }
            fn stream(&self) -> ::core::option::Option<#krate::Stream> {
                ::core::unreachable!()
            }
        }

        #[automatically_derived]
        impl #impl_g #krate::Export for #ident #ty_g #where_c {
            fn describe(&self) -> #krate::Result<#krate::TensorDesc<'_>> {
                ::core::unreachable!()
            }
        }
    }
}

/// Whether `ty` names one of the struct's type or const parameters (only such fields
/// need a bound: a concrete field's unmet bound is reported at its use, spanned).
fn mentions_param(ty: &syn::Type, generics: &syn::Generics) -> bool {
    let params: Vec<String> = generics
        .type_params()
        .map(|p| p.ident.to_string())
        .chain(generics.const_params().map(|p| p.ident.to_string()))
        .collect();
    fn walk(tokens: TokenStream, params: &[String]) -> bool {
        tokens.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => params.iter().any(|p| i == p),
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), params),
            _ => false,
        })
    }
    !params.is_empty() && walk(quote!(#ty), &params)
}

fn impls(input: &Input<'_>) -> TokenStream {
    let krate = krate(input);
    let storage = quote!(#krate::storage);
    let private = quote!(#krate::__private);
    let ident = input.ident;
    let (impl_g, ty_g, where_c) = input.generics.split_for_impl();
    let base: Vec<TokenStream> =
        where_c.map(|w| w.predicates.iter().map(|p| quote!(#p)).collect()).unwrap_or_default();

    // `valid` has checked that both exist.
    let (Some(data), Some(shape)) = (input.field(Role::Data), input.field(Role::Shape)) else {
        return quote!();
    };
    let (strides, offset) = (input.field(Role::Strides), input.field(Role::ByteOffset));
    let (dtype_f, device_f, stream_f) =
        (input.field(Role::Dtype), input.field(Role::Device), input.field(Role::Stream));

    let (data_m, data_ty) = (&data.member, data.ty);
    let data_ref = quote_spanned!(data_ty.span()=> &self.#data_m);
    // Bounds on the field types that mention a type parameter only; elsewhere an
    // unmet bound is reported at the use in the body, spanned on the field.
    let generic =
        input.generics.type_params().next().is_some() || input.generics.const_params().next().is_some();
    let bound = |f: &Field<'_>, tr: TokenStream| {
        let ty = f.ty;
        if mentions_param(ty, input.generics) { quote_spanned!(ty.span()=> #ty: #tr) } else { quote!() }
    };

    // StreamOrdered
    let mut so_preds = base.clone();
    so_preds.push(bound(data, quote!(#storage::Storage)));
    let device = match device_f {
        Some(f) => {
            let (m, ty) = (&f.member, f.ty);
            quote_spanned!(ty.span()=> { let device: #krate::Device = self.#m; device })
        }
        None => quote_spanned!(data_ty.span()=> #storage::Storage::device(&self.#data_m)),
    };
    let stream = match stream_f {
        Some(f) => {
            so_preds.push(bound(f, quote!(#storage::StreamField)));
            let (m, ty) = (&f.member, f.ty);
            quote_spanned!(ty.span()=> #storage::StreamField::to_stream(&self.#m))
        }
        None => quote!(::core::option::Option::None),
    };

    // Export
    let mut ex_preds = so_preds.clone();
    if generic {
        ex_preds.push(quote!(Self: ::core::marker::Send + 'static));
    }
    ex_preds.push(bound(shape, quote!(#storage::Dims)));
    let static_dtype = match (&input.attrs.dtype, dtype_f) {
        (Some((ty, _)), _) => Some(quote_spanned!(ty.span()=> <#ty as #krate::dtype::Element>::DTYPE)),
        (None, Some(_)) => None,
        (None, None) => {
            ex_preds.push(bound(data, quote!(#storage::Typed)));
            Some(quote_spanned!(data_ty.span()=>
                <<#data_ty as #storage::Typed>::Elem as #krate::dtype::Element>::DTYPE))
        }
    };
    let dtype = match dtype_f {
        Some(f) => {
            let (m, ty) = (&f.member, f.ty);
            quote_spanned!(ty.span()=> { let dtype: #krate::dtype::DataType = self.#m; dtype })
        }
        None => quote!(#static_dtype),
    };
    let (shape_m, shape_name, shape_ty) = (&shape.member, shape.name(), shape.ty);
    let shape_expr = quote_spanned!(shape_ty.span()=> #storage::Dims::to_dims(&self.#shape_m, #shape_name)?);
    let strides_expr = match strides {
        Some(f) => {
            ex_preds.push(bound(f, quote!(#storage::StridesField)));
            let (m, name, ty) = (&f.member, f.name(), f.ty);
            quote_spanned!(ty.span()=> #storage::StridesField::to_strides(&self.#m, #name)?)
        }
        None => quote!(::core::option::Option::None),
    };
    let offset_expr = match offset {
        Some(f) => {
            ex_preds.push(bound(f, quote!(#storage::ByteOffsetField)));
            let (m, name, ty) = (&f.member, f.name(), f.ty);
            quote_spanned!(ty.span()=> #storage::ByteOffsetField::to_byte_offset(&self.#m, #name)?)
        }
        None => quote!(0),
    };

    // Import: only usable when the storage can adopt and the other fields have a
    // default. The bounds are higher-ranked so that a storage that cannot adopt
    // leaves the impl unusable instead of failing to compile.
    let mut im_preds = ex_preds.clone();
    im_preds.push(quote_spanned!(data_ty.span()=> for<'__dlpack> #data_ty: #storage::Adopt));
    let mut inits = vec![quote!(#data_m: __data)];
    for f in &input.fields {
        let (m, ty, name) = (&f.member, f.ty, f.name());
        let init = match f.role.map(|(r, _)| r) {
            Some(Role::Data) => continue,
            Some(Role::Shape) => quote!(<#ty as #storage::Dims>::from_dims(&__desc.shape, #name)?),
            Some(Role::Strides) => quote!(
                <#ty as #storage::StridesField>::from_strides(
                    __desc.strides.as_deref().unwrap_or(&[]), __compact, #name)?
            ),
            Some(Role::ByteOffset) => quote!(<#ty as #storage::ByteOffsetField>::from_byte_offset(0, #name)?),
            Some(Role::Dtype) => quote_spanned!(ty.span()=> __desc.dtype),
            Some(Role::Device) => quote_spanned!(ty.span()=> __desc.device),
            Some(Role::Stream) => quote!(<#ty as #storage::StreamField>::from_stream(&__stream)),
            None => {
                im_preds.push(quote_spanned!(ty.span()=> for<'__dlpack> #ty: ::core::default::Default));
                quote!(::core::default::Default::default())
            }
        };
        inits.push(quote!(#m: #init));
    }
    let check_dtype = static_dtype
        .map(|d| quote!(#private::expect_dtype(&handoff, #d, ::core::any::type_name::<Self>())?;));
    let check_compact = match strides {
        Some(_) => quote!(),
        None => quote!(#private::expect_compact(&handoff, ::core::any::type_name::<Self>())?;),
    };

    let nonempty =
        |v: Vec<TokenStream>| -> Vec<TokenStream> { v.into_iter().filter(|t| !t.is_empty()).collect() };
    let (so_preds, ex_preds, im_preds) = (nonempty(so_preds), nonempty(ex_preds), nonempty(im_preds));
    quote! {
        #[automatically_derived]
        impl #impl_g #krate::StreamOrdered for #ident #ty_g where #(#so_preds,)* {
            fn device(&self) -> #krate::Device {
                #device
            }
            fn stream(&self) -> ::core::option::Option<#krate::Stream> {
                #stream
            }
            // The storage is freed when the value drops (a Vec by the host), not in
            // order on a stream: every consumer's release waits for its queued work.
            fn release_stream(&self) -> ::core::option::Option<#krate::Stream> {
                ::core::option::Option::None
            }
        }

        #[automatically_derived]
        impl #impl_g #krate::Export for #ident #ty_g where #(#ex_preds,)* {
            fn describe(&self) -> #krate::Result<#krate::TensorDesc<'_>> {
                #private::describe(
                    #data_ref,
                    #krate::TensorDesc {
                        data: ::core::ptr::null_mut(),
                        device: #krate::StreamOrdered::device(self),
                        dtype: #dtype,
                        shape: #shape_expr,
                        strides: #strides_expr,
                        byte_offset: #offset_expr,
                        read_only: false,
                        is_copied: false,
                    },
                )
            }
        }

        #[automatically_derived]
        impl #impl_g #krate::Import for #ident #ty_g where #(#im_preds,)* {
            fn from_handoff(handoff: #krate::Handoff) -> #krate::Result<Self> {
                #check_dtype
                #check_compact
                let (__desc, __compact, __stream) = #private::received(&handoff);
                let __data = <#data_ty as #storage::Adopt>::adopt(handoff)?;
                ::core::result::Result::Ok(Self { #(#inits,)* })
            }
        }
    }
}
