//! The whole engine (decoders, detectors, alerts) and the output whitelist over arbitrary
//! event sequences: no panic, the tables stay within their caps, and every alert line (written
//! by one `LineWriter`, from the JSON it keeps of what earlier lines named) is serde_json's.
#![no_main]

mod engine_input;

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use observer::alert::{Alert, LineWriter};
use observer::budget::MemoryBudget;
use observer::correlate::{Engine, EngineConfig, RouteLimits, connections::UPGRADED_PER_SLOT};
use observer::decode::Limits;
use observer::model::EventKind;
use observer::privacy::OutputWhitelist;

const MAX_CONNECTIONS: usize = 8;
/// Decoders, plus the ids of upgraded WebSocket connections (only their close still matters),
/// which are bounded per decoder slot.
const MAX_TRACKED: usize = MAX_CONNECTIONS * (1 + UPGRADED_PER_SLOT);
const MAX_USERS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let events = engine_input::decode(data);
    // Small caps, so that inputs of a few KB reach the eviction paths.
    let mut engine = Engine::new(EngineConfig {
        routes: RouteLimits {
            max_users: MAX_USERS,
            max_placements_per_user: 2,
            max_pending_calls: 8,
            max_tracked_connections: 16,
            max_fold_keys: 8,
            fold_window_secs: 2,
            ring_settle_secs: 1,
            answer_timeout_secs: 1,
            churn_min_new_connections: 3,
            churn_window_secs: 2,
            // Half a second: inputs of a few KB reach misses held for a message's other calls.
            message_window_ms: 500,
        },
        decode: Limits {
            max_buffered_bytes: 4096,
            max_header_block_bytes: 1024,
            max_dynamic_table_size: 512,
            max_streams: 4,
            max_http1_head_bytes: 2048,
        },
        max_connections: MAX_CONNECTIONS,
        memory: MemoryBudget::new(1 << 20),
        node: None,
    });
    let mut whitelists: HashMap<u64, OutputWhitelist> = HashMap::new();
    let mut alerts = Vec::new();
    let mut lines = LineWriter::default();
    for event in &events {
        match &event.kind {
            EventKind::Data {
                direction,
                offset,
                payload,
                ..
            } => {
                let mut filtered = payload.to_vec();
                whitelists
                    .entry(event.connection)
                    .or_insert_with(|| OutputWhitelist::new(event.port_class))
                    .filter(*direction, *offset, &mut filtered);
                assert_eq!(filtered.len(), payload.len());
            }
            EventKind::TcpConnect | EventKind::Close | EventKind::TcpState { .. } => {
                whitelists.remove(&event.connection);
            }
        }
        engine.on_event(event, &mut alerts);
        for alert in alerts.drain(..) {
            check_line(&mut lines, &alert);
        }
        let counters = engine.counters();
        assert!(counters.connections.tracked <= MAX_TRACKED, "{counters:?}");
        assert!(counters.users_tracked <= MAX_USERS, "{counters:?}");
    }
    engine.finish(&mut alerts);
    for alert in &alerts {
        check_line(&mut lines, alert);
    }
});

fn check_line(lines: &mut LineWriter, alert: &Alert) {
    let expected = serde_json::to_string(alert).expect("an alert serializes");
    assert_eq!(lines.line(alert), expected);
}
