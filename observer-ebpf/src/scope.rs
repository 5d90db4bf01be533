//! Decides, for `--cgroup-scope`, whether the current task may be watched at all. Checked where a
//! connection becomes watched (`connect`) and where a watched socket is read or written (`io`), so
//! a process moved out of the scope after connecting stops being captured.

use observer_records::MAX_CGROUP_SCOPES;

use crate::maps::{CGROUP_SCOPE, CONFIG};

/// Says whether the current task may be watched: true when no scope is configured, or the current
/// task is inside (a descendant of) one of the scope's cgroups in the cgroup v2 hierarchy.
pub fn current_task_in_scope() -> bool {
    let scopes = match CONFIG.get(0) {
        Some(config) => config.cgroup_scopes,
        None => 0,
    };
    if scopes == 0 {
        return true;
    }
    // Every slot, a constant trip count: an empty slot answers -EAGAIN, never "inside".
    // Verifier: stopping at the configured count (`if index >= scopes { break }`) let LLVM
    // turn the exit into `index == min(scopes, 16)`; Linux 6.1's verifier cannot bound that
    // against an unknown count and walked the loop until "The sequence of 8193 jumps is too
    // complex". In scope, the walk ends at the task's own slot, usually the first.
    for index in 0..MAX_CGROUP_SCOPES {
        if CGROUP_SCOPE.current_task_under_cgroup(index) == Ok(true) {
            return true;
        }
    }
    false
}
