//! Keel's OpenTelemetry metrics. Counters and histograms are recorded on the hot path;
//! without an exporter recording is a flag check and nothing more.
//! Queue depth, oldest-job age and live workers are gauges over a snapshot that the
//! maintenance loop refreshes ([`observe_queue`]), so an export never queries the database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, Once};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

/// Whether an exporter is installed; the maintenance loop samples the queue only then.
static ENABLED: AtomicBool = AtomicBool::new(false);
static QUEUE: Mutex<Snapshot> = Mutex::new(Snapshot {
    kinds: Vec::new(),
    workers: 0,
});
static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(Instruments::new);

/// Seconds, from 5 ms to an hour: both HTTP requests and long jobs fit.
const SECONDS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

struct Snapshot {
    kinds: Vec<KindGauge>,
    workers: u64,
}

/// What the queue gauges report of one job kind.
#[derive(Debug, Clone)]
pub(crate) struct KindGauge {
    pub(crate) kind: String,
    /// Jobs waiting to be claimed.
    pub(crate) depth: i64,
    /// Age of the oldest due, unclaimed job.
    pub(crate) oldest_age_ms: Option<i64>,
}

struct Instruments {
    claims: Counter<u64>,
    lease_renewals: Counter<u64>,
    lease_losses: Counter<u64>,
    reclaims: Counter<u64>,
    queue_wait: Histogram<f64>,
    job_duration: Histogram<f64>,
    http_duration: Histogram<f64>,
}

fn meter() -> Meter {
    opentelemetry::global::meter("keel")
}

impl Instruments {
    fn new() -> Self {
        let meter = meter();
        let counter = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit("{job}")
                .with_description(description)
                .build()
        };
        let seconds = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(SECONDS.to_vec())
                .build()
        };
        Instruments {
            claims: counter("keel.claims", "Jobs claimed by workers"),
            lease_renewals: counter("keel.lease.renewals", "Leases extended by a heartbeat"),
            lease_losses: counter(
                "keel.lease.losses",
                "Leases a worker found lost while holding the job",
            ),
            reclaims: counter(
                "keel.reclaims",
                "Jobs taken back from a worker whose lease expired",
            ),
            queue_wait: seconds(
                "keel.job.wait",
                "Time from a job being due (enqueued) to its claim",
            ),
            job_duration: seconds("keel.job.duration", "Time a worker spent on one attempt"),
            http_duration: seconds("http.server.request.duration", "HTTP request duration"),
        }
    }
}

/// Called once an exporter is installed.
pub(super) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Registers the gauges over the queue snapshot: only in processes that sample the queue,
/// so an API process does not report figures it never reads.
fn register_gauges() {
    let meter = meter();
    meter
        .u64_observable_gauge("keel.queue.depth")
        .with_unit("{job}")
        .with_description("Jobs waiting to be claimed, per kind")
        .with_callback(|gauge| {
            for kind in &QUEUE.lock().unwrap().kinds {
                gauge.observe(kind.depth.max(0) as u64, &[kind_attribute(&kind.kind)]);
            }
        })
        .build();
    meter
        .f64_observable_gauge("keel.queue.oldest_age")
        .with_unit("s")
        .with_description("Age of the oldest due, unclaimed job, per kind")
        .with_callback(|gauge| {
            for kind in &QUEUE.lock().unwrap().kinds {
                let age = kind.oldest_age_ms.unwrap_or(0).max(0) as f64 / 1000.0;
                gauge.observe(age, &[kind_attribute(&kind.kind)]);
            }
        })
        .build();
    meter
        .u64_observable_gauge("keel.workers.alive")
        .with_unit("{worker}")
        .with_description("Workers whose registry heartbeat is recent")
        .with_callback(|gauge| gauge.observe(QUEUE.lock().unwrap().workers, &[]))
        .build();
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Replaces the snapshot the queue gauges report (registering them on first use).
pub(crate) fn observe_queue(kinds: Vec<KindGauge>, workers: u64) {
    static GAUGES: Once = Once::new();
    *QUEUE.lock().unwrap() = Snapshot { kinds, workers };
    GAUGES.call_once(register_gauges);
}

fn kind_attribute(kind: &str) -> KeyValue {
    KeyValue::new("kind", kind.to_string())
}

/// Records through the instruments only when exporting: without an exporter, not even the
/// attributes are built.
fn record(f: impl FnOnce(&Instruments)) {
    if enabled() {
        f(&INSTRUMENTS);
    }
}

pub(crate) fn claimed(kind: &str, queue_wait: Duration) {
    record(|i| {
        let attributes = [kind_attribute(kind)];
        i.claims.add(1, &attributes);
        i.queue_wait.record(queue_wait.as_secs_f64(), &attributes);
    });
}

pub(crate) fn leases_renewed(count: usize) {
    record(|i| i.lease_renewals.add(count as u64, &[]));
}

pub(crate) fn lease_lost(kind: &str) {
    record(|i| i.lease_losses.add(1, &[kind_attribute(kind)]));
}

pub(crate) fn reclaimed(kind: &str) {
    record(|i| i.reclaims.add(1, &[kind_attribute(kind)]));
}

/// One attempt ended; `outcome` is `completed`, `failed`, `retried`, `released`,
/// `interrupted`, `skipped`, `lease_lost` or `error`.
pub(crate) fn job_finished(kind: &str, outcome: &'static str, duration: Duration) {
    record(|i| {
        let attributes = [kind_attribute(kind), KeyValue::new("outcome", outcome)];
        i.job_duration.record(duration.as_secs_f64(), &attributes);
    });
}

pub(crate) fn http_request(method: &str, route: &str, status: u16, duration: Duration) {
    record(|i| {
        let attributes = [
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("http.route", route.to_string()),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ];
        i.http_duration.record(duration.as_secs_f64(), &attributes);
    });
}
