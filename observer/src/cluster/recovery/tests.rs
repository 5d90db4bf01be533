use super::*;

#[test]
fn this_process_sees_its_own_connection() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let _server = listener.accept().unwrap();
    let key = ConnectionKey {
        local: client.local_addr().unwrap(),
        remote: client.peer_addr().unwrap(),
    };
    assert!(established_connections().contains(&key));
}
