use super::*;

/// The fields at the start of `struct sock_common` have not moved since Linux 2.6; the
/// others depend on the configuration, and are found all the same.
#[test]
fn this_kernels_sock_layout_is_found_in_its_btf() {
    if !Path::new(VMLINUX_BTF).exists() {
        eprintln!("skipped: no {VMLINUX_BTF}");
        return;
    }
    let layout = read(Path::new(VMLINUX_BTF)).unwrap();
    assert_eq!(
        (layout.daddr, layout.dport, layout.family),
        (0, 12, 16),
        "{layout:?}"
    );
    assert!(layout.v6_rcv_saddr == layout.v6_daddr + 16, "{layout:?}");
    // `struct sock`'s own fields, then `struct inet_sock`'s after it.
    assert!(layout.protocol > layout.v6_rcv_saddr, "{layout:?}");
    assert!(layout.saddr > layout.protocol, "{layout:?}");
    assert!(layout.sport > layout.protocol, "{layout:?}");
}

#[test]
fn a_missing_btf_is_named_in_one_line() {
    let err = read(Path::new("/nonexistent/vmlinux")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("reading the kernel's BTF (/nonexistent/vmlinux): "),
        "{err}"
    );
    assert_eq!(
        choose(
            StateTracepointChoice::Auto,
            Path::new("/nonexistent/vmlinux")
        )
        .unwrap(),
        StateTracepoint::Formatted
    );
}
