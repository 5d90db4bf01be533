//! Checks the tracepoint record layouts the kernel programs read against this kernel's tracefs
//! before they are loaded: a kernel that moved a field gets a one-line refusal naming it, not
//! silently wrong ports and addresses.
//!
//! The offsets are the ones the programs read, from `observer_records::tracepoint`.

use std::path::Path;

use observer_records::tracepoint::{
    INET_SOCK_SET_STATE_FIELDS, SYSCALL_ARG_SIZE, SYSCALL_ARG0, SYSCALL_RET,
};
use thiserror::Error;

/// Describes a field the programs read: where they read it, and how many bytes.
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

/// Describes the nth argument of a `sys_enter_*` tracepoint: the arguments follow each other, 8
/// bytes each.
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

/// Lists what the programs read of `sock/inet_sock_set_state`, unchanged since 4.16.
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

/// Returns what each program (by name, see `programs::ATTACHMENTS`) reads from its tracepoint
/// record.
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

/// Says why a tracepoint's layout is not the one the programs read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("tracepoint {tracepoint} is missing from this kernel")]
    MissingTracepoint { tracepoint: String },
    #[error("cannot read the format of tracepoint {tracepoint} ({reason})")]
    Unreadable { tracepoint: String, reason: String },
    #[error("tracepoint {tracepoint} has no {field}, which the programs read")]
    MissingField { tracepoint: String, field: String },
    #[error(
        "tracepoint {tracepoint}: {field} is at offset {found_offset} (size {found_size}) on this \
        kernel, the programs read offset {offset} (size {size})"
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
///
/// # Errors
///
/// Fails with [`LayoutError::MissingTracepoint`] or [`LayoutError::Unreadable`] when a format file
/// is missing or unreadable, and with [`LayoutError::MissingField`] or [`LayoutError::Moved`] when
/// a field a program reads is missing or at another offset or size.
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

/// Holds one `field:` line of a format file.
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

/// Parses the `field:` lines, e.g. `field:__u8 saddr[4]; offset:32; size:4; signed:0;`
/// (tab-separated) → saddr, 32, 4.
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
mod tests;
