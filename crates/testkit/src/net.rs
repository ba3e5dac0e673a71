//! Ports for tests that need a place where nothing listens.
//!
//! "The backend is down" and "the store is unreachable" are, on one machine, a port with no
//! listener: connecting is refused at once, so the test waits for no timeout.

/// A port on 127.0.0.1 where nothing listens: bound by the OS's choice, then released. Another
/// process could take it in between; on a test machine that is rare and shows as a failure
/// to reach it being something else than a refusal.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener
        .local_addr()
        .expect("a bound listener's address")
        .port()
}
