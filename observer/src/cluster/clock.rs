//! Keeps times as cluster mode stores them: milliseconds, and the wall clock in milliseconds since
//! the Unix epoch (TTLs and `seen`/`expires` stamps shared between nodes).

use std::time::Duration;

/// Returns `duration` in whole milliseconds, saturating.
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Returns the wall clock in milliseconds since the Unix epoch (0 before it).
pub(super) fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}
