#![cfg(feature = "sqlite")]
