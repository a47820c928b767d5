//! The per-store matrix: one test body run over each store, as one test per store.
//!
//! The stores, each with keys of its own: [`memory`] a fresh `MemoryStore`; [`redis`] and
//! [`postgres`] a store under a prefix of its own on the test binary's shared server
//! ([`RedisServer::shared`](super::redis_server::RedisServer::shared),
//! [`PostgresServer::shared`](super::postgres_server::PostgresServer::shared)), or `None` when
//! the server cannot run here (the test returns early; see [`super::servers::available`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use tower_idempotency::MemoryStore;

/// `name` made unique in this process: the stores of two tests never share keys.
pub(crate) fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{name}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A fresh `MemoryStore` with its defaults.
#[allow(clippy::unused_async)] // called as the other stores are
pub(crate) async fn memory(_name: &str) -> Option<MemoryStore> {
    Some(MemoryStore::new())
}

/// A `RedisStore` under a prefix of its own (from `name`) on the shared server.
#[cfg(feature = "redis")]
pub(crate) async fn redis(name: &str) -> Option<tower_idempotency::store::redis::RedisStore> {
    let server = super::redis_server::RedisServer::shared()?;
    let store = tower_idempotency::store::redis::RedisStore::connect(&server.url(), &unique(name))
        .await
        .expect("connect to the shared Redis server");
    Some(store)
}

/// A `PostgresStore` under a prefix of its own (from `name`) in the shared server's default
/// table, migrated.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres(
    name: &str,
) -> Option<tower_idempotency::store::postgres::PostgresStore> {
    let server = super::postgres_server::PostgresServer::shared()?;
    let store =
        tower_idempotency::store::postgres::PostgresStore::connect(&server.url(), &unique(name))
            .await
            .expect("connect to the shared PostgreSQL server");
    // Safe at once from many tests: one transaction under an advisory lock.
    store.migrate().await.expect("migrate");
    Some(store)
}

/// Expands a test body once per store, as a module of tests per store. Two forms:
///
/// - scenarios: `per_store!([memory: memory, redis: redis] door, SpyStore::wrap; a, b);`
///   makes `memory::a`, `redis::a`, … each a multi-threaded `#[tokio::test]` that calls
///   `crate::door::a(SpyStore::wrap(store)).await` with the module's store (give `std::convert::identity`
///   for the store itself);
/// - items: `per_store!([memory: memory, redis: redis] { use super::*; #[tokio::test] … });`
///   puts the items in each module beside `async fn store() -> Option<impl Store>`, the
///   module's store, and `const STORE: &str`, its name.
///
/// Each pair is `module: store`; a store is `memory`, `redis` or `postgres` (compiled with its
/// feature), a function of this module. A test whose store returns `None` returns early.
#[allow(unused_macros)] // by the binaries without a matrix
macro_rules! per_store {
    // One module at a time: a repetition of the modules holding one of the tests would repeat
    // two lists at once.
    ([$module:ident: $store:ident $($rest:tt)*] { $($items:tt)* }) => {
        $crate::support::stores::per_store!(@module $store $module {
            /// This module's store's name.
            #[allow(dead_code)]
            const STORE: &str = stringify!($store);
            /// This module's store, or `None` (skip) when its server cannot run here.
            #[allow(dead_code)]
            async fn store() -> Option<impl tower_idempotency::Store> {
                $crate::support::stores::$store(stringify!($module)).await
            }
            $($items)*
        });
        $crate::support::stores::per_store!(@rest [$($rest)*] { $($items)* });
    };
    ([$module:ident: $store:ident $($rest:tt)*] $scenarios:ident, $wrap:expr; $($name:ident),* $(,)?) => {
        $crate::support::stores::per_store!(@module $store $module {
            // `$wrap` names what the caller's module has in scope.
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(store) = $crate::support::stores::$store(stringify!($name)).await
                    else {
                        return;
                    };
                    $crate::$scenarios::$name(($wrap)(store)).await;
                }
            )*
        });
        $crate::support::stores::per_store!(@rest [$($rest)*] $scenarios, $wrap; $($name),*);
    };
    (@rest [, $($rest:tt)+] $($tail:tt)*) => {
        $crate::support::stores::per_store!([$($rest)+] $($tail)*);
    };
    (@rest [$(,)?] $($tail:tt)*) => {};
    (@module memory $module:ident { $($body:tt)* }) => {
        mod $module { $($body)* }
    };
    (@module redis $module:ident { $($body:tt)* }) => {
        #[cfg(feature = "redis")]
        mod $module { $($body)* }
    };
    (@module postgres $module:ident { $($body:tt)* }) => {
        #[cfg(feature = "postgres")]
        mod $module { $($body)* }
    };
}
#[allow(unused_imports)]
pub(crate) use per_store;
