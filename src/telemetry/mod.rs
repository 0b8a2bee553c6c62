//! Logging and OpenTelemetry. One [`init`] installs the fmt layer (text or JSON), filtered
//! by `RUST_LOG` (default `info`), and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OTLP
//! export of traces (every `tracing` span) and metrics ([`metrics`]), configured by the
//! standard `OTEL_*` variables. With no endpoint there is no exporter, no export thread,
//! and the meters are the global no-op ones.

pub(crate) mod metrics;
mod propagation;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, MetricExporter, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::resource::{
    EnvResourceDetector, SdkProvidedResourceDetector, TelemetryResourceDetector,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

pub(crate) use propagation::{current_traceparent, set_remote_parent, trace_id};

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// The service name when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
const DEFAULT_SERVICE: &str = "keel";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] ExporterBuildError),
}

/// The installed exporters; dropping it flushes and stops them. Keep it alive for the
/// process's life, and drop it while the async runtime still runs (the gRPC exporter
/// needs it).
#[must_use]
pub struct Telemetry {
    exporters: Option<(SdkTracerProvider, SdkMeterProvider)>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some((tracer, meter)) = self.exporters.take() {
            // Nothing useful can be done about a failed final export at exit.
            let _ = tracer.shutdown();
            let _ = meter.shutdown();
        }
    }
}

/// Installs logging, and OTLP export when an endpoint is configured. `role` (`api`,
/// `worker` …) becomes the `keel.role` resource attribute.
pub fn init(format: LogFormat, role: &str) -> Result<Telemetry, TelemetryError> {
    let exporters = exporting().then(|| providers(role)).transpose()?;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colour only on a terminal: a log file or a collector keeps no escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    // Its own filter: a quiet RUST_LOG must not silently drop Keel's spans from traces.
    let traces = exporters.as_ref().map(|(tracer, _)| {
        let keel_spans = Targets::new()
            .with_default(Level::WARN)
            .with_target("keel", Level::INFO)
            .with_target("keel_workers", Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(tracer.tracer("keel"))
            .with_filter(keel_spans)
    });
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(traces)
        .try_init();
    if let Some((_, meter)) = &exporters {
        opentelemetry::global::set_meter_provider(meter.clone());
        metrics::enable();
    }
    Ok(Telemetry { exporters })
}

fn exporting() -> bool {
    std::env::var(ENDPOINT).is_ok_and(|v| !v.trim().is_empty())
}

/// Trace and metric pipelines; the exporters pick the transport from
/// `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf` by default, or `grpc`) and read the
/// endpoint, headers, timeout and export intervals from the standard variables.
fn providers(role: &str) -> Result<(SdkTracerProvider, SdkMeterProvider), TelemetryError> {
    let resource = resource(role);
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(SpanExporter::builder().build()?)
        .with_resource(resource.clone())
        .build();
    let meter = SdkMeterProvider::builder()
        .with_periodic_exporter(MetricExporter::builder().build()?)
        .with_resource(resource)
        .build();
    Ok((tracer, meter))
}

/// `service.name` is `OTEL_SERVICE_NAME`, else the one in `OTEL_RESOURCE_ATTRIBUTES`,
/// else `keel`: later merges win. Every process gets its own `service.instance.id`, so
/// the counters of several workers stay separate series rather than overwrite each other.
fn resource(role: &str) -> Resource {
    let builder = Resource::builder_empty()
        .with_detectors(&[Box::new(TelemetryResourceDetector)])
        .with_service_name(DEFAULT_SERVICE)
        .with_attribute(KeyValue::new(
            "service.instance.id",
            uuid::Uuid::now_v7().to_string(),
        ))
        .with_attribute(KeyValue::new("keel.role", role.to_string()))
        .with_detectors(&[Box::new(EnvResourceDetector::new())]);
    let builder = if std::env::var(SERVICE_NAME).is_ok_and(|v| !v.is_empty()) {
        builder.with_detectors(&[Box::new(SdkProvidedResourceDetector)])
    } else {
        builder
    };
    builder.build()
}
