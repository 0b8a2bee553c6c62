//! The route policy: one table classifies every route. The middleware looks up the route
//! axum matched; a route missing from the table is refused, so a new route is closed until
//! someone decides what it may do (and `tests/it/auth.rs` fails until they do).

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// Liveness and readiness probes, the reference page and the console's static assets:
    /// no credentials and no Host check (orchestrators probe pod IPs), and nothing they
    /// serve is a workspace's. The console's session endpoints are open too and check the
    /// Host and the credentials themselves (signing in is how a browser gets credentials).
    Open,
    /// Needs an identity; acts only inside the caller's workspace and the data directory.
    RemoteSafe,
    /// Acts on the host outside the data directory: only from a loopback peer, with no
    /// proxy in between, and never in remote mode.
    LocalOnly,
}

use RouteClass::{LocalOnly, Open, RemoteSafe};

/// Every route: method, path template (as axum and the OpenAPI document spell it), class.
pub const ROUTE_POLICY: &[(&str, &str, RouteClass)] = &[
    ("GET", "/healthz", Open),
    ("GET", "/readyz", Open),
    ("GET", "/docs", Open),
    ("GET", "/", Open),
    ("GET", "/console", Open),
    ("GET", "/console/assets/{*path}", Open),
    ("GET", "/console/session", Open),
    ("POST", "/console/session", Open),
    ("DELETE", "/console/session", Open),
    // Holders of the runtime token only (`keel console`); the handler refuses remote mode.
    ("POST", "/console/sign-in-codes", RemoteSafe),
    ("GET", "/v1/openapi.json", RemoteSafe),
    ("GET", "/v1/whoami", RemoteSafe),
    ("POST", "/v1/system/shutdown", LocalOnly),
    ("GET", "/v1/system/stats", RemoteSafe),
    ("GET", "/v1/system/throughput", RemoteSafe),
    ("GET", "/v1/state-transitions", RemoteSafe),
    ("GET", "/v1/runtime/leases", RemoteSafe),
    ("GET", "/v1/workspace", RemoteSafe),
    // Operators only (the handler refuses other callers): a workspace cannot raise its own
    // limit or lift its own approval gates.
    ("GET", "/v1/workspaces/{workspace_id}/limits", RemoteSafe),
    ("PUT", "/v1/workspaces/{workspace_id}/limits", RemoteSafe),
    (
        "GET",
        "/v1/workspaces/{workspace_id}/approval-policy",
        RemoteSafe,
    ),
    (
        "PUT",
        "/v1/workspaces/{workspace_id}/approval-policy",
        RemoteSafe,
    ),
    (
        "DELETE",
        "/v1/workspaces/{workspace_id}/approval-policy",
        RemoteSafe,
    ),
    ("GET", "/v1/approvals", RemoteSafe),
    ("GET", "/v1/events", RemoteSafe),
    ("GET", "/v1/events/stream", RemoteSafe),
    ("GET", "/v1/external-work/actions", RemoteSafe),
    ("GET", "/v1/external-work/actions/{action_id}", RemoteSafe),
    (
        "POST",
        "/v1/external-work/actions/{action_id}/execute",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/external-work/actions/{action_id}/cancel",
        RemoteSafe,
    ),
    ("GET", "/v1/external-work/items", RemoteSafe),
    (
        "POST",
        "/v1/external-work/items/{item_id}/ci-triage",
        RemoteSafe,
    ),
    ("GET", "/v1/external-work/ci-triage", RemoteSafe),
    (
        "GET",
        "/v1/external-work/ci-triage/scans/{scan_id}",
        RemoteSafe,
    ),
    ("GET", "/v1/external-work/ci-triage/{triage_id}", RemoteSafe),
    (
        "POST",
        "/v1/external-work/ci-triage/{triage_id}/run",
        RemoteSafe,
    ),
    ("POST", "/v1/external-work/import", RemoteSafe),
    ("GET", "/v1/external-work/items/{item_id}", RemoteSafe),
    (
        "GET",
        "/v1/external-work/items/{item_id}/actions",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/external-work/items/{item_id}/actions",
        RemoteSafe,
    ),
    ("POST", "/v1/external-work/render", RemoteSafe),
    ("GET", "/v1/external-work/sources", RemoteSafe),
    ("POST", "/v1/external-work/sources", RemoteSafe),
    ("GET", "/v1/external-work/sources/{source_id}", RemoteSafe),
    (
        "DELETE",
        "/v1/external-work/sources/{source_id}",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/background",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/external-work/sources/{source_id}/items",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/poll",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/reconcile",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/external-work/sources/{source_id}/status",
        RemoteSafe,
    ),
    ("GET", "/v1/media-jobs", RemoteSafe),
    ("POST", "/v1/media-jobs", RemoteSafe),
    ("GET", "/v1/media-jobs/{media_job_id}", RemoteSafe),
    ("GET", "/v1/media-jobs/{media_job_id}/artifacts", RemoteSafe),
    (
        "GET",
        "/v1/media-jobs/{media_job_id}/artifacts/{artifact_id}/content",
        RemoteSafe,
    ),
    ("POST", "/v1/media-jobs/{media_job_id}/cancel", RemoteSafe),
    ("POST", "/v1/media-jobs/{media_job_id}/run", RemoteSafe),
    ("GET", "/v1/provider-templates", RemoteSafe),
    ("GET", "/v1/providers", RemoteSafe),
    ("POST", "/v1/providers", RemoteSafe),
    ("GET", "/v1/providers/{id}", RemoteSafe),
    ("PATCH", "/v1/providers/{id}", RemoteSafe),
    ("DELETE", "/v1/providers/{id}", RemoteSafe),
    ("POST", "/v1/providers/{id}/check", RemoteSafe),
    ("GET", "/v1/secrets/status", RemoteSafe),
    ("GET", "/v1/runs", RemoteSafe),
    ("GET", "/v1/usage/events", RemoteSafe),
    ("GET", "/v1/usage/summary", RemoteSafe),
    ("GET", "/v1/task-schedules", RemoteSafe),
    ("GET", "/v1/tasks", RemoteSafe),
    ("POST", "/v1/tasks", RemoteSafe),
    ("GET", "/v1/tasks/{task_id}", RemoteSafe),
    ("DELETE", "/v1/tasks/{task_id}", RemoteSafe),
    ("GET", "/v1/tasks/{task_id}/artifacts", RemoteSafe),
    ("GET", "/v1/tasks/{task_id}/approvals", RemoteSafe),
    (
        "GET",
        "/v1/tasks/{task_id}/approvals/{approval_id}",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/approvals/{approval_id}/resolve",
        RemoteSafe,
    ),
    ("GET", "/v1/tasks/{task_id}/runs", RemoteSafe),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}", RemoteSafe),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/artifacts",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}/content",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/cancel",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/patches",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/revert",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/apply",
        RemoteSafe,
    ),
    ("POST", "/v1/tasks/{task_id}/client-runs", RemoteSafe),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/events",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/discard",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/events",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/continue",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/resume",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/retry-from-model-call",
        RemoteSafe,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/retry",
        RemoteSafe,
    ),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/steps", RemoteSafe),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/transcript",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/context",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/steps/{step_id}",
        RemoteSafe,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/stream",
        RemoteSafe,
    ),
    ("GET", "/v1/tasks/{task_id}/schedule", RemoteSafe),
    ("PUT", "/v1/tasks/{task_id}/schedule", RemoteSafe),
    ("DELETE", "/v1/tasks/{task_id}/schedule", RemoteSafe),
    (
        "GET",
        "/v1/tasks/{task_id}/schedule/occurrences",
        RemoteSafe,
    ),
    ("POST", "/v1/tasks/{task_id}/start", RemoteSafe),
];

/// The routes outside the OpenAPI document: pages for people (the reference page and the
/// console), not the API. Every other row of [`ROUTE_POLICY`] is a documented operation.
pub const PAGE_ROUTES: &[(&str, &str)] = &[
    ("GET", "/docs"),
    ("GET", "/"),
    ("GET", "/console"),
    ("GET", "/console/assets/{*path}"),
    ("GET", "/console/session"),
    ("POST", "/console/session"),
    ("DELETE", "/console/session"),
    ("POST", "/console/sign-in-codes"),
];

/// What the table says about a matched route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    Class(RouteClass),
    /// The path is in the table, with other methods: a wrong method, answered 405.
    OtherMethod,
    /// The path is not in the table at all: refused.
    Unclassified,
}

/// The class of `method` on the matched path template (HEAD is served by GET handlers).
pub(crate) fn classify(method: &Method, path: &str) -> Lookup {
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    let mut on_path = ROUTE_POLICY
        .iter()
        .filter(|(_, p, _)| *p == path)
        .peekable();
    if on_path.peek().is_none() {
        return Lookup::Unclassified;
    }
    on_path
        .find(|(m, _, _)| *m == method)
        .map_or(Lookup::OtherMethod, |(_, _, class)| Lookup::Class(*class))
}

/// The local-only routes, as `METHOD /path`.
pub(crate) fn local_only_actions() -> Vec<String> {
    ROUTE_POLICY
        .iter()
        .filter(|(_, _, class)| *class == LocalOnly)
        .map(|(method, path, _)| format!("{method} {path}"))
        .collect()
}

/// Whether a request may use local-only routes: local mode, a loopback peer, and no sign
/// of a proxy in between (a proxy on the same host would make every peer loopback).
pub(crate) fn local_access(
    remote_mode: bool,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
) -> bool {
    let proxied = headers.keys().any(|name| {
        let name = name.as_str();
        name == "forwarded" || name.starts_with("x-forwarded-")
    });
    !remote_mode && !proxied && peer.is_some_and(|peer| peer.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// The table and the OpenAPI document name the same routes (the router is built from
    /// the document's annotations; the pages are the routes outside it).
    #[test]
    fn the_table_classifies_every_documented_route_and_nothing_else() {
        let mut documented = crate::api::documented_routes();
        let mut table: Vec<(String, String)> = ROUTE_POLICY
            .iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        table.sort();
        assert_eq!(table, documented);
    }

    #[test]
    fn lookups_know_wrong_methods_from_unknown_paths() {
        assert_eq!(
            classify(&Method::HEAD, "/v1/tasks"),
            Lookup::Class(RemoteSafe)
        );
        assert_eq!(classify(&Method::PUT, "/v1/tasks"), Lookup::OtherMethod);
        assert_eq!(classify(&Method::GET, "/v1/nowhere"), Lookup::Unclassified);
        assert_eq!(
            local_only_actions(),
            vec!["POST /v1/system/shutdown".to_string()]
        );
    }

    #[test]
    fn local_access_needs_local_mode_a_loopback_peer_and_no_proxy() {
        let loopback = Some("127.0.0.1:5000".parse().unwrap());
        let none = HeaderMap::new();
        assert!(local_access(false, loopback, &none));
        assert!(!local_access(true, loopback, &none));
        assert!(!local_access(
            false,
            Some("10.0.0.1:5000".parse().unwrap()),
            &none
        ));
        assert!(!local_access(false, None, &none));
        for header in ["forwarded", "x-forwarded-for", "x-forwarded-host"] {
            let mut proxied = HeaderMap::new();
            proxied.insert(header, HeaderValue::from_static("1.2.3.4"));
            assert!(!local_access(false, loopback, &proxied), "{header}");
        }
    }
}
