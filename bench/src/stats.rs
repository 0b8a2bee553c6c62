//! Small statistics shared by the figures: rates and percentiles, computed the way the
//! peer harness computes them so the two sides compare like for like.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// N jobs drained in `seconds`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Throughput {
    pub jobs: usize,
    pub seconds: f64,
    pub jobs_per_s: f64,
}

impl Throughput {
    pub fn new(jobs: usize, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Throughput {
            jobs,
            seconds,
            jobs_per_s: jobs as f64 / seconds,
        }
    }
}

/// A latency distribution in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// None when there is no sample.
    pub fn of(waits: &[Duration]) -> Option<Self> {
        let mut ms: Vec<f64> = waits.iter().map(|w| w.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Some(Latency {
            samples: ms.len(),
            p50_ms: percentile(&ms, 50.0)?,
            p99_ms: percentile(&ms, 99.0)?,
            max_ms: *ms.last()?,
        })
    }
}

/// The peer harness's nearest-rank percentile: `sorted[floor(p/100 · n)]`, clamped.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let index = ((p / 100.0) * sorted.len() as f64).floor() as usize;
    sorted.get(index.min(sorted.len().checked_sub(1)?)).copied()
}

/// The median of some values (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_the_peer_harness() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(51.0));
        assert_eq!(percentile(&sorted, 99.0), Some(100.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
