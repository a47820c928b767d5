//! The one error for a refused setting, shared by every builder.

use std::fmt;

/// A setting refused when a layer, store or engine was built.
///
/// Every builder in the crate refuses a setting that can never work with this one type: its
/// [`kind`](Self::kind) says what was refused, its message says why.
///
/// ```
/// use tower_idempotency::{ConfigErrorKind, MemoryStore};
///
/// let err = MemoryStore::builder().max_entries(0).build().unwrap_err();
/// assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    detail: String,
}

/// What a [`ConfigError`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A number outside the range the setting accepts (zero entries, a cap above the total).
    OutOfRange,
    /// A name the setting does not accept: an empty namespace or prefix, a table name that is
    /// not a plain identifier, a JSON pointer that does not parse.
    InvalidName,
    /// A header on the fixed deny list offered for the allow list.
    DeniedHeader,
    /// A metric label whose key the crate sets itself (`door`, `outcome`, `result`).
    ReservedLabel,
    /// A secret shorter than 32 bytes.
    SecretTooShort,
}

impl ConfigErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.setting_out_of_range`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::OutOfRange => "idempotency.setting_out_of_range",
            Self::InvalidName => "idempotency.name_invalid",
            Self::DeniedHeader => "idempotency.header_denied",
            Self::ReservedLabel => "idempotency.label_reserved",
            Self::SecretTooShort => "idempotency.secret_too_short",
        }
    }
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// What was refused.
    #[must_use]
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.setting_out_of_range`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "setting refused: {}", self.detail)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod codes {
    use super::ConfigErrorKind;
    use crate::engine::{CodecErrorKind, KeyErrorKind, RecordErrorKind, StepErrorKind};
    use crate::http::RejectionKind;
    use crate::message::{MessageError, MessageErrorKind};
    use crate::outbound::OutboundErrorKind;
    use crate::outbound::http::CallErrorKind;
    use crate::store::StoreErrorKind;
    use std::collections::HashSet;

    /// A code is `idempotency.` and snake_case words, as the HTTP problem codes are.
    fn well_formed(code: &str) -> bool {
        code.strip_prefix("idempotency.").is_some_and(|rest| {
            !rest.is_empty()
                && rest.split('_').all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
        })
    }

    fn check(name: &str, codes: &[&'static str]) {
        for c in codes {
            assert!(well_formed(c), "{name}: {c:?} is not a stable snake_case code");
        }
        let distinct: HashSet<_> = codes.iter().collect();
        assert_eq!(distinct.len(), codes.len(), "{name}: two kinds share a code: {codes:?}");
    }

    #[test]
    fn every_error_kind_has_a_distinct_well_formed_code() {
        use ConfigErrorKind as C;
        check(
            "ConfigErrorKind",
            &[C::OutOfRange, C::InvalidName, C::DeniedHeader, C::ReservedLabel, C::SecretTooShort]
                .map(C::code),
        );
        check("CodecErrorKind", &[CodecErrorKind::Encode, CodecErrorKind::Decode].map(|k| k.code()));
        use KeyErrorKind as K;
        check(
            "KeyErrorKind",
            &[
                K::Empty,
                K::TooLong { max: 1 },
                K::InvalidCharacter,
                K::NonAscii,
                K::BrokenString,
                K::NotAString,
                K::List,
                K::MultipleValues,
            ]
            .map(|k| k.code()),
        );
        use RecordErrorKind as R;
        check("RecordErrorKind", &[R::Invalid, R::Unauthenticated, R::Unencodable].map(R::code));
        use StepErrorKind as S;
        check(
            "StepErrorKind",
            &[
                S::Work,
                S::Store,
                S::Unsupported,
                S::RecordInvalid,
                S::NameInvalid,
                S::NameReused,
                S::SequenceChanged,
                S::NotClaimed,
                S::Conflict,
                S::ClaimLost,
                S::KeyReused,
            ]
            .map(S::code),
        );
        use MessageErrorKind as M;
        check(
            "MessageErrorKind",
            &[
                M::Work,
                M::InFlight,
                M::Store,
                M::KeyMissing,
                M::KeyInvalid,
                M::KeyReused,
                M::RecordInvalid,
            ]
            .map(M::code),
        );
        use OutboundErrorKind as O;
        check(
            "OutboundErrorKind",
            &[O::Work, O::KeyInvalid, O::KeyMissing, O::KeyReused, O::Store, O::RecordInvalid]
                .map(O::code),
        );
        check("CallErrorKind", &[CallErrorKind::Work, CallErrorKind::ResponseBody].map(|k| k.code()));
        use StoreErrorKind as T;
        check(
            "StoreErrorKind",
            &[
                T::Unavailable,
                T::Timeout,
                T::Protocol,
                T::StoreFull,
                T::ScopeFull,
                T::Conflict,
                T::NotReplicated,
                T::Unsupported,
            ]
            .map(T::code),
        );
        #[cfg(feature = "postgres")]
        {
            use crate::transactional::WithinErrorKind as W;
            check("WithinErrorKind", &[W::Work, W::Store, W::Conflict].map(W::code));
        }
        #[cfg(feature = "lettre")]
        {
            use crate::outbound::lettre::MailErrorKind as L;
            check("MailErrorKind", &[L::Work, L::Timeout].map(L::code));
        }
    }

    /// One idea, one code on every door: the user's work failed, and the cases HTTP answers.
    #[test]
    fn the_doors_share_the_codes_of_shared_ideas() {
        let work = "idempotency.work_failed";
        assert_eq!(MessageErrorKind::Work.code(), work);
        assert_eq!(OutboundErrorKind::Work.code(), work);
        assert_eq!(StepErrorKind::Work.code(), work);
        assert_eq!(CallErrorKind::Work.code(), work);
        #[cfg(feature = "postgres")]
        assert_eq!(crate::transactional::WithinErrorKind::Work.code(), work);
        #[cfg(feature = "lettre")]
        assert_eq!(crate::outbound::lettre::MailErrorKind::Work.code(), work);

        for (message, outbound, http) in [
            (MessageErrorKind::KeyMissing, OutboundErrorKind::KeyMissing, RejectionKind::KeyMissing),
            (MessageErrorKind::KeyInvalid, OutboundErrorKind::KeyInvalid, RejectionKind::KeyInvalid),
            (MessageErrorKind::KeyReused, OutboundErrorKind::KeyReused, RejectionKind::KeyReused),
            (MessageErrorKind::Store, OutboundErrorKind::Store, RejectionKind::Store),
            (
                MessageErrorKind::RecordInvalid,
                OutboundErrorKind::RecordInvalid,
                RejectionKind::RecordInvalid,
            ),
        ] {
            assert_eq!(message.code(), http.code());
            assert_eq!(outbound.code(), http.code());
        }
        assert_eq!(MessageErrorKind::InFlight.code(), RejectionKind::InFlight.code());
        assert_eq!(StepErrorKind::KeyReused.code(), RejectionKind::KeyReused.code());
        assert_eq!(StepErrorKind::RecordInvalid.code(), RejectionKind::RecordInvalid.code());
        assert_eq!(StoreErrorKind::StoreFull.code(), RejectionKind::StoreFull.code());
        assert_eq!(StoreErrorKind::ScopeFull.code(), RejectionKind::ScopeFull.code());
    }

    /// An error's `code()` is its kind's.
    #[test]
    fn an_error_gives_the_code_of_its_kind() {
        let reused = MessageError::<std::io::Error>::key_reused();
        assert_eq!(reused.code(), "idempotency.key_reused");
        assert_eq!(reused.code(), reused.kind().code());
        let config = super::ConfigError::new(ConfigErrorKind::OutOfRange, "lease");
        assert_eq!(config.code(), "idempotency.setting_out_of_range");
    }
}
