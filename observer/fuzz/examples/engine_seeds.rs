//! Writes the engine target's seed corpus from synthetic OpenIM traffic, so the fuzzer starts
//! from complete upgrades and push calls instead of having to find HTTP/2 on its own.
//!
//! Run from observer/fuzz: `cargo +nightly run --example engine_seeds -- seeds/engine`.

#[path = "../fuzz_targets/engine_input.rs"]
mod engine_input;
#[path = "../../tests/support/synthetic.rs"]
#[allow(dead_code)]
mod synthetic;

fn main() {
    let directory = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "seeds/engine".to_owned());
    std::fs::create_dir_all(&directory)
        .unwrap_or_else(|error| panic!("creating {directory}: {error}"));
    let scenarios = [
        (
            "misrouted_3_gateways",
            synthetic::Scenario {
                gateways: 3,
                users: 6,
                misrouted_share: 0.5,
                push_calls: 3,
                recipients_per_call: 4,
                ..synthetic::Scenario::default()
            },
        ),
        (
            "one_gateway_small_chunks",
            synthetic::Scenario {
                gateways: 1,
                users: 3,
                push_calls: 2,
                recipients_per_call: 3,
                max_chunk: 37,
                ..synthetic::Scenario::default()
            },
        ),
        (
            "push_connections_left_open",
            synthetic::Scenario {
                gateways: 2,
                users: 4,
                misrouted_share: 1.0,
                push_calls: 4,
                recipients_per_call: 4,
                close_push_connections: false,
                ..synthetic::Scenario::default()
            },
        ),
    ];
    for (name, scenario) in scenarios {
        let traffic = synthetic::generate(&scenario);
        let bytes = engine_input::encode(&traffic.events);
        let round_trip = engine_input::decode(&bytes);
        assert_eq!(round_trip.len(), traffic.events.len(), "{name}");
        // The seed must lead the engine to the same conclusions as the traffic it encodes.
        let (original_alerts, seed_alerts) =
            (alert_kinds(&traffic.events), alert_kinds(&round_trip));
        assert_eq!(original_alerts, seed_alerts, "{name}");
        let path = format!("{directory}/{name}");
        std::fs::write(&path, &bytes).unwrap_or_else(|error| panic!("writing {path}: {error}"));
        println!(
            "{path}: {} events, {} bytes, alerts {seed_alerts:?}",
            traffic.events.len(),
            bytes.len()
        );
    }
}

fn alert_kinds(events: &[observer::model::Event]) -> Vec<&'static str> {
    let mut engine = observer::correlate::Engine::new(Default::default());
    let mut alerts = Vec::new();
    for event in events {
        engine.on_event(event, &mut alerts);
    }
    engine.finish(&mut alerts);
    alerts.iter().map(|alert| alert.kind()).collect()
}
