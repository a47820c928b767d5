//! HTTP adapter (to do).
