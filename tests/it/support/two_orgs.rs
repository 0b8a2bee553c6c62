//! A `keel api` in remote mode (the header identity form) without a worker, and a client
//! for each of two orgs, so each has a workspace of its own; started runs stay queued.
//! Tests that start their own processes take the settings ([`REMOTE_ENV`]) and the
//! clients ([`org_client`], a member; [`operator_client`], the org's operator;
//! [`runtime_operator_client`], the deployment's own operator acting in the org) alone.

use crate::support::{self, Client, KeelProcess, client_with_headers};

const RUNTIME_ID: &str = "rt_two_orgs";
pub const SHARED_SECRET: &str = "two-orgs-shared-secret-0123456789";

/// The settings of a runtime in remote mode that [`org_client`]'s headers identify to;
/// the proxy's `X-Keel-Role` counts. Without the default rate limit: these clients poll
/// as fast as a test waits (auth.rs tests the limit).
pub const REMOTE_ENV: [(&str, &str); 5] = [
    ("KEEL_REMOTE_MODE", "1"),
    ("KEEL_RUNTIME_ID", RUNTIME_ID),
    ("KEEL_REMOTE_SHARED_SECRET", SHARED_SECRET),
    ("KEEL_REMOTE_ROLE_HEADER", "1"),
    ("KEEL_RATE_LIMIT", "off"),
];

pub struct Stack {
    pub _api: KeelProcess,
    pub pool: sqlx::PgPool,
    pub a: Client,
    pub b: Client,
    _logs: tempfile::TempDir,
}

/// A member of `org_<org>`, actor `actor_<org>`.
pub fn org_client(base: &str, org: &str) -> Client {
    member_client(base, org, &format!("actor_{org}"))
}

/// Another member of `org_<org>`: actor `actor`.
pub fn member_client(base: &str, org: &str, actor: &str) -> Client {
    identified(base, org, actor, &[])
}

/// An operator of `org_<org>`, actor `operator_<org>`: it resolves the approvals of the
/// member's runs (nobody resolves their own).
pub fn operator_client(base: &str, org: &str) -> Client {
    let role = [("x-keel-role", "operator")];
    identified(base, org, &format!("operator_{org}"), &role)
}

/// The runtime operator acting in `org_<org>`, actor `root_<org>`: the deployment's own
/// operator, whom the proxy marks `runtime_operator`.
pub fn runtime_operator_client(base: &str, org: &str) -> Client {
    let role = [("x-keel-role", "runtime_operator")];
    identified(base, org, &format!("root_{org}"), &role)
}

/// A client the proxy's headers identify as `actor` in `org_<org>`, with `more` headers.
fn identified(base: &str, org: &str, actor: &str, more: &[(&str, &str)]) -> Client {
    let org_id = format!("org_{org}");
    let identity = [
        ("x-keel-remote-secret", SHARED_SECRET),
        ("x-keel-actor-id", actor),
        ("x-keel-org-id", org_id.as_str()),
        ("x-keel-runtime-id", RUNTIME_ID),
    ];
    client_with_headers(base, &[identity.as_slice(), more].concat())
}

pub async fn stack() -> Stack {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &REMOTE_ENV).await;
    let base = api.client.as_ref().unwrap().base.clone();
    Stack {
        _api: api,
        pool: support::pool(&db).await,
        a: org_client(&base, "a"),
        b: org_client(&base, "b"),
        _logs: logs,
    }
}

/// The workspace a run is in.
pub async fn workspace_of(pool: &sqlx::PgPool, run_id: &str) -> String {
    sqlx::query_scalar("SELECT workspace_id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap()
}
