//! OTLP export from real `keel api` and `keel worker` processes, received by a local OTLP
//! receiver built on the official protobuf definitions: one trace spans the API request, the
//! claim and the execution across processes, and the metrics arrive, over OTLP/HTTP and
//! OTLP/gRPC.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Client, KeelProcess, spawn_api_with_env, spawn_worker_with_env, wait_for};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use keel_client::{MediaJobRecord, ProviderView, RunRecord, RunStatus};
use nix::sys::signal::Signal;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const LONG: Duration = Duration::from_secs(60);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

/// A received span, flattened with the `keel.role` of the process that sent it.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    role: String,
    resource: HashMap<String, String>,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    /// Metric name → roles of the processes that exported it.
    metrics: HashMap<String, HashSet<String>>,
}

type Shared = Arc<Mutex<Received>>;

/// How the processes export, and so how the receiver listens.
#[derive(Clone, Copy)]
enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }
}

/// Serves OTLP on a free local port: `POST /v1/traces` and `POST /v1/metrics` with binary
/// protobuf bodies, or the gRPC trace and metrics services (h2c). Returns its base URL and
/// what it received.
async fn start_receiver(protocol: Protocol) -> (String, Shared) {
    let received = Shared::default();
    let app = match protocol {
        Protocol::Http => Router::new()
            .route("/v1/traces", post(http_traces))
            .route("/v1/metrics", post(http_metrics))
            .with_state(received.clone()),
        Protocol::Grpc => Router::new()
            .route_service(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                TraceServiceServer::new(GrpcReceiver(received.clone())),
            )
            .route_service(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                MetricsServiceServer::new(GrpcReceiver(received.clone())),
            ),
    };
    (support::serve_on_loopback(app).await, received)
}

async fn http_traces(State(received): State<Shared>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    record_traces(&received, request);
    Vec::new()
}

async fn http_metrics(State(received): State<Shared>, body: Bytes) -> Vec<u8> {
    let request = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics export");
    record_metrics(&received, request);
    Vec::new()
}

struct GrpcReceiver(Shared);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record_traces(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        record_metrics(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn resource(
    resource: &Option<opentelemetry_proto::tonic::resource::v1::Resource>,
) -> HashMap<String, String> {
    attributes(resource.as_ref().map_or(&[][..], |r| &r.attributes))
}

fn role(resource: &HashMap<String, String>) -> String {
    resource.get("keel.role").cloned().unwrap_or_default()
}

fn record_traces(received: &Shared, request: ExportTraceServiceRequest) {
    let mut received = received.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = resource(&resource_spans.resource);
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            received.spans.push(ReceivedSpan {
                role: role(&resource),
                resource: resource.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes: attributes(&span.attributes),
            });
        }
    }
}

fn record_metrics(received: &Shared, request: ExportMetricsServiceRequest) {
    let mut received = received.lock().unwrap();
    for resource_metrics in request.resource_metrics {
        let role = role(&resource(&resource_metrics.resource));
        for metric in resource_metrics
            .scope_metrics
            .into_iter()
            .flat_map(|s| s.metrics)
        {
            received
                .metrics
                .entry(metric.name)
                .or_default()
                .insert(role.clone());
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Environment for a process exporting to `endpoint` quickly.
fn otel_env(endpoint: &str, protocol: Protocol) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.name().into()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500".into()),
        ("OTEL_SERVICE_NAME", "keel-test".into()),
        // Quiet logs must not thin the traces.
        ("RUST_LOG", "warn".into()),
    ]
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `keel api` and workers on a fresh database, exporting to a local receiver.
struct Deployment {
    api: KeelProcess,
    workers: Vec<KeelProcess>,
    received: Shared,
    endpoint: String,
    protocol: Protocol,
    db_url: String,
    dirs: tempfile::TempDir,
    /// Set in every process beside the OTLP settings.
    extra_env: Vec<(&'static str, String)>,
}

impl Deployment {
    async fn start(protocol: Protocol, workers: usize, lease_ms: u64) -> Deployment {
        Self::start_with(protocol, workers, lease_ms, Vec::new()).await
    }

    async fn start_with(
        protocol: Protocol,
        workers: usize,
        lease_ms: u64,
        extra_env: Vec<(&'static str, String)>,
    ) -> Deployment {
        let (endpoint, received) = start_receiver(protocol).await;
        let db_url = support::fresh_database().await;
        let dirs = tempfile::tempdir().unwrap();
        let mut env = otel_env(&endpoint, protocol);
        env.extend(extra_env.iter().cloned());
        let api = spawn_api_with_env(&db_url, dirs.path(), "api", &borrowed(&env)).await;
        let mut keel = Deployment {
            api,
            workers: Vec::new(),
            received,
            endpoint,
            protocol,
            db_url,
            dirs,
            extra_env,
        };
        for _ in 0..workers {
            keel.add_worker(lease_ms);
        }
        keel
    }

    fn add_worker(&mut self, lease_ms: u64) {
        let mut env = otel_env(&self.endpoint, self.protocol);
        env.extend(self.extra_env.iter().cloned());
        let name = format!("worker{}", self.workers.len());
        let worker = spawn_worker_with_env(
            &self.db_url,
            self.dirs.path(),
            &name,
            lease_ms,
            self.dirs.path(),
            &borrowed(&env),
        );
        self.workers.push(worker);
    }

    fn client(&self) -> &Client {
        self.api.client.as_ref().unwrap()
    }

    /// Waits until every metric in `names` was exported; on timeout, says what arrived.
    async fn wait_for_metrics(&self, names: &[&str]) {
        let deadline = std::time::Instant::now() + LONG;
        loop {
            let received = self.received.lock().unwrap().metrics.clone();
            if names.iter().all(|name| received.contains_key(*name)) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for the metrics {names:?}; received {received:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Starts a shell task with the caller's `traceparent`; returns (task id, run id).
async fn start_traced(client: &Client, command: &str) -> (String, String) {
    let task_id = client.create_task(&support::shell(command)).await.id;
    let request = client
        .http
        .post(format!("{}/v1/tasks/{task_id}/start", client.base))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01"))
        .json(&json!({}));
    let (status, run) = client.send(request).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{run}");
    (task_id, support::record::<RunRecord>(&run).id)
}

/// The spans of the trace from `span_id` up to its root, as far as they were received.
fn ancestry(spans: &[ReceivedSpan], span_id: &str) -> Vec<ReceivedSpan> {
    let by_id: HashMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let mut chain = Vec::new();
    let mut next = by_id.get(span_id);
    while let Some(span) = next {
        chain.push((*span).clone());
        next = by_id.get(span.parent_span_id.as_str());
    }
    chain
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_api_request_through_the_queue_into_the_worker() {
    // Long enough for a lease renewal (every lease/3).
    let keel = Deployment::start(Protocol::Http, 1, 3_000).await;
    let client = keel.client();
    let (task_id, run_id) = start_traced(client, "sleep 2.5; echo traced").await;
    let run = client.wait_terminal(&task_id, &run_id, LONG).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    let chain = wait_for(
        LONG,
        "the worker's run_job span and its ancestry",
        || async {
            let received = keel.received.lock().unwrap();
            let job = received
                .spans
                .iter()
                .find(|s| s.name == "run_job" && s.attributes.get("run_id") == Some(&run_id))?;
            let chain = ancestry(&received.spans, &job.span_id);
            chain
                .last()
                .is_some_and(|root| root.role == "api")
                .then_some(chain)
        },
    )
    .await;
    let names: Vec<_> = chain
        .iter()
        .map(|s| (s.role.as_str(), s.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("worker", "run_job"),
            ("worker", "claim"),
            ("api", "POST /v1/tasks/{task_id}/start")
        ],
        "{chain:#?}"
    );
    assert!(chain.iter().all(|s| s.trace_id == TRACE_ID), "{chain:#?}");
    let request = chain.last().unwrap();
    assert_eq!(
        request.parent_span_id, CALLER_SPAN_ID,
        "the caller's span is the parent"
    );
    assert_eq!(
        request.attributes["http.route"],
        "/v1/tasks/{task_id}/start"
    );
    assert_eq!(request.attributes["http.response.status_code"], "201");
    assert!(request.attributes.contains_key("request_id"));
    assert_eq!(chain[0].attributes["outcome"], "completed");
    let (worker, api) = (&chain[0].resource, &request.resource);
    assert_eq!(
        worker["service.name"], "keel-test",
        "OTEL_SERVICE_NAME is honoured"
    );
    assert_ne!(
        worker["service.instance.id"], api["service.instance.id"],
        "every process is its own instance"
    );

    keel.wait_for_metrics(&[
        "http.server.request.duration",
        "keel.claims",
        "keel.job.wait",
        "keel.job.duration",
        "keel.lease.renewals",
        "keel.queue.depth",
        "keel.queue.oldest_age",
        "keel.workers.alive",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_envelopes_carry_the_trace_id() {
    let keel = Deployment::start(Protocol::Http, 0, 5_000).await;
    let client = keel.client();
    let request = client
        .http
        .get(format!("{}/v1/tasks/task_missing", client.base))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01"));
    let (status, body) = client.send(request).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["trace_id"], TRACE_ID, "{body}");
    assert!(body["error"]["request_id"].is_string(), "{body}");
}

/// Each HTTP call a media job makes to its vendor is a client span inside the job's span,
/// in the trace of the request that ran the job, with no query string or credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vendor_calls_are_client_spans_inside_the_media_job() {
    let vendor = MockServer::start().await;
    let image = format!("{}/files/out.png?signature=not-for-traces", vendor.uri());
    Mock::given(method("POST"))
        .and(path("/api/v3/images/generations"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "model": "seedream-model", "created": 1, "data": [{ "url": image }],
        })))
        .mount(&vendor)
        .await;
    Mock::given(method("GET"))
        .and(path("/files/out.png"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(&b"\x89PNG\r\n\x1a\nimage"[..], "image/png"),
        )
        .mount(&vendor)
        .await;
    let env = vec![
        (
            "KEEL_SECRET_TEST_VENDOR_KEY",
            "sk-telemetry-test".to_string(),
        ),
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "true".to_string()),
        ("KEEL_PROVIDER_HOSTS", "127.0.0.1".to_string()),
    ];
    let keel = Deployment::start_with(Protocol::Http, 1, 5_000, env).await;
    let client = keel.client();
    let (status, provider) = client
        .post(
            "/v1/providers",
            json!({ "kind": "seedream", "model": "seedream-model", "api": "media-job",
                    "base_url": format!("{}/api/v3", vendor.uri()),
                    "api_key_ref": "env:KEEL_SECRET_TEST_VENDOR_KEY",
                    "capabilities": ["image_generate"], "enabled": true }),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{provider}");
    let provider_id = support::record::<ProviderView>(&provider).id;
    let (status, job) = client
        .post(
            "/v1/media-jobs",
            json!({ "provider_id": provider_id, "operation": "image_generate",
                    "prompt": "a lighthouse" }),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{job}");
    let id = support::record::<MediaJobRecord>(&job).id;
    let request = client
        .http
        .post(format!("{}/v1/media-jobs/{id}/run", client.base))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01"));
    let (status, body) = client.send(request).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body}");

    let calls = wait_for(LONG, "two vendor_call spans", || async {
        let received = keel.received.lock().unwrap();
        let calls: Vec<_> = received
            .spans
            .iter()
            .filter(|s| s.name == "vendor_call" && s.trace_id == TRACE_ID)
            .map(|s| ancestry(&received.spans, &s.span_id))
            .collect();
        (calls.len() == 2
            && calls
                .iter()
                .all(|c| c.last().is_some_and(|r| r.role == "api")))
        .then_some(calls)
    })
    .await;
    for chain in &calls {
        let names: Vec<_> = chain.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vendor_call",
                "media_job",
                "claim",
                "POST /v1/media-jobs/{media_job_id}/run"
            ],
            "{chain:#?}"
        );
        let call = &chain[0].attributes;
        assert_eq!(call["http.response.status_code"], "200", "{call:?}");
        assert_eq!(call["server.address"], "127.0.0.1", "{call:?}");
        assert!(
            call.values()
                .all(|v| !v.contains("signature") && !v.contains("sk-telemetry")),
            "{call:?}"
        );
    }
    let methods: HashSet<(String, String)> = calls
        .iter()
        .map(|c| {
            (
                c[0].attributes["http.request.method"].clone(),
                c[0].attributes["url.path"].clone(),
            )
        })
        .collect();
    let expected = [("POST", "/api/v3/images/generations"), ("GET", "")];
    let expected = expected.map(|(m, p)| (m.to_string(), p.to_string()));
    assert_eq!(methods, HashSet::from(expected));
}

/// A worker paused past its lease loses it; another worker reclaims the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_losses_and_reclaims_are_counted() {
    let lease_ms = 1_500;
    let mut keel = Deployment::start(Protocol::Http, 1, lease_ms).await;
    let (task_id, run_id) = start_traced(keel.client(), "sleep 30").await;
    let first = keel
        .client()
        .wait_status(&task_id, &run_id, RunStatus::Running, LONG)
        .await;
    // Once its step is written the attempt has made its last fenced write and only waits
    // on `sleep`: on waking, its heartbeat (not a fenced write) is what finds the lease
    // gone. (A renewal alone says nothing: the first heartbeat runs, renewing nothing,
    // as the worker starts.)
    wait_for(LONG, "the attempt's step to be written", || async {
        let steps = keel.client().api.list_steps(&task_id, &run_id).await;
        steps
            .is_ok_and(|steps| !steps.data.is_empty())
            .then_some(())
    })
    .await;
    keel.wait_for_metrics(&["keel.lease.renewals"]).await;
    keel.workers[0].signal(Signal::SIGSTOP);
    keel.add_worker(lease_ms);
    wait_for(LONG, "another worker to reclaim the run", || async {
        let run = keel.client().run(&task_id, &run_id).await;
        (run.status == RunStatus::Running && run.worker_id != first.worker_id).then_some(())
    })
    .await;
    // Its next heartbeat finds the lease gone.
    keel.workers[0].signal(Signal::SIGCONT);
    keel.wait_for_metrics(&["keel.reclaims", "keel.lease.losses"])
        .await;
}

/// The same cross-process trace and metrics over OTLP/gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_export_carries_the_same_trace_and_metrics() {
    let keel = Deployment::start(Protocol::Grpc, 1, 5_000).await;
    let client = keel.client();
    let (task_id, run_id) = start_traced(client, "echo traced").await;
    client.wait_terminal(&task_id, &run_id, LONG).await;
    wait_for(LONG, "the worker's run_job span over gRPC", || async {
        let received = keel.received.lock().unwrap();
        received
            .spans
            .iter()
            .any(|s| s.name == "run_job" && s.role == "worker" && s.trace_id == TRACE_ID)
            .then_some(())
    })
    .await;
    keel.wait_for_metrics(&["http.server.request.duration", "keel.job.duration"])
        .await;
}
