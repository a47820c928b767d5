//! lettre over a real SMTP server (to do).
