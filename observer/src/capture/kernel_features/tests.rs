use super::*;

#[test]
fn an_unknown_helper_is_named() {
    let log = "0: (85) call bpf_get_current_pid_tgid#14\n; ...\n45: (85) call unknown#134\nunknown \
        func bpf_ringbuf_query#134\nprocessed 45 insns";
    assert_eq!(
        missing_feature(log).as_deref(),
        Some("this kernel lacks the BPF helper bpf_ringbuf_query (Linux 5.8 or newer is needed)")
    );
}

#[test]
fn a_helper_older_kernels_cannot_name_is_named_from_its_id() {
    let log = "45: (85) call unknown#134\nunknown func unknown#134\n";
    assert_eq!(
        missing_feature(log).as_deref(),
        Some("this kernel lacks the BPF helper bpf_ringbuf_query (Linux 5.8 or newer is needed)")
    );
}

#[test]
fn a_rejected_loop_is_named() {
    let log = "back-edge from insn 120 to 80\nprocessed 130 insns";
    assert!(missing_feature(log).unwrap().contains("bounded loops"));
}

#[test]
fn other_refusals_are_left_to_the_log() {
    assert_eq!(missing_feature("R2 unbounded memory access"), None);
}
