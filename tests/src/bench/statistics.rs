//! Judges the push flood's pairs: medians, ratios, verdicts only where noise cannot flip them, and
//! the rank test against the control's pairs.

/// Sets how many clean pairs a verdict needs at least: with fewer, their spread says nothing.
const MIN_PAIRS_FOR_VERDICT: usize = 3;
/// Sets how unlikely under noise alone a watcher's ratios must be to count as outside it.
const NOISE_SIGNIFICANCE: f64 = 0.05;

/// Returns the median of `values`.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        len if len % 2 == 1 => sorted[len / 2],
        len => (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0,
    }
}

/// Returns "within target" only when every clean pair is within, "over target" only when none is: a
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

/// Says whether a watcher's throughput ratios differ from the control's, which are what noise alone
/// does to a pair: a one-sided rank test each way (Mann–Whitney, exact), so a segment a burst on
/// the host slowed weighs as one rank, not by its size, as it would in a range or a mean. "below
/// noise" when the watcher's ratios rank lower than the control's with a probability of at most
/// `NOISE_SIGNIFICANCE` under noise alone, "above noise" when higher, "within noise" otherwise.
/// With too few pairs on either side, inconclusive.
pub(super) fn noise_verdict(ratios: &[f64], noise: &[f64]) -> String {
    if ratios.len() < MIN_PAIRS_FOR_VERDICT || noise.len() < MIN_PAIRS_FOR_VERDICT {
        return format!(
            "inconclusive: {} clean pairs and {} control pairs, a verdict needs \
            {MIN_PAIRS_FOR_VERDICT} of each",
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

/// Returns, were `first` and `second` drawn alike, the chance that `first` ranks at least this far
/// below `second`: the upper tail of the Mann–Whitney U, the pairs in which `first`'s value is the
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

/// Counts, for `n` values of one kind and `m` of another in a random order, how many of the
/// orderings give each U from 0 to n·m (U: the pairs whose first-kind value is the smaller). The
/// largest value is either of the second kind, above all `n` of the first (U gains `n`), or of the
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

/// Returns "median (min–max)" of the ratios, or a dash when there are none.
pub(super) fn ratio_summary(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "—".to_owned();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("×{:.3} (×{min:.3}–×{max:.3})", median(ratios))
}

#[cfg(test)]
mod tests;
