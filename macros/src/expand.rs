//! The expansion: the handler becomes a wrapper handler that runs the original (kept as an
//! inner function) through the idempotency layer's service.

use crate::options::{Options, Principal, Response};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, ItemFn, LitInt, PathArguments, ReturnType, Signature, Type};

pub(crate) fn expand(options: Options, item: ItemFn) -> syn::Result<TokenStream> {
    check_signature(&item)?;
    let state = match options.state.clone() {
        Some(ty) => Some(ty),
        None => state_type(&item)?,
    };

    let private = quote!(::tower_idempotency::__private);
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let name = &sig.ident;
    // The original function keeps its name inside the wrapper (where it shadows the wrapper),
    // so a recursive call reaches the original and compiler messages name the user's function.
    let inner_sig = &sig;
    let route_options = route_options(&options, &private);

    let (state_param, state_value, state_ty) = match &state {
        Some(ty) => (
            quote!(#private::State(__idempotent_state): #private::State<#ty>,),
            quote!(__idempotent_state),
            quote!(#ty),
        ),
        None => (TokenStream::new(), quote!(()), quote!(())),
    };
    let extract = extract(&sig, &state_ty, &private);
    let args: Vec<_> = (0..sig.inputs.len())
        .map(|i| quote::format_ident!("__idempotent_arg{}", i))
        .collect();
    // At the return type (or the name), so "not a response" errors point at the user's code.
    let output_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => name.span(),
    };
    let call = quote_spanned! {output_span=>
        |(#(#args,)*)| async move {
            #private::IntoResponse::into_response(#name(#(#args),*).await)
        }
    };
    // At the function's name, so errors about the handler as a whole point at it.
    let run = quote_spanned! {name.span()=>
        ::tower_idempotency::__private::run(
            &__IDEMPOTENT_ROUTE,
            #state_value,
            __idempotent_request,
            #extract,
            #call,
        ).await
    };

    Ok(quote! {
        #(#attrs)*
        #vis async fn #name(
            #state_param
            __idempotent_request: #private::Request,
        ) -> #private::Response {
            #inner_sig #block

            static __IDEMPOTENT_ROUTE: #private::RouteOptions = #route_options;
            #run
        }
    })
}

/// The closure that runs the handler's extractors, as axum does for a handler: every argument
/// but the last from the request parts, the last from the whole request; the first rejection
/// is the answer. Each extraction is spanned at its argument's type, so an argument that is no
/// extractor is reported there.
fn extract(sig: &Signature, state_ty: &TokenStream, private: &TokenStream) -> TokenStream {
    let types: Vec<&Type> = sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(pat) => Some(&*pat.ty),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let mut steps = Vec::with_capacity(types.len());
    let mut args = Vec::with_capacity(types.len());
    for (i, ty) in types.iter().enumerate() {
        let arg = quote::format_ident!("__idempotent_arg{}", i);
        let last = i + 1 == types.len();
        let extraction = if last {
            quote_spanned! {ty.span()=>
                <#ty as #private::FromRequest<#state_ty, _>>::from_request(
                    #private::Request::from_parts(__idempotent_parts, __idempotent_body),
                    &__idempotent_state,
                ).await
            }
        } else {
            quote_spanned! {ty.span()=>
                <#ty as #private::FromRequestParts<#state_ty>>::from_request_parts(
                    &mut __idempotent_parts,
                    &__idempotent_state,
                ).await
            }
        };
        steps.push(quote! {
            let #arg = match #extraction {
                #private::Ok(value) => value,
                #private::Err(rejection) => {
                    return #private::Err(#private::IntoResponse::into_response(rejection));
                }
            };
        });
        args.push(arg);
    }
    let split = if types.is_empty() {
        quote!(let _ = (__idempotent_req, &__idempotent_state);)
    } else {
        quote! {
            #[allow(unused_mut)]
            let (mut __idempotent_parts, __idempotent_body) = __idempotent_req.into_parts();
        }
    };
    quote! {
        |__idempotent_req: #private::Request, __idempotent_state: #state_ty| async move {
            #split
            #(#steps)*
            #private::Ok((#(#args,)*))
        }
    }
}

/// An axum handler is a free `async fn` without generics.
fn check_signature(item: &ItemFn) -> syn::Result<()> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "`#[idempotent]` goes on an `async fn` (an axum handler); add `async`",
        ));
    }
    if let Some(receiver) = sig.receiver() {
        return Err(syn::Error::new_spanned(
            receiver,
            "`#[idempotent]` cannot be used on a method that takes `self`: a handler is a free `async fn` (or an associated fn without `self`)",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "`#[idempotent]` does not support generic handlers; use concrete types",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        return Err(syn::Error::new(
            variadic.span(),
            "`#[idempotent]` does not support variadic functions",
        ));
    }
    Ok(())
}

/// The router state the handler extracts with `State<T>`, if any. Several different `State`
/// types need the `state = Type` option (the state they are all taken from).
fn state_type(item: &ItemFn) -> syn::Result<Option<Type>> {
    let mut found: Option<Type> = None;
    for arg in &item.sig.inputs {
        let FnArg::Typed(pat) = arg else { continue };
        let Some(ty) = state_argument(&pat.ty) else {
            continue;
        };
        match &found {
            None => found = Some(ty.clone()),
            Some(first) if same_type(first, ty) => {}
            Some(_) => {
                return Err(syn::Error::new_spanned(
                    &pat.ty,
                    "this handler extracts several `State` types: say which router state they come from with `#[idempotent(state = AppState)]`",
                ));
            }
        }
    }
    Ok(found)
}

fn same_type(a: &Type, b: &Type) -> bool {
    a.to_token_stream().to_string() == b.to_token_stream().to_string()
}

/// `T` in `State<T>` (or `axum::extract::State<T>`).
fn state_argument(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Group(g) => state_argument(&g.elem),
        Type::Paren(p) => state_argument(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            if last.ident != "State" {
                return None;
            }
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            let mut types = args.args.iter();
            match (types.next(), types.next()) {
                (Some(GenericArgument::Type(t)), None) => Some(t),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `RouteOptions::new().lease(…)…`, evaluated in a `static` initialiser.
fn route_options(o: &Options, private: &TokenStream) -> TokenStream {
    let mut chain = quote!(#private::RouteOptions::new());
    if let Some(require) = o.require_key {
        chain = quote!(#chain.require_key(#require));
    }
    if let Some(header) = &o.header {
        chain = quote!(#chain.header_name(#header));
    }
    if let Some(ms) = o.lease_ms {
        chain = quote!(#chain.lease(#private::Duration::from_millis(#ms)));
    }
    if let Some(ms) = o.retention_ms {
        chain = quote!(#chain.retention(#private::Duration::from_millis(#ms)));
    }
    if let Some(ms) = o.wait_ms {
        chain = quote!(#chain.wait_in_flight(#private::Duration::from_millis(#ms)));
    }
    if let Some(mode) = o.response {
        let variant = match mode {
            Response::Full => quote!(Full),
            Response::StatusAndHeaders => quote!(StatusAndHeaders),
        };
        chain = quote!(#chain.response_mode(#private::ResponseMode::#variant));
    }
    if let Some(ns) = &o.namespace {
        chain = quote!(#chain.namespace(#ns));
    }
    if let Some(bytes) = o.max_record_body {
        let bytes = usize_literal(bytes);
        chain = quote!(#chain.max_record_body(#bytes));
    }
    if let Some(bytes) = o.max_request_body {
        let bytes = usize_literal(bytes);
        chain = quote!(#chain.max_request_body(#bytes));
    }
    if let Some(mode) = o.principal {
        let variant = match mode {
            Principal::Required => quote!(Required),
            Principal::Optional => quote!(Optional),
        };
        chain = quote!(#chain.principal(#private::PrincipalMode::#variant));
    }
    if let Some(on) = o.mark_first_runs {
        chain = quote!(#chain.mark_first_runs(#on));
    }
    chain
}

/// The target's `usize` checks the range (a 32-bit target refuses a limit over 4 GiB).
fn usize_literal(n: u64) -> LitInt {
    LitInt::new(&format!("{n}usize"), Span::call_site())
}
