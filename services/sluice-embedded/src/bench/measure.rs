//! What a pass measured: CPU time from `/proc`, latency percentiles, and ledger round trips
//! per effect.

use super::*;

/// The CPU time this process has used so far, all threads, user and system, to the kernel's
/// 10 ms tick.
///
/// Read from `/proc/self/stat` rather than the process CPU clock: the vDSO lookup behind that
/// clock crashes under valgrind, and `scripts/bench-instructions.sh` runs the bench there.
pub(super) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_of_stat(&stat)
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The fields after the command name (which may
/// hold spaces and parentheses, hence the last `)`) start at the state, field 3; utime and
/// stime are fields 14 and 15, in USER_HZ ticks (100 per second on Linux, whatever the kernel's
/// own tick).
pub(super) fn cpu_of_stat(stat: &str) -> Option<Duration> {
    const TICKS_PER_SECOND: u64 = 100;
    let (_, fields) = stat.rsplit_once(')')?;
    let mut fields = fields.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1_000 / TICKS_PER_SECOND,
    ))
}

/// Throughput and latency percentiles of a finished pass.
pub(super) fn summarize(
    pass: &str,
    submission: &Submission,
    tracker: &Tracker,
    submit_secs: f64,
    cpu: Option<Duration>,
) -> PassResult {
    let mut latencies: Vec<u64> = Vec::with_capacity(tracker.sent.len());
    let (mut first_sent, mut last_confirmed) = (u64::MAX, 0);
    for (sent, confirmed) in tracker.sent.iter().zip(&tracker.confirmed) {
        let (sent, confirmed) = (
            sent.load(Ordering::Relaxed),
            confirmed.load(Ordering::Relaxed),
        );
        if sent == 0 || confirmed == 0 {
            continue;
        }
        first_sent = first_sent.min(sent);
        last_confirmed = last_confirmed.max(confirmed);
        latencies.push(confirmed.saturating_sub(sent));
    }
    latencies.sort_unstable();
    let secs = last_confirmed.saturating_sub(first_sent) as f64 / 1e9;
    let ms = |nanos: u64| nanos as f64 / 1e6;
    PassResult {
        pass: pass.to_owned(),
        effects: latencies.len(),
        offered_per_sec: match submission {
            Submission::Paced { rate, .. } => Some(*rate),
            Submission::Single | Submission::Batch => None,
        },
        submit_secs,
        secs,
        confirmed_per_sec: if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        },
        p50_ms: ms(percentile(&latencies, 0.50)),
        p99_ms: ms(percentile(&latencies, 0.99)),
        max_ms: ms(latencies.last().copied().unwrap_or(0)),
        cpu_us_per_effect: cpu
            .filter(|_| !latencies.is_empty())
            .map(|cpu| cpu.as_secs_f64() * 1e6 / latencies.len() as f64),
        round_trips_per_effect: BTreeMap::new(),
        lwt_per_effect_by_op: BTreeMap::new(),
        plain_per_effect_by_op: BTreeMap::new(),
        bus_per_effect: BTreeMap::new(),
        deferred_503: tracker.deferred.load(Ordering::Relaxed),
    }
}

/// Divides the pass's ledger round trips (a fresh ledger handle per pass) by its effects.
pub(super) fn count_round_trips(result: &mut PassResult, trips: Vec<sluice_ledger::RoundTrips>) {
    let effects = result.effects.max(1) as f64;
    for trip in trips {
        *result.round_trips_per_effect.entry(trip.kind).or_default() += trip.count as f64 / effects;
        let by_op = match trip.kind {
            "lwt" => &mut result.lwt_per_effect_by_op,
            "plain" => &mut result.plain_per_effect_by_op,
            _ => continue,
        };
        *by_op.entry(trip.op).or_default() += trip.count as f64 / effects;
    }
}

/// Divides the pass's bus messages (a fresh bus handle per pass), published and fetched, by
/// its effects, per topic. Fetched counts every consumer group of the pipeline's process and
/// the bench's own reader of `events`.
pub(super) fn count_bus_messages(
    result: &mut PassResult,
    traffic: Option<sluice_bus::TrafficCounts>,
) {
    let Some(traffic) = traffic else {
        return;
    };
    let effects = result.effects.max(1) as f64;
    for topic in [
        Topic::Requested,
        Topic::Unknown,
        Topic::Compensate,
        Topic::Events,
        Topic::Dlq,
    ] {
        let (published, fetched) = (
            traffic.published[topic.index()],
            traffic.fetched[topic.index()],
        );
        if published + fetched > 0 {
            result.bus_per_effect.insert(
                topic.suffix(),
                (published as f64 / effects, fetched as f64 / effects),
            );
        }
    }
}

/// The nearest-rank percentile of sorted `values` (0 when empty).
pub(super) fn percentile(sorted: &[u64], quantile: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_from_the_stat_line() {
        // A command name with spaces and a parenthesis, as `/proc` may show it.
        let stat = "4242 (sluice (x) y) R 1 4242 4242 0 -1 4194304 900 0 0 0 \
                    1234 56 0 0 20 0 3 0 100 0 0";
        assert_eq!(cpu_of_stat(stat), Some(Duration::from_millis(12_900)));
        assert_eq!(cpu_of_stat("4242 (short) R 1"), None);
        // Spinning shows up as CPU time within a few ticks, however busy the machine.
        let spent = process_cpu().expect("this process's stat");
        let started = std::time::Instant::now();
        let mut spins = 0_u64;
        loop {
            spins = std::hint::black_box(spins + 1);
            let now = process_cpu().expect("this process's stat");
            if now >= spent + Duration::from_millis(20) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "10 s of spinning and the CPU time stayed at {now:?} from {spent:?}"
            );
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.50), 50);
        assert_eq!(percentile(&values, 0.99), 99);
        assert_eq!(percentile(&values, 1.0), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
