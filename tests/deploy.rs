//! The deployment files: the Grafana dashboard queries only metrics Keel exports, and the
//! compose file wires the stack the way docs/operations.md says.

use std::path::Path;

use serde_json::Value;

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)).unwrap()
}

/// Metric names as Prometheus sees them after the collector's OTLP translation (dots to
/// underscores, unit and `_total` suffixes), for the metrics Keel exports.
const EXPORTED: [&str; 10] = [
    "keel_queue_depth",
    "keel_queue_oldest_age_seconds",
    "keel_job_wait_seconds",
    "keel_job_duration_seconds",
    "keel_claims_total",
    "keel_lease_renewals_total",
    "keel_lease_losses_total",
    "keel_reclaims_total",
    "keel_workers_alive",
    "http_server_request_duration_seconds",
];

/// The metric names a PromQL expression reads: label matchers (`{…}`) and grouping labels
/// (`by (…)`) are dropped first, then what remains that looks like a metric is one.
fn metric_names(expr: &str) -> Vec<String> {
    let mut selectors = String::new();
    let mut depth = 0;
    for c in expr.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => selectors.push(c),
            _ => {}
        }
    }
    for grouping in ["by (", "without ("] {
        while let Some(start) = selectors.find(grouping) {
            let end = start + selectors[start..].find(')').expect("a closed grouping");
            selectors.replace_range(start..=end, "");
        }
    }
    selectors
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("keel_") || word.starts_with("http_"))
        .map(|word| {
            word.trim_end_matches("_bucket")
                .trim_end_matches("_count")
                .to_string()
        })
        .collect()
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/keel.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut covered = std::collections::BTreeSet::new();
    for panel in panels {
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{} has no description",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{}: no metric in {expr}", panel["title"]);
            for name in names {
                assert!(
                    EXPORTED.contains(&name.as_str()),
                    "{}: {name} is not a metric Keel exports",
                    panel["title"]
                );
                covered.insert(name);
            }
        }
    }
    assert_eq!(
        covered.len(),
        EXPORTED.len(),
        "every exported metric has a panel: {covered:?}"
    );
}

/// The dashboard's names are the Prometheus forms of names the code really registers
/// (src/telemetry/metrics.rs): dots become underscores, then a unit or `_total` suffix.
#[test]
fn the_dashboards_metric_names_are_the_ones_the_code_registers() {
    let source = read("src/telemetry/metrics.rs");
    let registered: Vec<String> = source
        .split('"')
        .filter(|literal| literal.starts_with("keel.") || literal.starts_with("http.server."))
        .map(|name| name.replace('.', "_"))
        .collect();
    for exported in EXPORTED {
        let base = exported
            .trim_end_matches("_total")
            .trim_end_matches("_seconds");
        assert!(
            registered.iter().any(|r| r == base),
            "{exported} matches no metric in the code: {registered:?}"
        );
    }
}

#[test]
fn the_compose_stack_is_wired_as_documented() {
    let compose = read("docker-compose.yml");
    for service in [
        "postgres:",
        "migrate:",
        "api:",
        "worker:",
        "otel-collector:",
        "grafana:",
    ] {
        assert!(
            compose.contains(&format!("\n  {service}")),
            "no {service} service"
        );
    }
    for needle in [
        "pg_isready",                                // postgres health check
        "condition: service_healthy",                // migrate waits for postgres
        "condition: service_completed_successfully", // api and workers wait for migrate
        "http://127.0.0.1:8420/healthz",             // api health check
        "pgdata:/var/lib/postgresql/data",           // a named volume
        "OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector:4318",
    ] {
        assert!(
            compose.contains(needle),
            "docker-compose.yml lacks {needle}"
        );
    }
    let worker = &compose
        [compose.find("\n  worker:").unwrap()..compose.find("\n  otel-collector:").unwrap()];
    let fixed = worker
        .lines()
        .any(|l| l.trim_start().starts_with("ports:") || l.contains("container_name"));
    assert!(
        !fixed,
        "workers must scale by count: no fixed ports or names"
    );
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("USER keel") && dockerfile.matches("FROM ").count() == 2);
}
