//! Free loopback ports for the servers the tests start.
//!
//! A port picked here is free only until someone else binds it: a child handed the number
//! binds it later, and another test may start a server on it meanwhile. So a child that can
//! bind port 0 and report its address does that instead (the quickstart, the test binary's own
//! app processes). The servers that cannot (redis-server, redis-sentinel, nats-server,
//! PostgreSQL, the SMTP server) are started on a port from here, and started again on another
//! one when the bind failed. A test that needs a port to refuse connections first and to
//! answer later holds it all along: [`Refusing`].

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

/// A loopback port this process holds without listening on it: a connection is refused (the
/// kernel answers it with a reset) until [`listen`](Self::listen), and no other test or server
/// can take the port meanwhile, as it could one picked, closed and bound again later.
#[derive(Debug)]
pub(crate) struct Refusing(tokio::net::TcpSocket);

impl Refusing {
    /// A fresh port, held.
    pub(crate) fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind((Ipv4Addr::LOCALHOST, 0).into())
            .expect("bind a loopback port");
        Self(socket)
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.0.local_addr().expect("local addr").port()
    }

    /// Starts listening on the port: connections are accepted from now on.
    pub(crate) fn listen(self) -> tokio::net::TcpListener {
        self.0.listen(1024).expect("listen on the held port")
    }
}
