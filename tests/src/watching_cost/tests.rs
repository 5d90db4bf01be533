use super::*;

#[test]
fn the_interval_is_the_t_interval_of_the_logarithms() {
    // ln 0.9 and ln 1.0 around ln √0.9, with a standard error of |ln 0.9| / 2.
    let (ratio, low, high) = geometric_interval(&[0.9, 1.0]).unwrap();
    let half_width = 12.706 * 0.9_f64.ln().abs() / 2.0;
    assert!((ratio - 0.9_f64.sqrt()).abs() < 1e-12);
    assert!((low - (0.9_f64.sqrt().ln() - half_width).exp()).abs() < 1e-12);
    assert!((high - (0.9_f64.sqrt().ln() + half_width).exp()).abs() < 1e-12);
    assert_eq!(geometric_interval(&[0.9]), None);
    assert_eq!(geometric_interval(&[0.9, 0.0]), None);
}

fn pair(on: f64, off: f64) -> Pair {
    let report = |pushes_per_second: f64| FloodReport {
        calls: 0,
        errors: 0,
        seconds: PHASE.as_secs_f64(),
        pushes_per_second,
        p50_us: 400,
        p99_us: 700,
        max_us: 1_000,
    };
    Pair {
        on: report(on),
        off: report(off),
    }
}

#[test]
fn the_verdicts_follow_the_interval() {
    let steady = WatchingCost {
        pairs: vec![
            pair(1900.0, 2000.0),
            pair(1900.0, 2000.0),
            pair(1900.0, 2000.0),
        ],
        cpu: Err("not measured here".to_owned()),
        same_cpu: None,
    };
    let text = steady.render(3.0);
    assert!(
        text.contains("×0.950 (95% interval ×0.950–×0.950"),
        "{text}"
    );
    assert!(text.contains("3 of 3 pairs below ×1"), "{text}");
    assert!(text.contains("within noise: below noise"), "{text}");
    assert!(text.contains("loss: missed"), "{text}");

    let noisy = WatchingCost {
        pairs: vec![
            pair(1800.0, 2000.0),
            pair(2200.0, 2000.0),
            pair(1980.0, 2000.0),
        ],
        cpu: Err("not measured here".to_owned()),
        same_cpu: None,
    };
    let text = noisy.render(3.0);
    assert!(text.contains("within noise: within noise"), "{text}");
    assert!(text.contains("loss: inconclusive"), "{text}");

    let one = WatchingCost {
        pairs: vec![pair(1900.0, 2000.0)],
        cpu: Err("not measured here".to_owned()),
        same_cpu: None,
    };
    assert!(one.render(3.0).contains("too few pairs"));
}

/// Per push, µs: 24 ms of programs over 2,000 pushes is 12 µs; the daemon's 25 ms, 12.5.
#[test]
fn the_observer_cpu_is_told_per_push_or_why_not() {
    let watching = PhaseCpu {
        pushes: 2_000,
        seconds: 1.0,
        program_ns: 24_000_000,
        program_runs: 100_000,
        daemon_seconds: 0.025,
    };
    assert_eq!(
        watching.render("watching"),
        "watching: programs 12.0 µs (50.0 runs of 240 ns), daemon 12.5 µs, together 24.5 ms per \
        1,000 pushes"
    );
    let measured = WatchingCost {
        pairs: vec![pair(1900.0, 2000.0), pair(1900.0, 2000.0)],
        cpu: Ok(ObserverCpu {
            watching,
            not_watching: PhaseCpu::default(),
        }),
        same_cpu: None,
    };
    let text = measured.render(3.0);
    assert!(text.contains("\n  watching: programs 12.0 µs"), "{text}");
    assert!(
        text.contains("\n  not watching: programs 0.0 µs (0.0 runs of 0 ns)"),
        "{text}"
    );
    let unmeasured = WatchingCost {
        pairs: measured.pairs,
        cpu: Err("switch on the kernel's BPF run-time statistics: EINVAL".to_owned()),
        same_cpu: None,
    };
    let text = unmeasured.render(3.0);
    assert!(
        text.contains(
            "CPU a push: not measured: switch on the kernel's BPF run-time statistics: EINVAL"
        ),
        "{text}"
    );
}

/// Watching added 21 µs a push (25 against 4) at 2,000 pushes/s: 4.2% of one CPU.
#[test]
fn the_yardstick_burns_what_watching_added() {
    let cpu = ObserverCpu {
        watching: PhaseCpu {
            pushes: 6_000,
            seconds: 3.0,
            program_ns: 6_000 * 13_000,
            program_runs: 0,
            daemon_seconds: 6_000.0 * 12e-6,
        },
        not_watching: PhaseCpu {
            pushes: 6_000,
            seconds: 3.0,
            program_ns: 6_000 * 4_000,
            program_runs: 0,
            daemon_seconds: 0.0,
        },
    };
    assert!(
        (cpu.added_share() - 0.042).abs() < 1e-9,
        "{}",
        cpu.added_share()
    );
}

/// The yardstick's line compares its interval with watching's: overlapping, or wholly
/// below or above it.
#[test]
fn the_yardstick_says_whether_watching_costs_more_than_its_cpu() {
    let burner = SameCpu {
        share: 0.042,
        pairs: vec![pair(1940.0, 2000.0), pair(1940.0, 2000.0)],
    };
    let line = |watching: (f64, f64)| {
        let mut out = String::new();
        burner.render(&mut out, watching);
        out
    };
    let text = line((0.95, 0.98));
    assert!(
        text.contains(
            "(4.2% of one CPU, bursts every 3 ms), the observer watching nothing, 2 \
                pairs: throughput ×0.970 (95% interval ×0.970–×0.970), p99 ×1.000"
        ),
        "{text}"
    );
    assert!(
        text.contains("what its CPU costs it (the intervals overlap)"),
        "{text}"
    );
    assert!(line((0.90, 0.96)).contains("more than its CPU does"));
    assert!(line((0.98, 0.99)).contains("less than its CPU does"));
}

#[test]
fn t_quantiles_come_from_the_table_rounding_df_down() {
    assert_eq!(t_quantile_975(0), f64::INFINITY);
    assert_eq!(t_quantile_975(1), 12.706);
    assert_eq!(t_quantile_975(12), 2.228);
    assert_eq!(t_quantile_975(39), 2.042);
    assert_eq!(t_quantile_975(1000), 2.000);
}
