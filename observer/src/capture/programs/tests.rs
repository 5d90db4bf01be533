use super::*;

fn refused_ring_buffer() -> aya::EbpfError {
    aya::EbpfError::MapError(MapError::CreateError {
        name: "EVENTS".into(),
        io_error: std::io::Error::from_raw_os_error(libc::EPERM),
    })
}

/// A ring buffer refused for the memlock limit is named as such, not as a kernel without
/// ring buffers; without a limit in the way the refusal reads as before.
#[test]
fn a_memlock_limit_in_the_way_is_named_with_its_fix() {
    let error = classify_load_error(&refused_ring_buffer(), Some(64 << 10)).to_string();
    assert_eq!(
        error,
        "eBPF setup failed: map error: failed to create map `EVENTS`: Operation not permitted (os \
        error 1) (Linux before 5.11 charges BPF memory to RLIMIT_MEMLOCK, 64 KiB here, which the \
        observer cannot lift without CAP_SYS_RESOURCE: grant it, or start it with `ulimit -l \
        unlimited`)"
    );
    assert!(matches!(
        classify_load_error(&refused_ring_buffer(), None),
        CaptureError::NoRingBuffer(_)
    ));
}

#[test]
fn a_refusal_names_debians_paranoia_level_and_its_fix() {
    let debian = perf_paranoia_hint(Some("3\n"));
    assert!(
        debian.contains("kernel.perf_event_paranoid is 3")
            && debian.contains("`sysctl kernel.perf_event_paranoid=2`"),
        "{debian}"
    );
    for other in [Some("2\n"), Some("-1"), None] {
        assert!(
            perf_paranoia_hint(other).contains("needs CAP_PERFMON or CAP_SYS_ADMIN"),
            "{other:?}"
        );
    }
}
