//! The HTTP adapter (to do).
