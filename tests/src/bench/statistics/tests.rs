use super::*;

#[test]
fn a_verdict_noise_could_flip_is_inconclusive() {
    let within = |ratio: f64| ratio >= 0.97;
    assert!(verdict(&[0.99, 0.98], within).starts_with("inconclusive: 2 clean pairs"));
    assert_eq!(
        verdict(&[0.99, 0.98, 1.01], within),
        "within target in every clean pair"
    );
    assert_eq!(
        verdict(&[0.90, 0.93, 0.88], within),
        "over target in every clean pair"
    );
    assert!(verdict(&[0.99, 0.93, 1.02], within).contains("2 of 3 clean pairs within target"));
}

/// The orderings of three values of each kind: 20 in all, by U as tabulated, symmetric.
#[test]
fn the_rank_statistic_is_distributed_as_tabulated() {
    assert_eq!(
        u_distribution(3, 3),
        [1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 2.0, 1.0, 1.0]
    );
    let seven = u_distribution(7, 7);
    assert_eq!(seven.iter().sum::<f64>(), 3432.0);
    assert!(seven.iter().eq(seven.iter().rev()));
    assert_eq!(u_distribution(2, 0), [1.0]);
    assert_eq!(u_distribution(0, 2), [1.0]);
    assert_eq!(u_distribution(1, 2), [1.0, 1.0, 1.0]);
}

/// The pairs of three runs of this bench on a 2-core VM (throughput ratios to no observer:
/// the packet hook's, then the control's). The second and third runs each had a segment a
/// burst on the host slowed (control ×1.536, ×0.338): ranks keep it from hiding the
/// observer's cost, which a range test let pass.
#[test]
fn a_watchers_pairs_are_judged_against_the_controls_by_rank() {
    let first = noise_verdict(
        &[1.030, 0.823, 0.869, 0.812, 1.001],
        &[1.142, 0.955, 0.856, 1.004, 1.024],
    );
    assert!(first.starts_with("within noise"), "{first}");
    let second = noise_verdict(
        &[0.959, 0.949, 1.159, 0.930, 0.960],
        &[1.069, 1.049, 1.536, 0.985, 0.975],
    );
    assert!(second.starts_with("below noise"), "{second}");
    let third = noise_verdict(
        &[0.887, 0.957, 0.569, 0.908, 0.971, 0.882, 1.012],
        &[1.012, 1.009, 1.232, 0.982, 1.015, 0.338, 1.052],
    );
    assert!(third.starts_with("below noise"), "{third}");
    let faster = noise_verdict(&[1.20, 1.25, 1.30], &[0.99, 1.00, 1.01]);
    assert!(faster.starts_with("above noise"), "{faster}");
    assert!(noise_verdict(&[1.0, 1.0, 1.0], &[1.0, 1.0]).starts_with("inconclusive"));
}

#[test]
fn ratios_summarise_as_median_and_range() {
    assert_eq!(ratio_summary(&[]), "—");
    assert_eq!(ratio_summary(&[0.9, 1.1, 1.0]), "×1.000 (×0.900–×1.100)");
}
