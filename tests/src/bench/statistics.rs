//! How the push flood's pairs are judged: medians, ratios, verdicts only where noise cannot
//! flip them, and the rank test against the control's pairs.

/// A verdict needs at least this many clean pairs: with fewer, their spread says nothing.
const MIN_PAIRS_FOR_VERDICT: usize = 3;
/// How unlikely under noise alone a watcher's ratios must be to count as outside it.
const NOISE_SIGNIFICANCE: f64 = 0.05;

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        len if len % 2 == 1 => sorted[len / 2],
        len => (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0,
    }
}

/// "within target" only when every clean pair is within, "over target" only when none is: a
/// verdict noise could flip is reported as inconclusive.
pub(super) fn verdict(ratios: &[f64], within: impl Fn(f64) -> bool) -> String {
    let inside = ratios.iter().filter(|ratio| within(**ratio)).count();
    if ratios.len() < MIN_PAIRS_FOR_VERDICT {
        format!(
            "inconclusive: {} clean pairs, a verdict needs {MIN_PAIRS_FOR_VERDICT}",
            ratios.len()
        )
    } else if inside == ratios.len() {
        "within target in every clean pair".to_owned()
    } else if inside == 0 {
        "over target in every clean pair".to_owned()
    } else {
        format!(
            "inconclusive: {inside} of {} clean pairs within target, the range straddles it",
            ratios.len()
        )
    }
}

/// Whether a watcher's throughput ratios differ from the control's, which are what noise alone
/// does to a pair: a one-sided rank test each way (Mann–Whitney, exact), so a segment a burst on
/// the host slowed weighs as one rank, not by its size, as it would in a range or a mean.
/// "below noise" when the watcher's ratios rank lower than the control's with a probability of
/// at most `NOISE_SIGNIFICANCE` under noise alone, "above noise" when higher, "within noise"
/// otherwise. With too few pairs on either side, inconclusive.
pub(super) fn noise_verdict(ratios: &[f64], noise: &[f64]) -> String {
    if ratios.len() < MIN_PAIRS_FOR_VERDICT || noise.len() < MIN_PAIRS_FOR_VERDICT {
        return format!(
            "inconclusive: {} clean pairs and {} control pairs, a verdict needs {MIN_PAIRS_FOR_VERDICT} of each",
            ratios.len(),
            noise.len()
        );
    }
    let lower = chance_of_ranking_this_low(ratios, noise);
    let higher = chance_of_ranking_this_low(noise, ratios);
    let place = if lower <= NOISE_SIGNIFICANCE {
        "below"
    } else if higher <= NOISE_SIGNIFICANCE {
        "above"
    } else {
        "within"
    };
    format!(
        "{place} noise (median ×{:.3} against the control's ×{:.3}; rank test p = {:.3})",
        median(ratios),
        median(noise),
        lower.min(higher)
    )
}

/// Were `first` and `second` drawn alike, the chance that `first` ranks at least this far below
/// `second`: the upper tail of the Mann–Whitney U, the pairs in which `first`'s value is the
/// smaller (a tie counts half, rounded down, which can only make the chance larger).
fn chance_of_ranking_this_low(first: &[f64], second: &[f64]) -> f64 {
    let twice_u: usize = first
        .iter()
        .flat_map(|a| second.iter().map(move |b| (a, b)))
        .map(|(a, b)| match a.total_cmp(b) {
            std::cmp::Ordering::Less => 2,
            std::cmp::Ordering::Equal => 1,
            std::cmp::Ordering::Greater => 0,
        })
        .sum();
    let orderings = u_distribution(first.len(), second.len());
    let total: f64 = orderings.iter().sum();
    orderings[twice_u / 2..].iter().sum::<f64>() / total
}

/// For `n` values of one kind and `m` of another in a random order, how many of the orderings
/// give each U from 0 to n·m (U: the pairs whose first-kind value is the smaller). The largest
/// value is either of the second kind, above all `n` of the first (U gains `n`), or of the
/// first kind, above none of the second.
fn u_distribution(n: usize, m: usize) -> Vec<f64> {
    // One row at a time (i values of the first kind, j = 0..=m of the second), so that
    // `--rounds` in the hundreds needs megabytes, not the whole table's gigabytes.
    let mut row: Vec<Vec<f64>> = vec![vec![1.0]; m + 1];
    for i in 1..=n {
        let mut next: Vec<Vec<f64>> = Vec::with_capacity(m + 1);
        next.push(vec![1.0]);
        for j in 1..=m {
            let mut here = vec![0.0; i * j + 1];
            for (u, count) in next[j - 1].iter().enumerate() {
                here[u + i] += count;
            }
            for (u, count) in row[j].iter().enumerate() {
                here[u] += count;
            }
            next.push(here);
        }
        row = next;
    }
    row.swap_remove(m)
}

/// "median (min–max)" of the ratios, or a dash when there are none.
pub(super) fn ratio_summary(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "—".to_owned();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("×{:.3} (×{min:.3}–×{max:.3})", median(ratios))
}

#[cfg(test)]
mod tests {
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
}
