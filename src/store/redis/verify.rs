//! Start-up checks: the server's version and eviction policy, read from its answers.

use super::{MIN_REDIS_VERSION, NATIVE_CLAIM_VERSION, RedisStore};
use crate::store::{StoreError, StoreErrorKind};
use ::redis::Value;
use ::redis::aio::ConnectionLike;
use std::sync::atomic::Ordering;

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Checks the server at start-up: its version is at least 5.0 (below 7.0, claims use the
    /// script from then on), and its
    /// `maxmemory-policy` is `noeviction` (warned through `tracing` otherwise, since an evicted
    /// record lets the next repeat run). On Redis Cluster every primary is checked.
    ///
    /// The policy is read from `INFO`, or from `CONFIG GET maxmemory-policy` when `INFO` does
    /// not show it; where both are refused (managed Redis), the report says the policy could
    /// not be checked ([`EvictionCheck::Unknown`]) instead of failing.
    ///
    /// # Errors
    /// The usual store errors when Redis cannot be asked; `Protocol` when the server is older
    /// than the floor or its `INFO` carries no version.
    pub async fn verify(&self) -> Result<VerifyReport, StoreError> {
        let (generation, mut conn) = self.inner.checkout();
        let info: Value = self
            .bounded(
                generation,
                self.deadline(),
                ::redis::cmd("INFO").query_async(&mut conn),
            )
            .await
            .map_err(|e| e.into_store("Redis INFO"))?;
        let mut report = from_info(&info)?;
        if matches!(report.eviction, EvictionCheck::Unknown { .. }) {
            let mut cmd = ::redis::cmd("CONFIG");
            cmd.arg("GET").arg("maxmemory-policy");
            report.eviction = match self
                .bounded(
                    generation,
                    self.deadline(),
                    cmd.query_async::<Value>(&mut conn),
                )
                .await
            {
                Ok(v) => from_config_get(&v),
                Err(e) if e.kind() == StoreErrorKind::Protocol || e.is_refused() => {
                    EvictionCheck::Unknown {
                        reason: "CONFIG GET was refused",
                    }
                }
                Err(e) => return Err(e.into_store("Redis CONFIG GET")),
            };
        }
        report.warn();
        // A server that cannot take `SET … NX … GET` gets the script from the first claim on,
        // instead of after one refused attempt.
        if report.version < NATIVE_CLAIM_VERSION {
            self.inner
                .native_claim_unsupported
                .store(true, Ordering::Relaxed);
        }
        Ok(report)
    }
}

/// What [`RedisStore::verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The server version as `(major, minor, patch)`; on a cluster, the lowest of its primaries.
    pub version: (u32, u32, u32),
    /// How many servers answered: 1 for a standalone server, the primaries of a cluster.
    pub servers: usize,
    /// Whether the server may evict records.
    pub eviction: EvictionCheck,
}

impl VerifyReport {
    /// Whether every server checked uses `maxmemory-policy noeviction`.
    #[must_use]
    pub fn is_noeviction(&self) -> bool {
        self.eviction == EvictionCheck::NoEviction
    }

    fn warn(&self) {
        match &self.eviction {
            EvictionCheck::NoEviction => {}
            EvictionCheck::Evicts { policy } => tracing::warn!(
                maxmemory_policy = %policy,
                "Redis maxmemory-policy is not noeviction: when Redis is full it may evict \
                 idempotency records, and the next repeat of an evicted request runs again",
            ),
            EvictionCheck::Unknown { reason } => tracing::warn!(
                reason,
                "could not check the Redis maxmemory-policy; make sure it is noeviction, or an \
                 evicted idempotency record lets the next repeat run again",
            ),
        }
    }
}

/// The eviction policy found by [`RedisStore::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// `maxmemory-policy` is `noeviction`: a full Redis refuses writes instead of dropping
    /// records.
    NoEviction,
    /// Another policy: a full Redis may drop records, and a repeat then runs again.
    Evicts {
        /// The policy in force (on a cluster, the first primary not at `noeviction`).
        policy: String,
    },
    /// The policy could not be checked (`INFO` does not show it and `CONFIG` is refused, as on
    /// many managed services).
    Unknown {
        /// Why not.
        reason: &'static str,
    },
}

/// Reads an `INFO` answer: one text (standalone), or one per primary keyed by address
/// (Redis Cluster).
fn from_info(info: &Value) -> Result<VerifyReport, StoreError> {
    let mut texts = Vec::new();
    match info {
        Value::Map(nodes) => {
            for (_, node) in nodes {
                texts.push(text(node)?);
            }
        }
        other => texts.push(text(other)?),
    }
    if texts.is_empty() {
        return Err(protocol("INFO answered no server"));
    }
    let mut version = (u32::MAX, u32::MAX, u32::MAX);
    let mut eviction = EvictionCheck::NoEviction;
    for t in &texts {
        let v =
            field(t, "redis_version").ok_or_else(|| protocol("INFO carries no redis_version"))?;
        version = version.min(parse_version(v)?);
        match (field(t, "maxmemory_policy"), &eviction) {
            (_, EvictionCheck::Evicts { .. }) | (Some("noeviction"), _) => {}
            (Some(policy), _) => {
                eviction = EvictionCheck::Evicts {
                    policy: policy.to_owned(),
                }
            }
            (None, _) => {
                eviction = EvictionCheck::Unknown {
                    reason: "INFO does not show maxmemory_policy",
                };
            }
        }
    }
    if version < MIN_REDIS_VERSION {
        return Err(protocol(
            "the Redis server is older than 5.0, the oldest the store's scripts support",
        ));
    }
    Ok(VerifyReport {
        version,
        servers: texts.len(),
        eviction,
    })
}

/// Reads a `CONFIG GET maxmemory-policy` answer: `[name, value]` (RESP2) or `{name: value}`.
fn from_config_get(reply: &Value) -> EvictionCheck {
    let value = match reply {
        Value::Array(items) if items.len() == 2 => text(&items[1]).ok(),
        Value::Map(pairs) if pairs.len() == 1 => text(&pairs[0].1).ok(),
        _ => None,
    };
    match value.as_deref().map(str::trim) {
        Some("noeviction") => EvictionCheck::NoEviction,
        Some(policy) => EvictionCheck::Evicts {
            policy: policy.to_owned(),
        },
        None => EvictionCheck::Unknown {
            reason: "CONFIG GET maxmemory-policy gave no answer",
        },
    }
}

fn text(v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone())
            .map_err(|e| StoreError::with_source(StoreErrorKind::Protocol, "INFO is not UTF-8", e)),
        Value::VerbatimString { text, .. } => Ok(text.clone()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::ServerError(e) => Err(StoreError::with_source(
            StoreErrorKind::Unavailable,
            "a Redis server refused INFO",
            ::redis::RedisError::from(e.clone()),
        )),
        _ => Err(protocol("unexpected answer to INFO")),
    }
}

/// The value of `name:value` in an `INFO` text.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn parse_version(v: &str) -> Result<(u32, u32, u32), StoreError> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>());
    let mut next = || {
        parts
            .next()
            .unwrap_or(Ok(0))
            .map_err(|_| protocol("unreadable redis_version"))
    };
    Ok((next()?, next()?, next()?))
}

fn protocol(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn info(version: &str, policy: Option<&str>) -> Value {
        let mut s =
            format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n# Memory\r\n");
        if let Some(p) = policy {
            s.push_str(&format!("maxmemory_policy:{p}\r\n"));
        }
        Value::BulkString(s.into_bytes())
    }

    #[test]
    fn reads_version_and_policy() {
        let r = from_info(&info("7.0.15", Some("noeviction"))).unwrap();
        assert_eq!(
            (r.version, r.servers, r.is_noeviction()),
            ((7, 0, 15), 1, true)
        );
        let r = from_info(&info("6.2", Some("allkeys-lru"))).unwrap();
        assert_eq!(r.version, (6, 2, 0));
        assert_eq!(
            r.eviction,
            EvictionCheck::Evicts {
                policy: "allkeys-lru".into()
            }
        );
        assert!(matches!(
            from_info(&info("7.2.4", None)).unwrap().eviction,
            EvictionCheck::Unknown { .. }
        ));
    }

    #[test]
    fn refuses_old_or_unreadable_versions() {
        for v in ["4.0.14", "2.8", "x.y", ""] {
            let e = from_info(&info(v, Some("noeviction"))).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Protocol, "{v}");
        }
        assert!(from_info(&Value::Int(1)).is_err());
    }

    #[test]
    fn a_cluster_reports_its_oldest_primary_and_any_evicting_one() {
        let node = |a: &str, v, p| (Value::BulkString(a.as_bytes().to_vec()), info(v, Some(p)));
        let map = Value::Map(vec![
            node("a:1", "7.2.0", "noeviction"),
            node("b:2", "7.0.15", "volatile-lru"),
            node("c:3", "7.4.1", "noeviction"),
        ]);
        let r = from_info(&map).unwrap();
        assert_eq!((r.version, r.servers), ((7, 0, 15), 3));
        assert_eq!(
            r.eviction,
            EvictionCheck::Evicts {
                policy: "volatile-lru".into()
            }
        );
    }

    #[test]
    fn reads_config_get_in_both_protocols() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            from_config_get(&Value::Array(vec![b("maxmemory-policy"), b("noeviction")])),
            EvictionCheck::NoEviction
        );
        assert_eq!(
            from_config_get(&Value::Map(vec![(b("maxmemory-policy"), b("allkeys-lfu"))])),
            EvictionCheck::Evicts {
                policy: "allkeys-lfu".into()
            }
        );
        assert!(matches!(
            from_config_get(&Value::Array(vec![])),
            EvictionCheck::Unknown { .. }
        ));
    }
}
