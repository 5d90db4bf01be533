//! What watching costs the push flood, measured within one flood (`openim-lab bench`, after
//! the push flood's rounds): one observer stays attached throughout, and the bench switches
//! its watching on and off by writing its `WATCHED_PORTS` map (the gateway ports' bits, or
//! none) between short phases of the same lab's flood, in pairs whose order alternates.
//!
//! Why besides the rounds of separate segments: a segment pair compares two starts of the
//! observer and two stretches of the machine seconds apart, and their ratios spread by ±10%
//! and more on this project's VMs, wider than the cost to be found. Phases of 1.5 s, side by
//! side and with nothing started or stopped between them, spread by about ±8% a pair, and 40
//! pairs give the cost to about ±2.5% (95%). What it leaves out is what attaching costs (every
//! program running and turning everything away), which an observer watching nothing measures
//! (`--grpc-port 9999 --ws-port 9998`): ×1.00 on the VMs here.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use aya::maps::{Array, Map, MapData, loaded_maps};

use crate::Lab;
use crate::bench::median;
use crate::lab::truth::FloodReport;

/// One phase of the flood, watching or not.
const PHASE: Duration = Duration::from_millis(1500);
/// The observer's map of watched ports (`observer-ebpf/src/maps.rs`), as the kernel names it.
const WATCHED_PORTS: &str = "WATCHED_PORTS";

/// The `WATCHED_PORTS` maps loaded now: taken before the observer starts, so that its own is
/// the one not among them.
pub fn watched_port_maps() -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for info in loaded_maps() {
        let info = info.context("list the loaded BPF maps")?;
        if info.name_as_str() == Some(WATCHED_PORTS) {
            ids.push(info.id());
        }
    }
    Ok(ids)
}

/// Switches one observer's watching: its `WATCHED_PORTS` words as it set them, or zero.
pub struct WatchSwitch {
    map: Array<MapData, u64>,
    /// The words the observer set (index, bits): the watched ports.
    watched: Vec<(u32, u64)>,
}

impl WatchSwitch {
    /// The switch of the observer that started after `before` was taken: its map is the one
    /// `WATCHED_PORTS` map not in `before`.
    pub fn find(before: &[u32]) -> anyhow::Result<Self> {
        let new: Vec<u32> = watched_port_maps()?
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        let [id] = new[..] else {
            bail!(
                "expected one new {WATCHED_PORTS} map after the observer started, found {}",
                new.len()
            );
        };
        let data = MapData::from_id(id).with_context(|| format!("open map {id}"))?;
        let map = Map::from_map_data(data).with_context(|| format!("map {id}"))?;
        let map: Array<MapData, u64> =
            Array::try_from(map).with_context(|| format!("map {id} as an array of u64"))?;
        let mut watched = Vec::new();
        for index in 0..map.len() {
            let word = map
                .get(&index, 0)
                .with_context(|| format!("read word {index}"))?;
            if word != 0 {
                watched.push((index, word));
            }
        }
        if watched.is_empty() {
            bail!("the observer's {WATCHED_PORTS} map holds no port");
        }
        Ok(Self { map, watched })
    }

    fn set(&mut self, watching: bool) -> anyhow::Result<()> {
        for &(index, word) in &self.watched {
            self.map
                .set(index, if watching { word } else { 0 }, 0)
                .with_context(|| format!("write word {index} of {WATCHED_PORTS}"))?;
        }
        Ok(())
    }
}

/// One pair of phases: the flood watched and not, in either order.
#[derive(Debug)]
struct Pair {
    watching: FloodReport,
    not_watching: FloodReport,
}

#[derive(Debug)]
pub struct WatchingCost {
    pairs: Vec<Pair>,
}

/// Runs `pairs` pairs of phases of `lab`'s push flood, one watched by the observer behind
/// `switch` and one not, the order alternating; leaves the observer watching.
pub async fn measure(
    lab: &mut Lab,
    switch: &mut WatchSwitch,
    pairs: usize,
) -> anyhow::Result<WatchingCost> {
    let mut measured = Vec::with_capacity(pairs);
    for pair in 0..pairs {
        if pair % 10 == 0 {
            eprintln!(
                "bench: watching on and off within one flood, pairs {}–{} of {pairs}",
                pair + 1,
                (pair + 10).min(pairs)
            );
        }
        let watching_first = pair % 2 == 0;
        switch.set(watching_first)?;
        let first = lab.push_flood(PHASE).await?;
        switch.set(!watching_first)?;
        let second = lab.push_flood(PHASE).await?;
        let (watching, not_watching) = if watching_first {
            (first, second)
        } else {
            (second, first)
        };
        measured.push(Pair {
            watching,
            not_watching,
        });
    }
    switch.set(true)?;
    Ok(WatchingCost { pairs: measured })
}

/// The two-sided 95% quantile of Student's t with `df` degrees of freedom (table values,
/// the next lower tabulated `df` for the ones between).
fn t_quantile_975(df: usize) -> f64 {
    const TABLE: [(usize, f64); 14] = [
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (4, 2.776),
        (5, 2.571),
        (6, 2.447),
        (7, 2.365),
        (8, 2.306),
        (9, 2.262),
        (10, 2.228),
        (15, 2.131),
        (20, 2.086),
        (30, 2.042),
        (60, 2.000),
    ];
    TABLE
        .iter()
        .rev()
        .find(|(at_least, _)| df >= *at_least)
        .map_or(f64::INFINITY, |(_, t)| *t)
}

/// The geometric mean of `ratios` and its 95% interval (t on the logarithms), or `None` for
/// fewer than two.
fn geometric_interval(ratios: &[f64]) -> Option<(f64, f64, f64)> {
    if ratios.len() < 2 || ratios.iter().any(|ratio| *ratio <= 0.0) {
        return None;
    }
    let logs: Vec<f64> = ratios.iter().map(|ratio| ratio.ln()).collect();
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    let variance = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half_width = t_quantile_975(logs.len() - 1) * (variance / n).sqrt();
    Some((
        mean.exp(),
        (mean - half_width).exp(),
        (mean + half_width).exp(),
    ))
}

impl WatchingCost {
    /// The section of the bench's report: the ratio of throughput watched to not, its interval
    /// and what the interval says about issue 13's goal (within noise: it holds ×1) and issue
    /// 4's target (at most `target_loss_percent`).
    pub fn render(&self, target_loss_percent: f64) -> String {
        let mut out = String::new();
        let throughput: Vec<f64> = self
            .pairs
            .iter()
            .map(|pair| pair.watching.pushes_per_second / pair.not_watching.pushes_per_second)
            .collect();
        let p99: Vec<f64> = self
            .pairs
            .iter()
            .map(|pair| pair.watching.p99_us as f64 / pair.not_watching.p99_us.max(1) as f64)
            .collect();
        let below = throughput.iter().filter(|ratio| **ratio < 1.0).count();
        let not_watching: Vec<f64> = self
            .pairs
            .iter()
            .map(|pair| pair.not_watching.pushes_per_second)
            .collect();
        let _ = writeln!(
            out,
            "\nwatching within one flood: the observer (packet hook) attached throughout, its ports watched and not in alternate phases of {:.1} s, {} pairs; not watching {:.0} pushes/s (median)",
            PHASE.as_secs_f64(),
            self.pairs.len(),
            median(&not_watching)
        );
        let Some((ratio, low, high)) = geometric_interval(&throughput) else {
            let _ = writeln!(out, "too few pairs for an interval");
            return out;
        };
        let noise = if high < 1.0 {
            "below noise (the interval is below ×1)"
        } else if low > 1.0 {
            "above noise (the interval is above ×1)"
        } else {
            "within noise (the interval holds ×1)"
        };
        let target = 1.0 - target_loss_percent / 100.0;
        let loss = if low >= target {
            format!("met (the interval is above ×{target:.2})")
        } else if high < target {
            format!("missed (the interval is below ×{target:.2})")
        } else {
            format!("inconclusive (the interval holds ×{target:.2})")
        };
        let _ = writeln!(
            out,
            "throughput watched / not: ×{ratio:.3} (95% interval ×{low:.3}–×{high:.3}, geometric mean of the pairs; {below} of {} pairs below ×1); p99 ×{:.3} (median of the pairs)",
            self.pairs.len(),
            median(&p99)
        );
        let _ = writeln!(
            out,
            "target: throughput within noise: {noise}; at most {target_loss_percent}% throughput loss: {loss}"
        );
        out
    }
}

#[cfg(test)]
mod tests {
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

    fn pair(watching: f64, not_watching: f64) -> Pair {
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
            watching: report(watching),
            not_watching: report(not_watching),
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
        };
        let text = noisy.render(3.0);
        assert!(text.contains("within noise: within noise"), "{text}");
        assert!(text.contains("loss: inconclusive"), "{text}");

        let one = WatchingCost {
            pairs: vec![pair(1900.0, 2000.0)],
        };
        assert!(one.render(3.0).contains("too few pairs"));
    }

    #[test]
    fn t_quantiles_come_from_the_table_rounding_df_down() {
        assert_eq!(t_quantile_975(0), f64::INFINITY);
        assert_eq!(t_quantile_975(1), 12.706);
        assert_eq!(t_quantile_975(12), 2.228);
        assert_eq!(t_quantile_975(39), 2.042);
        assert_eq!(t_quantile_975(1000), 2.000);
    }
}
