//! Reading a key's state for an operator: [`Engine::inspect`].

use crate::engine::record::RecordError;
use crate::engine::{Begin, Engine, bounded};
use crate::store::{Claim, Inspected, Store, StoreError, StoreKey};
use std::time::Duration;

/// What holds a key, as [`Engine::inspect`] reads it for an operator.
///
/// Times are what is left from the moment of the read, by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// Nothing holds the key: the next request under it runs its work. A lapsed lease or an
    /// expired record reads so, and so does a released key whose recorded steps are kept for
    /// its retry: the same request resumes from them, and another request under the key is
    /// refused as a reused key at its first step.
    Absent,
    /// A request holds the key and its work may be running: a repeat is answered "in flight"
    /// (HTTP 409) until it finishes or the lease lapses.
    #[non_exhaustive]
    InFlight {
        /// How long the claim's lease has left. The engine renews it while the work runs.
        lease_left: Duration,
    },
    /// The key's work finished: a repeat with the same request is answered from its record.
    #[non_exhaustive]
    Done {
        /// The recorded status: the response's status for the HTTP layer, 200 for the record of
        /// another door (a message's result, an outbound receipt).
        status: u16,
        /// How long the record is kept, after which the key runs its work again.
        expires_in: Duration,
    },
    /// A record holds the key but fails validation: a repeat is refused, never replayed,
    /// never run again, until the record expires or is forgotten. A record altered in the
    /// store reads so, and a repeat is answered 503 `record_invalid`. A record written under a
    /// secret that is no longer in the engine's [`Secret`](crate::Secret) ring reads so too,
    /// with an error of kind
    /// [`Unauthenticated`](crate::engine::RecordErrorKind::Unauthenticated); a repeat of it is
    /// answered 422 `key_reused`, as its fingerprint, keyed under the dropped secret, no longer
    /// matches the repeat's.
    #[non_exhaustive]
    Invalid {
        /// Why the record is refused.
        error: RecordError,
        /// How long the record is kept.
        expires_in: Duration,
    },
}

impl<S: Store> Engine<S> {
    /// What holds `key` now, for an admin endpoint or a support tool: nothing, a request in
    /// flight with the lease it has left, or a finished request's status and when its record
    /// expires. One read of the store, beside [`forget`](Self::forget): it takes no claim and
    /// renews nothing. A record is read as a repeat would be: verified under the engine's
    /// secret, and checked against the record limit. Derive the key with
    /// [`store_key`](Self::store_key), as the doors do: a raw key is never stored.
    ///
    /// What it answers tells whether a caller used a key, and how its request ended: serve it
    /// to operators only, behind the admin routes' own authentication.
    ///
    /// An admin route that answers JSON:
    ///
    /// ```
    /// use axum::{Json, Router, extract::{Path, State}, http::StatusCode, routing::get};
    /// use serde_json::{Value, json};
    /// use tower_idempotency::{IdempotencyKey, MemoryStore};
    /// use tower_idempotency::engine::{Begin, Engine, Fingerprint, KeyState, Recorded, Scope};
    ///
    /// async fn key_state(
    ///     State(engine): State<Engine<MemoryStore>>,
    ///     Path((principal, key)): Path<(String, String)>,
    /// ) -> Result<Json<Value>, StatusCode> {
    ///     let key = IdempotencyKey::new(&key).map_err(|_| StatusCode::BAD_REQUEST)?;
    ///     let key = engine.store_key("orders", &Scope::principal(&principal), &key);
    ///     let state = engine.inspect(&key).await.map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    ///     Ok(Json(match state {
    ///         KeyState::InFlight { lease_left, .. } => {
    ///             json!({ "state": "in_flight", "lease_left_ms": lease_left.as_millis() })
    ///         }
    ///         KeyState::Done { status, expires_in, .. } => {
    ///             json!({ "state": "done", "status": status, "expires_in_s": expires_in.as_secs() })
    ///         }
    ///         KeyState::Invalid { error, .. } => json!({ "state": "invalid", "code": error.code() }),
    ///         _ => json!({ "state": "absent" }),
    ///     }))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let engine = Engine::new(MemoryStore::new());
    /// let admin: Router = Router::new()
    ///     .route("/admin/keys/{principal}/{key}", get(key_state))
    ///     .with_state(engine.clone());
    /// # let _ = admin;
    ///
    /// // What the route reads, step by step.
    /// let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("order-7").unwrap());
    /// assert_eq!(engine.inspect(&key).await.unwrap(), KeyState::Absent);
    /// let fp = Fingerprint::builder().field(b"payload").finish();
    /// let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else { panic!("first run") };
    /// assert!(matches!(engine.inspect(&key).await.unwrap(), KeyState::InFlight { .. }));
    /// engine.complete(ticket, &Recorded::new(201, vec![], None)).await.unwrap();
    /// assert!(matches!(engine.inspect(&key).await.unwrap(), KeyState::Done { status: 201, .. }));
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error; [`Unsupported`](crate::store::StoreErrorKind::Unsupported) from a
    /// store of your own that does not implement [`Store::inspect`].
    pub async fn inspect(&self, key: &StoreKey) -> Result<KeyState, StoreError> {
        let found = bounded(self.store_timeout, self.store.inspect(key)).await?;
        Ok(match found {
            Inspected::Absent => KeyState::Absent,
            Inspected::Pending { lease_left, .. } => KeyState::InFlight { lease_left },
            Inspected::Done {
                fingerprint,
                record,
                expires_in,
            } => {
                // Judged as a repeat of the request that wrote it: decoded and verified exactly
                // as a replay would be, so what an operator reads is what a retry would get.
                let claim = Claim::Done {
                    fingerprint,
                    record,
                };
                match self.judge(*key, fingerprint, fingerprint, claim) {
                    Begin::Replayed(r) => KeyState::Done {
                        status: r.status,
                        expires_in,
                    },
                    Begin::RecordInvalid(error) => KeyState::Invalid { error, expires_in },
                    _ => KeyState::Invalid {
                        error: RecordError::new("record not readable"),
                        expires_in,
                    },
                }
            }
        })
    }
}
