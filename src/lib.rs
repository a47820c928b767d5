// The crate page. Blocks shared with the README are files of their own; scripts/readme.sh
// checks that the README carries them byte for byte.
#![doc = include_str!("docs/intro.md")]
#![doc = include_str!("docs/crate.md")]
#![doc = include_str!("docs/guarantee.md")]
#![doc = include_str!("docs/steps.md")]
#![doc = include_str!("docs/features.md")]
#![doc = include_str!("docs/namespaces.md")]
#![doc = include_str!("docs/metrics.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod hex;
mod metrics;
mod trace;

pub mod engine;
pub mod http;
pub mod message;
pub mod outbound;
pub mod store;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub mod transactional;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub mod webhook;

#[doc(inline)]
pub use crate::engine::key::IdempotencyKey;
#[doc(inline)]
pub use crate::engine::scope::DerivedKey;
#[doc(inline)]
pub use crate::engine::secret::Secret;
#[doc(inline)]
pub use crate::engine::steps::Steps;
#[doc(inline)]
pub use crate::error::{ConfigError, ConfigErrorKind};
#[doc(inline)]
pub use crate::http::{IdempotencyLayer, Principal, PrincipalMode, ResponseMode};
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[doc(inline)]
pub use crate::store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use crate::store::postgres::PostgresStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use crate::store::redis::RedisStore;
#[doc(inline)]
pub use crate::store::{MemoryStore, Store};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
#[doc(inline)]
pub use crate::http::route::IdempotentRoutes;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use tower_idempotency_macros::idempotent;

#[cfg(feature = "macros")]
#[doc(hidden)]
#[path = "http/macros_support.rs"]
pub mod __private;

// The README's examples, compiled as doctests so they cannot rot (they need every feature).
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "postgres",
    feature = "macros",
    feature = "tonic",
    feature = "reqwest"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod codes {
    //! Every error's codes, read across the layers: only the root may import them all.

    use crate::engine::{CodecErrorKind, KeyErrorKind, RecordErrorKind, StepErrorKind};
    use crate::error::{ConfigError, ConfigErrorKind};
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
                && rest
                    .split('_')
                    .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
        })
    }

    fn check(name: &str, codes: &[&'static str]) {
        for c in codes {
            assert!(
                well_formed(c),
                "{name}: {c:?} is not a stable snake_case code"
            );
        }
        let distinct: HashSet<_> = codes.iter().collect();
        assert_eq!(
            distinct.len(),
            codes.len(),
            "{name}: two kinds share a code: {codes:?}"
        );
    }

    #[test]
    fn every_error_kind_has_a_distinct_well_formed_code() {
        use ConfigErrorKind as C;
        check(
            "ConfigErrorKind",
            &[
                C::OutOfRange,
                C::InvalidName,
                C::DeniedHeader,
                C::ReservedLabel,
                C::SecretTooShort,
                C::SecretInvalid,
            ]
            .map(C::code),
        );
        check(
            "CodecErrorKind",
            &[CodecErrorKind::Encode, CodecErrorKind::Decode].map(|k| k.code()),
        );
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
        check(
            "RecordErrorKind",
            &[R::Invalid, R::Unauthenticated, R::Unencodable].map(R::code),
        );
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
            &[
                O::Work,
                O::KeyInvalid,
                O::KeyMissing,
                O::KeyReused,
                O::Store,
                O::RecordInvalid,
            ]
            .map(O::code),
        );
        check(
            "CallErrorKind",
            &[CallErrorKind::Work, CallErrorKind::ResponseBody].map(|k| k.code()),
        );
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
            check(
                "WithinErrorKind",
                &[W::Work, W::Store, W::Conflict].map(W::code),
            );
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
            (
                MessageErrorKind::KeyMissing,
                OutboundErrorKind::KeyMissing,
                RejectionKind::KeyMissing,
            ),
            (
                MessageErrorKind::KeyInvalid,
                OutboundErrorKind::KeyInvalid,
                RejectionKind::KeyInvalid,
            ),
            (
                MessageErrorKind::KeyReused,
                OutboundErrorKind::KeyReused,
                RejectionKind::KeyReused,
            ),
            (
                MessageErrorKind::Store,
                OutboundErrorKind::Store,
                RejectionKind::Store,
            ),
            (
                MessageErrorKind::RecordInvalid,
                OutboundErrorKind::RecordInvalid,
                RejectionKind::RecordInvalid,
            ),
        ] {
            assert_eq!(message.code(), http.code());
            assert_eq!(outbound.code(), http.code());
        }
        assert_eq!(
            MessageErrorKind::InFlight.code(),
            RejectionKind::InFlight.code()
        );
        assert_eq!(
            StepErrorKind::KeyReused.code(),
            RejectionKind::KeyReused.code()
        );
        assert_eq!(
            StepErrorKind::RecordInvalid.code(),
            RejectionKind::RecordInvalid.code()
        );
        assert_eq!(
            StoreErrorKind::StoreFull.code(),
            RejectionKind::StoreFull.code()
        );
        assert_eq!(
            StoreErrorKind::ScopeFull.code(),
            RejectionKind::ScopeFull.code()
        );
    }

    /// An error's `code()` is its kind's.
    #[test]
    fn an_error_gives_the_code_of_its_kind() {
        let reused = MessageError::<std::io::Error>::key_reused();
        assert_eq!(reused.code(), "idempotency.key_reused");
        assert_eq!(reused.code(), reused.kind().code());
        let config = ConfigError::new(ConfigErrorKind::OutOfRange, "lease");
        assert_eq!(config.code(), "idempotency.setting_out_of_range");
    }
}
