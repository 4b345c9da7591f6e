//! The impls a person would write by hand, through a hygienic path to handoff.

use crate::ast::{Field, Input};
use crate::attr::Role;
use crate::valid;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::DeriveInput;
use syn::spanned::Spanned;

pub fn derive(input: &DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Vec::new();
    let parsed = Input::from_syn(input, &mut errors)?;
    let attrs_failed = !errors.is_empty();
    valid::validate(&parsed, attrs_failed, &mut errors);
    if let Some(mut first) = errors.first().cloned() {
        for e in errors.into_iter().skip(1) {
            first.combine(e);
        }
        return Err(first);
    }
    Ok(impls(&parsed))
}

fn impls(input: &Input<'_>) -> TokenStream {
    let krate = match &input.attrs.krate {
        Some(path) => quote!(#path),
        None => quote!(::handoff),
    };
    let storage = quote!(#krate::storage);
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
    // Bounds on the field types are needed for generic structs only; on a concrete
    // struct an unmet bound is reported at the use in the body, spanned on the field.
    let generic =
        input.generics.type_params().next().is_some() || input.generics.const_params().next().is_some();
    let bound = |f: &Field<'_>, tr: TokenStream| {
        let ty = f.ty;
        if generic { quote_spanned!(ty.span()=> #ty: #tr) } else { quote!() }
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
            Some(Role::Shape) => quote!(<#ty as #storage::Dims>::from_dims(&__received.shape, #name)?),
            Some(Role::Strides) => quote!(
                <#ty as #storage::StridesField>::from_strides(&__received.strides, __received.compact, #name)?
            ),
            Some(Role::ByteOffset) => quote!(<#ty as #storage::ByteOffsetField>::from_byte_offset(0, #name)?),
            Some(Role::Dtype) => quote_spanned!(ty.span()=> __received.dtype),
            Some(Role::Device) => quote_spanned!(ty.span()=> __received.device),
            Some(Role::Stream) => quote!(<#ty as #storage::StreamField>::from_stream(&__received.stream)),
            None => {
                im_preds.push(quote_spanned!(ty.span()=> for<'__dlpack> #ty: ::core::default::Default));
                quote!(::core::default::Default::default())
            }
        };
        inits.push(quote!(#m: #init));
    }
    let check_dtype = static_dtype
        .map(|d| quote!(#storage::expect_dtype(&handoff, #d, ::core::any::type_name::<Self>())?;));
    let check_compact = match strides {
        Some(_) => quote!(),
        None => quote!(#storage::expect_compact(&handoff, ::core::any::type_name::<Self>())?;),
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
        }

        #[automatically_derived]
        impl #impl_g #krate::Export for #ident #ty_g where #(#ex_preds,)* {
            fn describe(&self) -> #krate::Result<#krate::TensorDesc<'_>> {
                #storage::describe(
                    #data_ref,
                    #storage::Layout {
                        device: #krate::StreamOrdered::device(self),
                        dtype: #dtype,
                        shape: #shape_expr,
                        strides: #strides_expr,
                        byte_offset: #offset_expr,
                    },
                )
            }
        }

        #[automatically_derived]
        impl #impl_g #krate::Import for #ident #ty_g where #(#im_preds,)* {
            fn from_handoff(handoff: #krate::Handoff) -> #krate::Result<Self> {
                #check_dtype
                #check_compact
                let __received = #storage::Received::of(&handoff);
                let __data = <#data_ty as #storage::Adopt>::adopt(handoff)?;
                ::core::result::Result::Ok(Self { #(#inits,)* })
            }
        }
    }
}
