//! Chooses which tracepoint tells the programs about TCP state changes, and, for the raw one, where
//! the running kernel keeps the fields of `struct sock` it reads (`SockLayout`), found in the
//! kernel's BTF.
//!
//! The formatted tracepoint (`sock/inet_sock_set_state`) hands the programs a record the kernel
//! fills, but attaches through `perf_event_open`, which kernels built like Debian's refuse
//! without CAP_SYS_ADMIN at their default `kernel.perf_event_paranoid` (3). The raw tracepoint
//! attaches without a perf event and hands over the socket itself, whose fields move with the
//! kernel's version and configuration: hence the BTF. Without BTF (a kernel built without
//! CONFIG_DEBUG_INFO_BTF) the formatted one serves.

use std::path::Path;

use observer_records::SockLayout;

use super::btf::{Btf, TypeId};

/// Names where the running kernel's own types are (its BTF).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Says which tracepoint to attach for TCP state changes (`--state-tracepoint`, for tests of either
/// on any kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StateTracepointChoice {
    /// The raw tracepoint where the kernel's BTF describes `struct sock`, else the formatted one.
    Auto,
    /// The raw tracepoint; refuse to start without the kernel's BTF.
    Raw,
    /// The formatted tracepoint.
    Formatted,
}

/// Names the tracepoint chosen. Serialised as `raw` or `formatted` (`observer_started`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateTracepoint {
    Raw(SockLayout),
    Formatted,
}

impl serde::Serialize for StateTracepoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            StateTracepoint::Raw(_) => "raw",
            StateTracepoint::Formatted => "formatted",
        })
    }
}

/// Says why the kernel's BTF gives no `SockLayout`.
#[derive(Debug, thiserror::Error)]
pub enum SockLayoutError {
    #[error("reading the kernel's BTF ({path}): {reason}")]
    Unreadable { path: String, reason: String },
    #[error("the kernel's BTF has no struct inet_sock with a field {0}")]
    MissingField(String),
    #[error("struct inet_sock's field {field} is {found}, the programs read {expected} bytes")]
    UnexpectedField {
        field: String,
        found: String,
        expected: usize,
    },
}

/// Decides the tracepoint: `Auto` takes the raw one when `btf_path` describes `struct sock`,
/// and says on stderr why not otherwise.
///
/// # Errors
///
/// Fails, with `Raw` only, as [`read`] does; `Auto` takes the formatted tracepoint instead.
pub fn choose(
    choice: StateTracepointChoice,
    btf_path: &Path,
) -> Result<StateTracepoint, SockLayoutError> {
    match choice {
        StateTracepointChoice::Formatted => Ok(StateTracepoint::Formatted),
        StateTracepointChoice::Raw => read(btf_path).map(StateTracepoint::Raw),
        StateTracepointChoice::Auto => Ok(match read(btf_path) {
            Ok(layout) => StateTracepoint::Raw(layout),
            Err(err) => {
                tracing::info!(
                    "TCP state changes from the formatted tracepoint (perf_event_open): {err}"
                );
                StateTracepoint::Formatted
            }
        }),
    }
}

/// Reads the offsets of the fields the raw tracepoint's program reads from the BTF at `path`.
///
/// # Errors
///
/// Fails with [`SockLayoutError::Unreadable`] when the file cannot be read or is not BTF,
/// [`SockLayoutError::MissingField`] when `struct inet_sock` or a field is missing, and
/// [`SockLayoutError::UnexpectedField`] when a field is a bitfield or not of the size the programs
/// read.
pub fn read(path: &Path) -> Result<SockLayout, SockLayoutError> {
    let unreadable = |reason: String| SockLayoutError::Unreadable {
        path: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|err| unreadable(err.to_string()))?;
    let types = Btf::parse(&bytes).map_err(|err| unreadable(err.to_string()))?;
    // `struct inet_sock` begins with the `struct sock` the tracepoint hands over, and holds
    // the ports and IPv4 source the formatted record is filled from.
    let inet_sock = types
        .struct_named("inet_sock")
        .ok_or_else(|| SockLayoutError::MissingField("(none: no struct inet_sock)".to_owned()))?;
    let field = |path: &str, size: usize| field_offset(&types, inet_sock, path, size);
    Ok(SockLayout {
        family: field("sk.__sk_common.skc_family", 2)?,
        dport: field("sk.__sk_common.skc_dport", 2)?,
        sport: field("inet_sport", 2)?,
        daddr: field("sk.__sk_common.skc_daddr", 4)?,
        saddr: field("inet_saddr", 4)?,
        v6_daddr: field("sk.__sk_common.skc_v6_daddr", 16)?,
        v6_rcv_saddr: field("sk.__sk_common.skc_v6_rcv_saddr", 16)?,
        protocol: field("sk.sk_protocol", 2)?,
    })
}

/// Returns the byte offset of the field at `path` (members found through anonymous unions and
/// structs as C finds them), which must be a whole `size` bytes: not a bitfield.
fn field_offset(
    types: &Btf,
    container: TypeId,
    path: &str,
    size: usize,
) -> Result<u16, SockLayoutError> {
    let member = types
        .member(container, path)
        .ok_or_else(|| SockLayoutError::MissingField(path.to_owned()))?;
    let unexpected = |found: String| SockLayoutError::UnexpectedField {
        field: path.to_owned(),
        found,
        expected: size,
    };
    if member.bitfield_bits != 0 || member.bit_offset % 8 != 0 {
        return Err(unexpected("a bitfield".to_owned()));
    }
    match types.size_of(member.type_id) {
        Ok(found) if found == size => {}
        Ok(found) => return Err(unexpected(format!("{found} bytes"))),
        Err(err) => return Err(unexpected(err.to_string())),
    }
    let offset = member.bit_offset / 8;
    u16::try_from(offset).map_err(|_| unexpected(format!("at byte {offset}")))
}

#[cfg(test)]
mod tests;
