//! Parsing of the attribute's options: `#[idempotent(require_key, lease = "30s", …)]`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitBool, LitInt, LitStr, Token, Type};

mod kw {
    syn::custom_keyword!(require_key);
    syn::custom_keyword!(header_name);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(wait_in_flight);
    syn::custom_keyword!(retention);
    syn::custom_keyword!(response_mode);
    syn::custom_keyword!(namespace);
    syn::custom_keyword!(max_record_body);
    syn::custom_keyword!(max_request_body);
    syn::custom_keyword!(principal);
    syn::custom_keyword!(state);
    syn::custom_keyword!(mark_first_runs);
}

/// Every option, for the "unknown option" message.
const KNOWN: &str = "`require_key`, `header_name`, `lease`, `retention`, `response_mode`, `namespace`, \
                     `max_record_body`, `max_request_body`, `principal`, `wait_in_flight`, `mark_first_runs`, `state`";

const DURATION_FORM: &str = "a whole number followed by a unit (`ms`, `s`, `m`, `h` or `d`), \
                             e.g. \"1500ms\", \"30s\", \"10m\", \"24h\"";

/// What a record keeps (`response_mode = "full" | "status_and_headers"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Response {
    Full,
    StatusAndHeaders,
}

/// Whether a principal is required (`principal = "required" | "optional"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Principal {
    Required,
    Optional,
}

/// The options given in the attribute; `None` keeps the shared configuration's setting.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) require_key: Option<bool>,
    /// Lower-cased and checked to be a valid header name.
    pub(crate) header: Option<LitStr>,
    pub(crate) lease_ms: Option<u64>,
    pub(crate) wait_ms: Option<u64>,
    pub(crate) retention_ms: Option<u64>,
    pub(crate) response: Option<Response>,
    pub(crate) namespace: Option<LitStr>,
    pub(crate) max_record_body: Option<u64>,
    pub(crate) max_request_body: Option<u64>,
    pub(crate) principal: Option<Principal>,
    pub(crate) mark_first_runs: Option<bool>,
    pub(crate) state: Option<Type>,
}

/// Sets `slot` once; a second occurrence is an error at its keyword.
fn once<T>(slot: &mut Option<T>, value: T, name: &str, span: Span) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("the option `{name}` is given more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// Parses `= <value>` after an option's keyword.
fn value<T: Parse>(input: ParseStream<'_>) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    input.parse()
}

impl Parse for Options {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut o = Self::default();
        while !input.is_empty() {
            if input.peek(kw::require_key) {
                let k: kw::require_key = input.parse()?;
                let v = if input.peek(Token![=]) {
                    value::<LitBool>(input)?.value
                } else {
                    true
                };
                once(&mut o.require_key, v, "require_key", k.span)?;
            } else if input.peek(kw::header_name) {
                let k: kw::header_name = input.parse()?;
                let v = header_name(&value(input)?)?;
                once(&mut o.header, v, "header_name", k.span)?;
            } else if input.peek(kw::lease) {
                let k: kw::lease = input.parse()?;
                let v = duration_ms(&value(input)?)?;
                once(&mut o.lease_ms, v, "lease", k.span)?;
            } else if input.peek(kw::wait_in_flight) {
                let k: kw::wait_in_flight = input.parse()?;
                let v = duration_ms(&value(input)?)?;
                once(&mut o.wait_ms, v, "wait_in_flight", k.span)?;
            } else if input.peek(kw::retention) {
                let k: kw::retention = input.parse()?;
                let v = duration_ms(&value(input)?)?;
                once(&mut o.retention_ms, v, "retention", k.span)?;
            } else if input.peek(kw::response_mode) {
                let k: kw::response_mode = input.parse()?;
                let lit: LitStr = value(input)?;
                let v = match lit.value().as_str() {
                    "full" => Response::Full,
                    "status_and_headers" => Response::StatusAndHeaders,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown response mode `{other}`: expected \"full\" (status, headers and body) or \"status_and_headers\" (no body)"
                            ),
                        ));
                    }
                };
                once(&mut o.response, v, "response_mode", k.span)?;
            } else if input.peek(kw::namespace) {
                let k: kw::namespace = input.parse()?;
                let lit: LitStr = value(input)?;
                if lit.value().is_empty() {
                    return Err(syn::Error::new(
                        lit.span(),
                        "the namespace must not be empty",
                    ));
                }
                once(&mut o.namespace, lit, "namespace", k.span)?;
            } else if input.peek(kw::max_record_body) {
                let k: kw::max_record_body = input.parse()?;
                let v = byte_count(&value(input)?)?;
                once(&mut o.max_record_body, v, "max_record_body", k.span)?;
            } else if input.peek(kw::max_request_body) {
                let k: kw::max_request_body = input.parse()?;
                let v = byte_count(&value(input)?)?;
                once(&mut o.max_request_body, v, "max_request_body", k.span)?;
            } else if input.peek(kw::principal) {
                let k: kw::principal = input.parse()?;
                let lit: LitStr = value(input)?;
                let v = match lit.value().as_str() {
                    "required" => Principal::Required,
                    "optional" => Principal::Optional,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown principal mode `{other}`: expected \"required\" (401 without a principal) or \"optional\" (one shared anonymous scope)"
                            ),
                        ));
                    }
                };
                once(&mut o.principal, v, "principal", k.span)?;
            } else if input.peek(kw::mark_first_runs) {
                let k: kw::mark_first_runs = input.parse()?;
                let v = if input.peek(Token![=]) {
                    value::<LitBool>(input)?.value
                } else {
                    true
                };
                once(&mut o.mark_first_runs, v, "mark_first_runs", k.span)?;
            } else if input.peek(kw::state) {
                let k: kw::state = input.parse()?;
                let v: Type = value(input)?;
                once(&mut o.state, v, "state", k.span)?;
            } else if input.peek(Ident::peek_any) {
                let unknown = Ident::parse_any(input)?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!("unknown option `{unknown}`; the options are {KNOWN}"),
                ));
            } else {
                return Err(input.error(format!("expected an option, one of {KNOWN}")));
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(o)
    }
}

/// `"30s"` → 30 000. Several parts add up (`"1h30m"`); zero is refused (a lease or retention
/// of nothing is a mistake).
fn duration_ms(lit: &LitStr) -> syn::Result<u64> {
    let text = lit.value();
    let bad = |why: &str| {
        syn::Error::new(
            lit.span(),
            format!("invalid duration \"{text}\"{why}: expected {DURATION_FORM}"),
        )
    };
    let mut rest = text.as_str();
    if rest.is_empty() {
        return Err(bad(""));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad(""));
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad(" (too large)"))?;
        rest = &rest[digits..];
        let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor: u64 = match &rest[..unit] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad("")),
        };
        rest = &rest[unit..];
        total = number
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| bad(" (too large)"))?;
    }
    if total == 0 {
        return Err(syn::Error::new(
            lit.span(),
            format!("the duration \"{text}\" is zero: give a positive duration, e.g. \"30s\""),
        ));
    }
    Ok(total)
}

/// A byte limit: a non-negative integer literal without suffix.
fn byte_count(lit: &LitInt) -> syn::Result<u64> {
    if !lit.suffix().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "expected a number of bytes without a type suffix, e.g. 65536 or 65_536",
        ));
    }
    lit.base10_parse()
}

/// Checks an HTTP header name (RFC 9110 token) and lower-cases it, so the generated code can
/// rely on it being valid.
fn header_name(lit: &LitStr) -> syn::Result<LitStr> {
    let name = lit.value();
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(tchar) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid header name \"{name}\": expected letters, digits and `-` (an HTTP token), e.g. \"x-idempotency-key\""
            ),
        ));
    }
    Ok(LitStr::new(&name.to_ascii_lowercase(), lit.span()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> Result<u64, String> {
        duration_ms(&LitStr::new(s, Span::call_site())).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_durations_with_every_unit() {
        assert_eq!(ms("1500ms"), Ok(1_500));
        assert_eq!(ms("30s"), Ok(30_000));
        assert_eq!(ms("10m"), Ok(600_000));
        assert_eq!(ms("24h"), Ok(86_400_000));
        assert_eq!(ms("2d"), Ok(172_800_000));
        assert_eq!(ms("1h30m"), Ok(5_400_000));
    }

    #[test]
    fn refuses_bad_durations() {
        for bad in [
            "",
            "30",
            "s",
            "30 s",
            "30sec",
            "1.5s",
            "-1s",
            "0s",
            "99999999999999999999s",
        ] {
            assert!(ms(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn parses_every_option() {
        let o: Options = syn::parse_str(
            r#"require_key = false, header_name = "X-Key", lease = "30s", retention = "1h", response_mode = "status_and_headers",
               namespace = "payments", max_record_body = 65_536, max_request_body = 1024,
               principal = "optional", state = crate::App"#,
        )
        .expect("all options parse");
        assert_eq!(o.require_key, Some(false));
        assert_eq!(o.header.map(|h| h.value()).as_deref(), Some("x-key"));
        assert_eq!(o.lease_ms, Some(30_000));
        assert_eq!(o.retention_ms, Some(3_600_000));
        assert_eq!(o.response, Some(Response::StatusAndHeaders));
        assert_eq!(o.max_record_body, Some(65_536));
        assert_eq!(o.max_request_body, Some(1024));
        assert_eq!(o.principal, Some(Principal::Optional));
        assert!(o.state.is_some());
    }

    #[test]
    fn refuses_repeated_and_unknown_options() {
        let repeated = syn::parse_str::<Options>(r#"retention = "1h", retention = "2h""#);
        assert!(repeated.is_err_and(|e| e.to_string().contains("more than once")));
        let unknown = syn::parse_str::<Options>("retries = 3");
        assert!(unknown.is_err_and(|e| e.to_string().contains("unknown option `retries`")));
    }
}
