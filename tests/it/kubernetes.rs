//! The Kubernetes manifests (deploy/kubernetes/, docs/operations.md "Kubernetes"): the query
//! KEDA scales the workers on, read out of the ScaledObject and run against a Keel database,
//! counts exactly the jobs the docs say (ready and leased ones of the pool's kinds, in every
//! workspace; not delayed ones, not other kinds), and so does the documented per-workspace
//! variant; and the manifests' numbers agree with each other and with Keel (the scaler's
//! target is the workers' concurrency, the grace period outlasts the drain, the probes are
//! the API's routes, the query names every kind Keel has).

use crate::support;

use std::path::Path;
use std::time::Duration;

use keel::attempt::JobKind;
use serde::Deserialize;
use serde_yaml_ng::Value;
use sqlx::PgPool;

const AUTOSCALING: &str = "deploy/kubernetes/worker-autoscaling.yaml";
const WORKER: &str = "deploy/kubernetes/worker.yaml";
const API: &str = "deploy/kubernetes/api.yaml";
const LEASE: Duration = Duration::from_secs(30);

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)).unwrap()
}

/// The documents of a multi-document YAML file.
fn documents(relative: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(&read(relative))
        .map(|document| Value::deserialize(document).unwrap())
        .collect()
}

/// The document of `kind` named `name` in `relative`.
fn object(relative: &str, kind: &str, name: &str) -> Value {
    documents(relative)
        .into_iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in {relative}"))
}

/// The ScaledObject's PostgreSQL trigger's metadata: its query and target.
fn scaler() -> Value {
    let scaled = object(AUTOSCALING, "ScaledObject", "keel-worker");
    let triggers = scaled["spec"]["triggers"].as_sequence().unwrap();
    assert_eq!(triggers.len(), 1, "one trigger, the queue depth");
    assert_eq!(triggers[0]["type"].as_str(), Some("postgresql"));
    triggers[0]["metadata"].clone()
}

/// The query KEDA runs: the string the YAML holds, as KEDA's parser hands it over.
fn scaler_query() -> String {
    scaler()["query"].as_str().unwrap().to_string()
}

/// The documented per-workspace variant: the ```sql block of docs/operations.md that joins
/// `workspace_limits` (found by that text; there is one).
fn per_workspace_query() -> String {
    let docs = read("docs/operations.md");
    let blocks: Vec<&str> = docs
        .split("```sql\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .filter(|block| block.contains("LEFT JOIN workspace_limits"))
        .collect();
    assert_eq!(blocks.len(), 1, "one per-workspace query in the docs");
    blocks[0].to_string()
}

/// The worker container's environment variable `name`.
fn worker_env(name: &str) -> String {
    let deployment = object(WORKER, "Deployment", "keel-worker");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("the worker sets no {name}"))
        .to_string()
}

/// A job row of `kind` in `workspace`, due `due_in_secs` from now (negative: already due).
async fn job(pool: &PgPool, kind: &str, ref_id: &str, workspace: &str, due_in_secs: i64) {
    sqlx::query(
        "INSERT INTO queue_jobs (kind, ref_id, workspace_id, run_after)
         VALUES ($1, $2, $3, now() + $4 * interval '1 second')",
    )
    .bind(kind)
    .bind(ref_id)
    .bind(workspace)
    .bind(due_in_secs as f64)
    .execute(pool)
    .await
    .unwrap();
}

/// One statement of a test's own that must change exactly one row.
async fn change_one_row(pool: &PgPool, statement: &'static str) {
    let changed = sqlx::query(statement).execute(pool).await.unwrap();
    assert_eq!(changed.rows_affected(), 1, "{statement}");
}

async fn run(pool: &PgPool, query: &str) -> f64 {
    // KEDA scans the result into a float64: so does this.
    let depth: f64 = sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_string()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("the query failed: {e}\n{query}"));
    depth
}

/// A queue holding every case the docs list: workspace `a` has 5 jobs that count, `b` 2.
async fn queue_of_every_case(pool: &PgPool) {
    // Due, unleased: they count (four runs, two per workspace, are claimed below).
    job(pool, "run", "run-a1", "a", -60).await;
    job(pool, "run", "run-a2", "a", -50).await;
    job(pool, "run", "run-b1", "b", -40).await;
    job(pool, "run", "run-b2", "b", -30).await;
    job(pool, "media", "media-a", "a", -20).await;
    job(pool, "poll", "poll-a", "a", -10).await;
    job(pool, "external_action", "action-a", "a", -1).await;
    // Delayed (a retry's backoff, a poll's next pass): they do not count.
    job(pool, "run", "run-a-retry", "a", 3600).await;
    job(pool, "poll", "poll-a-next", "a", 300).await;
    job(pool, "media", "media-b-retry", "b", 60).await;
    // A kind outside the pool's list, due and leased: it does not count.
    job(pool, "bench", "bench-1", "a", -60).await;
    job(pool, "bench", "bench-2", "b", -60).await;

    // Leased by Keel's own claim: still counted, the pool's running work.
    let runs = keel::queue::fair::claim(pool, "wrk_test", "run", 2, LEASE, u32::MAX)
        .await
        .unwrap();
    assert_eq!(runs.len(), 2);
    let bench = keel::queue::fair::claim(pool, "wrk_test", "bench", 1, LEASE, u32::MAX)
        .await
        .unwrap();
    assert_eq!(bench.len(), 1);
    // One of them held by a worker that died: its lease ran out, nobody took it over yet.
    let expired = sqlx::query(
        "UPDATE queue_jobs SET lease_expires_at = now() - interval '1 minute'
         WHERE id = $1 AND lease_owner IS NOT NULL",
    )
    .bind(runs[0].job_id)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(expired.rows_affected(), 1);

    let (leased, ready, delayed): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE lease_owner IS NOT NULL),
                count(*) FILTER (WHERE lease_owner IS NULL AND run_after <= now()),
                count(*) FILTER (WHERE lease_owner IS NULL AND run_after > now())
         FROM queue_jobs",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (leased, ready, delayed),
        (3, 6, 3),
        "the queue holds each case"
    );
}

#[tokio::test]
async fn the_scaler_query_counts_ready_and_leased_jobs_of_the_pools_kinds() {
    let pool = support::pool(&support::fresh_database().await).await;
    let query = scaler_query();
    assert_eq!(
        run(&pool, &query).await,
        0.0,
        "an empty queue asks for nothing"
    );

    queue_of_every_case(&pool).await;
    // Ready: run ×2, media, poll, external_action; leased: run ×2 (one expired). Not the
    // three delayed jobs, not the two bench jobs (one of them leased).
    assert_eq!(run(&pool, &query).await, 7.0);

    // A job that ends leaves the count; a delayed job that comes due joins it.
    change_one_row(&pool, "DELETE FROM queue_jobs WHERE ref_id = 'media-a'").await;
    change_one_row(
        &pool,
        "UPDATE queue_jobs SET run_after = now() WHERE ref_id = 'run-a-retry'",
    )
    .await;
    assert_eq!(run(&pool, &query).await, 7.0);
    change_one_row(&pool, "DELETE FROM queue_jobs WHERE ref_id = 'poll-a'").await;
    assert_eq!(run(&pool, &query).await, 6.0);
}

#[tokio::test]
async fn the_per_workspace_query_caps_each_workspace_at_its_limit() {
    let pool = support::pool(&support::fresh_database().await).await;
    let query = per_workspace_query();
    assert!(
        query.contains(scaler_query().lines().nth(1).unwrap().trim()),
        "the variant takes the same kinds as the ScaledObject's query:\n{query}"
    );
    assert_eq!(run(&pool, &query).await, 0.0);

    queue_of_every_case(&pool).await;
    // Workspace a: 5 jobs, capped at the default of 4; workspace b: 2 jobs, under it.
    assert_eq!(run(&pool, &query).await, 6.0);
    // An operator's limit for b (1) wins over the default.
    change_one_row(
        &pool,
        "INSERT INTO workspace_limits (workspace_id, max_concurrent, updated_by)
         VALUES ('b', 1, 'test')",
    )
    .await;
    assert_eq!(run(&pool, &query).await, 5.0);
    // A paused workspace (limit 0) asks for nothing.
    change_one_row(
        &pool,
        "UPDATE workspace_limits SET max_concurrent = 0 WHERE workspace_id = 'b'",
    )
    .await;
    assert_eq!(run(&pool, &query).await, 4.0);
}

/// docs/operations.md shows the query the ScaledObject holds, verbatim.
#[test]
fn the_docs_show_the_scalers_query() {
    let query = scaler_query();
    let docs = read("docs/operations.md");
    assert!(
        docs.contains(&format!("```sql\n{query}\n```")),
        "docs/operations.md has no sql block that is the ScaledObject's query:\n{query}"
    );
}

/// A `keel worker` takes every kind, so the one pool's query must list every kind Keel has.
#[test]
fn the_scaler_query_names_every_kind_a_worker_takes() {
    let query = scaler_query();
    let list = query
        .split("'{")
        .nth(1)
        .and_then(|rest| rest.split("}'").next())
        .expect("a '{…}' list of kinds in the query");
    let mut listed: Vec<&str> = list.split(',').collect();
    listed.sort_unstable();
    let mut kinds: Vec<&str> = JobKind::ALL.iter().map(|k| k.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(listed, kinds);
}

#[test]
fn one_worker_per_target_jobs_and_the_grace_period_outlasts_the_drain() {
    // KEDA asks for ceil(jobs / targetQueryValue) workers: one per worker's slots.
    assert_eq!(
        scaler()["targetQueryValue"].as_str(),
        Some(worker_env("KEEL_WORKER_CONCURRENCY").as_str())
    );
    let scaled = object(AUTOSCALING, "ScaledObject", "keel-worker");
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        Some("keel-worker")
    );
    assert!(
        scaled["spec"]["minReplicaCount"].as_u64().unwrap() >= 1,
        "workers also dispatch schedules: never scaled to zero"
    );

    // SIGTERM drains for KEEL_DRAIN_TIMEOUT_MS, then hands back and deregisters: the
    // kubelet's SIGKILL must come later, with room for the hand-back's writes.
    let drain_ms: u64 = worker_env("KEEL_DRAIN_TIMEOUT_MS").parse().unwrap();
    let worker = object(WORKER, "Deployment", "keel-worker");
    let grace_ms = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap()
        * 1000;
    assert!(
        grace_ms >= drain_ms + 10_000,
        "grace {grace_ms} ms, drain {drain_ms} ms"
    );

    // The API's probes are its routes, and its grace period covers the preStop pause and
    // the 30 s response bound.
    let api = object(API, "Deployment", "keel-api");
    let pod = &api["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let document = serde_json::to_value(keel::api::openapi()).unwrap();
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some(path));
        assert!(document["paths"].get(path).is_some(), "{path} is a route");
    }
    let pause: u64 = container["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > pause + 30);
}
