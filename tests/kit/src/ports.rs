//! Hands out loopback ports for tests that listen: free ones, never handed out twice by one
//! process.
//!
//! Each port is one the kernel gives to a bind of port 0 on 127.0.0.1, checked free on `[::1]`
//! too, so two test files (two test binaries) cannot both be handed a port one of them holds,
//! and no test file has to pick a range by hand.

use std::{
    collections::HashSet,
    net::{Ipv6Addr, TcpListener},
    sync::Mutex,
};

/// Holds the ports this process handed out already.
static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Returns a port free on 127.0.0.1 and on `[::1]` now, not returned before in this process.
///
/// # Panics
/// When no such port turns up in 100 tries (the ephemeral range exhausted).
pub fn free_port() -> u16 {
    let mut given = GIVEN.lock().unwrap_or_else(|poison| poison.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..100 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("a bound address").port();
        // Hosts without IPv6 have no [::1] to collide on.
        let v6_free = TcpListener::bind((Ipv6Addr::LOCALHOST, port)).is_ok()
            || TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_err();
        if v6_free && given.insert(port) {
            return port;
        }
    }
    panic!("no free loopback port in 100 tries");
}

/// Returns `N` ports of [`free_port`], all different.
pub fn free_ports<const N: usize>() -> [u16; N] {
    std::array::from_fn(|_| free_port())
}
