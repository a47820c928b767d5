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
    /// A webhook sender's secret that is empty, or not base64 where the sender writes it so.
    SecretInvalid,
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
            Self::SecretInvalid => "idempotency.secret_invalid",
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
