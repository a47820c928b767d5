//! Free loopback ports for the servers the tests start.
//!
//! A port picked here is free only until someone else binds it: a child handed the number
//! binds it later, and another test may start a server on it meanwhile. So a child that can
//! bind port 0 and report its address does that instead (the quickstart, the test binary's own
//! app processes). The servers that cannot (redis-server, redis-sentinel, nats-server,
//! PostgreSQL, the SMTP server) are started on a port from here, and started again on another
//! one when the bind failed.

use std::net::{Ipv4Addr, TcpListener};

/// A port nothing listens on (for a cluster node, its bus port, +10000, is free too).
pub(crate) fn free_port(cluster: bool) -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = l.local_addr().expect("local addr").port();
        if !cluster {
            return port;
        }
        let bus_free = port
            .checked_add(10_000)
            .is_some_and(|bus| TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_ok());
        if bus_free {
            return port;
        }
    }
    panic!("no free loopback port found");
}
