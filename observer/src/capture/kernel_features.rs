//! Names what an older kernel lacks from the verifier's refusal instead of quoting its log.
//!
//! The programs need Linux 5.8: the BPF ring buffer and `bpf_ringbuf_query` (5.8),
//! `bpf_probe_read_user` (5.5), bounded loops (5.3, the payload copy's 40-step programs where
//! `bpf_loop`, 5.17, is missing: that refusal is not an error, the observer then loads the
//! bounded copy), global data (5.2, the log level),
//! tracepoints (4.16 for `sock/inet_sock_set_state`). A kernel without the ring buffer already
//! fails when the map is created (`CaptureError::NoRingBuffer`); these are the refusals that
//! come later, from the verifier.

/// Names the oldest kernel with everything the programs use.
const NEEDED: &str = "Linux 5.8 or newer";

/// Lists the helpers the programs call that are younger than the tracepoints (uapi/linux/bpf.h
/// ids): a kernel that lacks one does not know its name either, its verifier says `unknown#134`.
const YOUNG_HELPERS: &[(u32, &str)] = &[
    (112, "bpf_probe_read_user"),
    (130, "bpf_ringbuf_output"),
    (131, "bpf_ringbuf_reserve"),
    (132, "bpf_ringbuf_submit"),
    (133, "bpf_ringbuf_discard"),
    (134, "bpf_ringbuf_query"),
];

/// Returns a one-line name for the feature the verifier's log says is missing, if it says so.
pub fn missing_feature(verifier_log: &str) -> Option<String> {
    if let Some(rest) = verifier_log.split("unknown func ").nth(1) {
        // `unknown func bpf_ringbuf_query#134`, or `unknown func unknown#134` on a kernel that
        // predates the helper.
        let call = rest.split_whitespace().next().unwrap_or_default();
        let (name, id) = call.split_once('#').unwrap_or((call, ""));
        let id: Option<u32> = id.parse().ok();
        let known = YOUNG_HELPERS
            .iter()
            .find(|(young, _)| Some(*young) == id)
            .map(|(_, name)| *name);
        let helper = match (name, known, id) {
            ("unknown" | "", Some(known), _) => known.to_owned(),
            ("unknown" | "", None, Some(id)) => format!("#{id}"),
            _ => name.to_owned(),
        };
        return Some(format!(
            "this kernel lacks the BPF helper {helper} ({NEEDED} is needed)"
        ));
    }
    if verifier_log.contains("back-edge from insn") {
        return Some(format!(
            "this kernel's verifier rejects bounded loops ({NEEDED} is needed)"
        ));
    }
    None
}

#[cfg(test)]
mod tests;
