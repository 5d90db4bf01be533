use super::*;

/// Linux 6.1's and 6.18's `syscalls/sys_enter_connect`.
const CONNECT: &str = "name: sys_enter_connect
ID: 2230
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int fd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:struct sockaddr * uservaddr;\toffset:24;\tsize:8;\tsigned:0;
\tfield:int addrlen;\toffset:32;\tsize:8;\tsigned:0;

print fmt: \"fd: 0x%08lx\", ((unsigned long)(REC->fd))
";

const SET_STATE: &str = "name: inet_sock_set_state
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:int oldstate;\toffset:16;\tsize:4;\tsigned:1;
\tfield:int newstate;\toffset:20;\tsize:4;\tsigned:1;
\tfield:__u16 sport;\toffset:24;\tsize:2;\tsigned:0;
\tfield:__u16 dport;\toffset:26;\tsize:2;\tsigned:0;
\tfield:__u16 family;\toffset:28;\tsize:2;\tsigned:0;
\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;
\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;
\tfield:__u8 daddr[4];\toffset:36;\tsize:4;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:__u8 daddr_v6[16];\toffset:56;\tsize:16;\tsigned:0;
";

#[test]
fn fields_parse_with_pointers_and_arrays() {
    let fields = parse_fields(CONNECT);
    assert_eq!(
        fields[6],
        FormatField {
            name: "uservaddr".into(),
            offset: 24,
            size: 8
        }
    );
    assert_eq!(parse_fields(SET_STATE)[8].name, "saddr");
}

#[test]
fn the_layouts_the_programs_assume_match_current_kernels() {
    let connect = reads_of("sys_enter_connect");
    assert_eq!(
        check_format("syscalls/sys_enter_connect", CONNECT, connect),
        Ok(())
    );
    let set_state = reads_of("inet_sock_set_state");
    assert_eq!(
        check_format("sock/inet_sock_set_state", SET_STATE, set_state),
        Ok(())
    );
}

#[test]
fn a_moved_field_is_named_in_one_line() {
    let moved = SET_STATE.replace("dport;\toffset:26", "dport;\toffset:28");
    let err = check_format("sock/inet_sock_set_state", &moved, INET_SOCK_SET_STATE)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "tracepoint sock/inet_sock_set_state: field dport is at offset 28 (size 2) on this kernel, \
        the programs read offset 26 (size 2)"
    );
}

#[test]
fn a_missing_argument_is_named() {
    let short = CONNECT.replace("\tfield:int addrlen;\toffset:32;\tsize:8;\tsigned:0;\n", "");
    let err = check_format(
        "syscalls/sys_enter_write",
        &short,
        reads_of("sys_enter_send_buffer"),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tracepoint syscalls/sys_enter_write has no syscall argument 2, which the programs read"
    );
}

#[test]
fn every_attached_program_reads_something_checked() {
    for program in super::super::programs::tracepoint_program_names() {
        assert!(
            !reads_of(program).is_empty(),
            "{program} has no layout to check"
        );
    }
}

#[test]
fn a_missing_format_file_is_one_line() {
    let err = check(
        Path::new("/nonexistent-tracefs"),
        &[("sys_exit_io", "syscalls", "sys_exit_write")],
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "tracepoint syscalls/sys_exit_write is missing from this kernel"
    );
}
