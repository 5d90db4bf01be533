use super::*;

#[test]
fn stat_fields_are_read_after_the_command_name() {
    let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 \
                    8 0 5000 104857600 2560 18446744073709551615";
    let parsed = parse_stat(stat, "cpu 1 2 3\nbtime 1700000000\n", 100.0, 4096.0);
    assert_eq!(
        parsed,
        Some(Stat {
            cpu_seconds: 4.0,
            start_time_seconds: 1_700_000_050.0,
            virtual_memory_bytes: 104_857_600.0,
            resident_memory_bytes: 2560.0 * 4096.0,
        })
    );
}

#[test]
fn this_process_is_read() {
    assert!(read_stat().is_some_and(|stat| stat.resident_memory_bytes > 0.0));
    assert!(max_fds().is_some_and(|max| max > 0.0));
}
