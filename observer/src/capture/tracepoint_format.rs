//! The tracepoint record layouts the kernel programs read, checked against this kernel's tracefs
//! before they are loaded: a kernel that moved a field gets a one-line refusal naming it, not
//! silently wrong ports and addresses.
//!
//! The offsets are the ones the programs read, from `observer_records::tracepoint`.

use std::path::Path;

use observer_records::tracepoint::{
    INET_SOCK_SET_STATE_FIELDS, SYSCALL_ARG_SIZE, SYSCALL_ARG0, SYSCALL_RET,
};
use thiserror::Error;

/// A field the programs read: where they read it, and how many bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expected {
    field: Field,
    offset: u32,
    size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// A field by name (`sock/inet_sock_set_state`).
    Named(&'static str),
    /// The nth argument of a `sys_enter_*` tracepoint, whatever the syscall calls it.
    SyscallArgument(u32),
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Named(name) => write!(f, "field {name}"),
            Field::SyscallArgument(index) => write!(f, "syscall argument {index}"),
        }
    }
}

/// The nth argument of a `sys_enter_*` tracepoint: the arguments follow each other, 8 bytes each.
const fn syscall_argument(index: u32) -> Expected {
    Expected {
        field: Field::SyscallArgument(index),
        offset: (SYSCALL_ARG0 + SYSCALL_ARG_SIZE * index as usize) as u32,
        size: SYSCALL_ARG_SIZE as u32,
    }
}

const SYSCALL_RETURN: Expected = Expected {
    field: Field::Named("ret"),
    offset: SYSCALL_RET as u32,
    size: SYSCALL_ARG_SIZE as u32,
};

/// `sock/inet_sock_set_state`, unchanged since 4.16.
const INET_SOCK_SET_STATE: &[Expected] = &{
    let mut fields = [Expected {
        field: Field::Named(""),
        offset: 0,
        size: 0,
    }; INET_SOCK_SET_STATE_FIELDS.len()];
    let mut index = 0;
    while index < fields.len() {
        let (name, offset, size) = INET_SOCK_SET_STATE_FIELDS[index];
        fields[index] = Expected {
            field: Field::Named(name),
            offset: offset as u32,
            size: size as u32,
        };
        index += 1;
    }
    fields
};

/// What each program (by name, see `programs::ATTACHMENTS`) reads from its tracepoint record.
fn reads_of(program: &str) -> &'static [Expected] {
    const ARGUMENTS_0: &[Expected] = &[syscall_argument(0)];
    const ARGUMENTS_0_1: &[Expected] = &[syscall_argument(0), syscall_argument(1)];
    const ARGUMENTS_0_1_2: &[Expected] = &[
        syscall_argument(0),
        syscall_argument(1),
        syscall_argument(2),
    ];
    match program {
        "sys_enter_connect" | "sys_enter_sendmsg" | "sys_enter_recvmsg" => ARGUMENTS_0_1,
        "sys_enter_close" => ARGUMENTS_0,
        "sys_enter_send_buffer"
        | "sys_enter_recv_buffer"
        | "sys_enter_send_iovec"
        | "sys_enter_recv_iovec" => ARGUMENTS_0_1_2,
        // `copy_continue` runs on the record of `sys_exit_io_bounded`, which it continues.
        "sys_exit_connect" | "sys_exit_io" | "sys_exit_io_bounded" | "copy_continue" => {
            &[SYSCALL_RETURN]
        }
        "inet_sock_set_state" => INET_SOCK_SET_STATE,
        _ => &[],
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("tracepoint {tracepoint} is missing from this kernel")]
    MissingTracepoint { tracepoint: String },
    #[error("cannot read the format of tracepoint {tracepoint} ({reason})")]
    Unreadable { tracepoint: String, reason: String },
    #[error("tracepoint {tracepoint} has no {field}, which the programs read")]
    MissingField { tracepoint: String, field: String },
    #[error(
        "tracepoint {tracepoint}: {field} is at offset {found_offset} (size {found_size}) on this kernel, the programs read offset {offset} (size {size})"
    )]
    Moved {
        tracepoint: String,
        field: String,
        offset: u32,
        size: u32,
        found_offset: u32,
        found_size: u32,
    },
}

/// Checks every (program, category, tracepoint) attachment against
/// `<tracefs>/events/<category>/<tracepoint>/format`.
pub fn check(tracefs: &Path, attachments: &[(&str, &str, &str)]) -> Result<(), LayoutError> {
    for (program, category, name) in attachments {
        let tracepoint = format!("{category}/{name}");
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let format = std::fs::read_to_string(&path).map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => LayoutError::MissingTracepoint {
                tracepoint: tracepoint.clone(),
            },
            _ => LayoutError::Unreadable {
                tracepoint: tracepoint.clone(),
                reason: err.to_string(),
            },
        })?;
        check_format(&tracepoint, &format, reads_of(program))?;
    }
    Ok(())
}

/// One `field:` line of a format file.
#[derive(Debug, PartialEq, Eq)]
struct FormatField {
    name: String,
    offset: u32,
    size: u32,
}

fn check_format(tracepoint: &str, format: &str, reads: &[Expected]) -> Result<(), LayoutError> {
    let fields = parse_fields(format);
    // Syscall arguments follow `__syscall_nr`, in order.
    let arguments: Vec<&FormatField> = fields
        .iter()
        .skip_while(|field| field.name != "__syscall_nr")
        .skip(1)
        .collect();
    for expected in reads {
        let found = match expected.field {
            Field::Named(name) => fields.iter().find(|field| field.name == name),
            Field::SyscallArgument(index) => arguments.get(index as usize).copied(),
        };
        let Some(found) = found else {
            return Err(LayoutError::MissingField {
                tracepoint: tracepoint.to_owned(),
                field: expected.field.to_string(),
            });
        };
        if (found.offset, found.size) != (expected.offset, expected.size) {
            return Err(LayoutError::Moved {
                tracepoint: tracepoint.to_owned(),
                field: expected.field.to_string(),
                offset: expected.offset,
                size: expected.size,
                found_offset: found.offset,
                found_size: found.size,
            });
        }
    }
    Ok(())
}

/// `field:__u8 saddr[4]; offset:32; size:4; signed:0;` (tab-separated) → saddr, 32, 4.
fn parse_fields(format: &str) -> Vec<FormatField> {
    format
        .lines()
        .filter_map(|line| {
            let mut parts = line.trim().split(';').map(str::trim);
            let declaration = parts.next()?.strip_prefix("field:")?;
            let name = declaration.rsplit([' ', '*']).next()?;
            let name = name.split('[').next()?.to_owned();
            let mut offset = None;
            let mut size = None;
            for part in parts {
                if let Some(value) = part.strip_prefix("offset:") {
                    offset = value.parse().ok();
                } else if let Some(value) = part.strip_prefix("size:") {
                    size = value.parse().ok();
                }
            }
            Some(FormatField {
                name,
                offset: offset?,
                size: size?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
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
            "tracepoint sock/inet_sock_set_state: field dport is at offset 28 (size 2) on this kernel, the programs read offset 26 (size 2)"
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
}
