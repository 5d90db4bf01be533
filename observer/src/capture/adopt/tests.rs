use super::*;

#[test]
fn socket_links_name_their_inode() {
    assert_eq!(socket_inode(Path::new("socket:[4242]")), Some(4242));
    assert_eq!(socket_inode(Path::new("pipe:[4242]")), None);
    assert_eq!(socket_inode(Path::new("/dev/null")), None);
}

#[test]
fn a_proc_cgroup_path_is_followed_from_the_namespace_root_within_the_hierarchy() {
    let hierarchy = Path::new("/host/sys/fs/cgroup");
    let namespace_root = hierarchy.join("kubepods.slice/pod-a.slice/container-a.scope");
    let process = tempfile::tempdir().unwrap();
    let resolve = |line: &str| {
        fs::write(process.path().join("cgroup"), format!("{line}\n")).unwrap();
        cgroup_directory(hierarchy, &namespace_root, process.path())
    };
    // A process of another pod, seen from this pod's own namespace.
    assert_eq!(
        resolve("0::/../../pod-b.slice/container-b.scope"),
        Some(hierarchy.join("kubepods.slice/pod-b.slice/container-b.scope"))
    );
    assert_eq!(resolve("0::/"), Some(namespace_root.clone()));
    assert_eq!(resolve("0::/../../.."), Some(hierarchy.to_owned()));
    assert_eq!(resolve("0::/../../../.."), None);
    // A cgroup v1-only process line: no v2 path.
    assert_eq!(resolve("4:memory:/user.slice"), None);
}

#[test]
fn this_process_finds_its_own_connection_and_descriptor() {
    use std::os::fd::AsRawFd;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _server = listener.accept().unwrap();
    let everyone = ScopeMembership::new(PathBuf::from("/sys/fs/cgroup"), &[]);
    let (found, outside_scope) = find_established(&[port], &[], &everyone);
    assert_eq!(outside_scope, 0);
    let mine: Vec<&FoundConnection> = found
        .iter()
        .filter(|connection| connection.local == client.local_addr().unwrap())
        .collect();
    assert_eq!(mine.len(), 1, "{found:?}");
    let pid = std::process::id();
    assert!(
        mine[0]
            .descriptors
            .contains(&(pid, client.as_raw_fd() as u32))
    );
    assert_eq!(mine[0].port_class, PortClass::Grpc);
    assert!(holds_socket(&mine[0].descriptors, mine[0].inode));
    let elsewhere = [(std::process::id(), u32::MAX - 1)];
    assert!(!holds_socket(&elsewhere, mine[0].inode));
    let kernel = mine[0].kernel_connection();
    assert_eq!(kernel.dport, port);
    assert_eq!(kernel.family, AF_INET);
    assert_eq!(&kernel.daddr[..4], &[127, 0, 0, 1]);
}
