//! `#[derive(DlpackExchange)]` for handoff: your own tensor types get
//! `StreamOrdered`, `Export` and (when their storage can adopt foreign memory)
//! `Import`, through a hygienic `::handoff` path (`#[dlpack(crate = "...")]` to
//! override). The semantics live in `handoff::storage`; the generated code calls
//! `handoff::__private` (hidden API). See `handoff`'s docs.
//!
//! Parse (`ast`, `attr`) -> validate (`valid`, every error spanned) -> expand.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Derives `StreamOrdered`, `Export` and `Import` for a tensor struct.
/// See `handoff::DlpackExchange` for the attributes.
#[proc_macro_derive(DlpackExchange, attributes(dlpack))]
pub fn derive_dlpack_exchange(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
