//! Workspaces over real HTTP: a `keel api` in remote mode (the header identity form) and a
//! `keel worker` on one database, two orgs each owning one of every kind of row. The walk
//! calls every route of the API as one org with the other's ids in the path (alone, and
//! under the caller's own parents): reads and writes answer 404 exactly as a made-up id of
//! the same kind does, the owner's rows read back unchanged afterwards, lists hold none of
//! the owner's ids, and neither the feed stream nor a run stream delivers the other's
//! events. Then the same walk the other way round.

use crate::support;
use crate::support::two_orgs;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::{Client, KeelProcess, SseReader, wait_for};
use keel_client::{
    EventRecord, Imported, LeaseRecord, MediaJobRecord, MediaJobStatus, ProviderView, RunRecord,
    RunStatus, SourceRecord, SystemStats,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use two_orgs::{REMOTE_ENV, SHARED_SECRET, operator_client};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY_ENV: &str = "KEEL_SECRET_WALK_MEDIA_KEY";
/// The media keys both orgs' presets name, granted to each.
const GRANTS: &str = "org_a=env:KEEL_SECRET_WALK_MEDIA_KEY,org_a=env:ARK_API_KEY,\
                      org_b=env:KEEL_SECRET_WALK_MEDIA_KEY,org_b=env:ARK_API_KEY";
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stream must stay silent to count as having nothing more to say.
const QUIET: Duration = Duration::from_secs(1);
/// A schedule that never fires while the test runs.
const SCHEDULE: &str =
    r#"{"kind":"once","timezone":"UTC","enabled":true,"run_at":"2099-01-01T00:00:00Z"}"#;

/// An approval policy that lifts every gate.
const POLICY: &str = r#"{"gates":{"shell_exec":"allow","git_exec":"allow","file_write":"allow",
    "network_egress":"allow","read_file":"allow","all_tools":"allow"}}"#;

/// What the walk does with a route.
#[derive(Debug, Clone, Copy)]
enum Walk {
    /// Serves nothing of any workspace's (probes, documents, templates, the caller's own
    /// session): answers 200 with none of the other workspace's ids. The query is sent.
    Global(&'static str),
    /// A list of the caller's workspace, with each query (`{param}` takes each of the other
    /// workspace's ids): none of the other's ids. The first query's page is not empty.
    List(&'static [&'static str]),
    /// The feed stream: walked by [`Walker::feed_stream`].
    FeedStream,
    /// Reads a row by the path's ids: 404 `not_found`, as for made-up ids.
    Read,
    /// Changes a row by the path's ids, with this JSON body (empty: none): 404, as for
    /// made-up ids, and the owner's rows unchanged.
    Write(&'static str),
    /// Creates a row of the caller's: with the other's `{param}` ids in the body, 404 as for
    /// made-up ids; with none, 201 and the new row stays out of the other's snapshot.
    Create(&'static str),
    /// Operators only: 403 `forbidden` to a remote caller, whoever's workspace it names.
    Operator(&'static str),
    /// Local-only: 403 `forbidden` in remote mode.
    LocalOnly,
    /// Computes from its body alone (a workflow render): 200 with none of the other
    /// workspace's ids.
    Compute(&'static str),
    /// A console asset: GET of this path answers 200 with none of the other's ids.
    Page(&'static str),
}

use Walk::{Compute, Create, FeedStream, Global, List, LocalOnly, Operator, Page, Read, Write};

/// Every route of the API (the test below fails until a new one is added here).
const ROUTES: &[(&str, &str, Walk)] = &[
    ("GET", "/healthz", Global("")),
    ("GET", "/readyz", Global("")),
    ("GET", "/docs", Global("")),
    // The console: its pages and the caller's own session (signing in with a runtime token,
    // or with a sign-in link's code, is refused in remote mode).
    ("GET", "/", Global("")),
    ("GET", "/console", Global("")),
    (
        "GET",
        "/console/assets/{*path}",
        Page("/console/assets/app.js"),
    ),
    ("GET", "/console/session", Global("")),
    ("POST", "/console/session", LocalOnly),
    ("DELETE", "/console/session", Compute("")),
    ("POST", "/console/sign-in-codes", LocalOnly),
    ("GET", "/v1/openapi.json", Global("")),
    ("GET", "/v1/whoami", Global("")),
    ("GET", "/v1/provider-templates", Global("")),
    (
        "GET",
        "/v1/secrets/status",
        Global("?ref=env:KEEL_SECRET_WALK_MEDIA_KEY"),
    ),
    ("POST", "/v1/system/shutdown", LocalOnly),
    // The ledger of the caller's workspace (the walk's rows make no model calls).
    ("GET", "/v1/usage/summary", Global("?scope=workspace")),
    ("GET", "/v1/usage/events", Global("?limit=200")),
    ("GET", "/v1/system/stats", List(&[""])),
    ("GET", "/v1/system/throughput", List(&["?minutes=60"])),
    ("GET", "/v1/workspace", List(&[""])),
    (
        "GET",
        "/v1/state-transitions",
        List(&[
            "?limit=200",
            "?entity_id={task_id}",
            "?entity_id={run_id}",
            "?entity_id={approval_id}",
            "?entity_id={media_job_id}",
        ]),
    ),
    (
        "GET",
        "/v1/runtime/leases",
        List(&["?status=released", "?status=active", "?status=expired"]),
    ),
    ("GET", "/v1/workspaces/{workspace_id}/limits", Operator("")),
    (
        "PUT",
        "/v1/workspaces/{workspace_id}/limits",
        Operator(r#"{"max_concurrent":0}"#),
    ),
    (
        "GET",
        "/v1/workspaces/{workspace_id}/approval-policy",
        Operator(""),
    ),
    (
        "PUT",
        "/v1/workspaces/{workspace_id}/approval-policy",
        Operator(POLICY),
    ),
    (
        "DELETE",
        "/v1/workspaces/{workspace_id}/approval-policy",
        Operator(""),
    ),
    (
        "GET",
        "/v1/approvals",
        List(&[
            "?limit=200",
            "?status=pending",
            "?status=approved",
            "?run_id={run_id}",
        ]),
    ),
    (
        "GET",
        "/v1/events",
        List(&[
            "?limit=200",
            "?task_id={task_id}",
            "?media_job_id={media_job_id}",
        ]),
    ),
    ("GET", "/v1/events/stream", FeedStream),
    (
        "GET",
        "/v1/external-work/actions",
        List(&[
            "?limit=200",
            "?status=pending_approval",
            "?item_id={item_id}",
            "?source_id={source_id}",
        ]),
    ),
    ("GET", "/v1/external-work/actions/{action_id}", Read),
    (
        "POST",
        "/v1/external-work/actions/{action_id}/execute",
        Write(""),
    ),
    (
        "POST",
        "/v1/external-work/actions/{action_id}/cancel",
        Write(r#"{"reason":"from the intruder"}"#),
    ),
    (
        "GET",
        "/v1/external-work/items",
        List(&["?limit=200", "?source_id={source_id}", "?state=claimed"]),
    ),
    (
        "POST",
        "/v1/external-work/items/{item_id}/ci-triage",
        Write("{}"),
    ),
    (
        "GET",
        "/v1/external-work/ci-triage",
        List(&[
            "?limit=200",
            "?source_id={source_id}",
            "?item_id={item_id}",
            "?status=stale",
        ]),
    ),
    ("GET", "/v1/external-work/ci-triage/scans/{scan_id}", Read),
    ("GET", "/v1/external-work/ci-triage/{triage_id}", Read),
    (
        "POST",
        "/v1/external-work/ci-triage/{triage_id}/run",
        Write(""),
    ),
    (
        "POST",
        "/v1/external-work/import",
        Create(
            r#"{"source_id":"{source_id}","payload":{"number":1,"title":"t","state":"open","updated_at":"2026-01-01T00:00:00Z"}}"#,
        ),
    ),
    (
        "POST",
        "/v1/external-work/render",
        Compute(
            r#"{"workflow_markdown":"Hi {{ issue.title }}","issue":{"id":"1","identifier":"a/b#1","title":"t","state":"open"}}"#,
        ),
    ),
    ("GET", "/v1/external-work/items/{item_id}", Read),
    ("GET", "/v1/external-work/items/{item_id}/actions", Read),
    (
        "POST",
        "/v1/external-work/items/{item_id}/actions",
        Write(r#"{"kind":"comment","body":"from the intruder"}"#),
    ),
    ("GET", "/v1/external-work/sources", List(&["?limit=200"])),
    (
        "POST",
        "/v1/external-work/sources",
        Create(
            r#"{"workflow_markdown":"---\ntracker: {kind: github, repository: intruder/repo}\n---\nhi"}"#,
        ),
    ),
    ("GET", "/v1/external-work/sources/{source_id}", Read),
    ("DELETE", "/v1/external-work/sources/{source_id}", Write("")),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/background",
        Write(r#"{"enabled":true}"#),
    ),
    ("GET", "/v1/external-work/sources/{source_id}/items", Read),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/poll",
        Write("{}"),
    ),
    (
        "POST",
        "/v1/external-work/sources/{source_id}/reconcile",
        Write(""),
    ),
    ("GET", "/v1/external-work/sources/{source_id}/status", Read),
    (
        "GET",
        "/v1/media-jobs",
        List(&["?limit=200", "?provider_id={id}"]),
    ),
    (
        "POST",
        "/v1/media-jobs",
        Create(r#"{"provider_id":"{id}","operation":"image_generate","prompt":"a heist"}"#),
    ),
    ("GET", "/v1/media-jobs/{media_job_id}", Read),
    ("GET", "/v1/media-jobs/{media_job_id}/artifacts", Read),
    (
        "GET",
        "/v1/media-jobs/{media_job_id}/artifacts/{artifact_id}/content",
        Read,
    ),
    ("POST", "/v1/media-jobs/{media_job_id}/cancel", Write("")),
    ("POST", "/v1/media-jobs/{media_job_id}/run", Write("")),
    ("GET", "/v1/providers", List(&["?limit=200"])),
    (
        "GET",
        "/v1/runs",
        List(&[
            "?limit=200",
            "?status=completed",
            "?task_id={task_id}",
            "?task_id={task_id}&status=completed",
        ]),
    ),
    (
        "POST",
        "/v1/providers",
        Create(
            r#"{"kind":"seedream","model":"m","api":"media-job","base_url":"https://ark.ap-southeast.bytepluses.com/api/v3"}"#,
        ),
    ),
    ("GET", "/v1/providers/{id}", Read),
    (
        "PATCH",
        "/v1/providers/{id}",
        Write(r#"{"display_name":"taken over","enabled":false}"#),
    ),
    ("DELETE", "/v1/providers/{id}", Write("")),
    ("POST", "/v1/providers/{id}/check", Write("")),
    (
        "GET",
        "/v1/task-schedules",
        List(&["?limit=200", "?task_id={task_id}"]),
    ),
    (
        "GET",
        "/v1/tasks",
        List(&["?limit=200", "?status=awaiting_approval"]),
    ),
    (
        "POST",
        "/v1/tasks",
        Create(r#"{"execution_kind":"shell","shell_command":"echo intruder"}"#),
    ),
    ("GET", "/v1/tasks/{task_id}", Read),
    ("DELETE", "/v1/tasks/{task_id}", Write("")),
    ("GET", "/v1/tasks/{task_id}/artifacts", Read),
    ("GET", "/v1/tasks/{task_id}/approvals", Read),
    ("GET", "/v1/tasks/{task_id}/approvals/{approval_id}", Read),
    (
        "POST",
        "/v1/tasks/{task_id}/approvals/{approval_id}/resolve",
        Write(r#"{"decision":"approve","note":"not mine to approve"}"#),
    ),
    ("GET", "/v1/tasks/{task_id}/runs", Read),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}", Read),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/artifacts", Read),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}",
        Read,
    ),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}/content",
        Read,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/cancel",
        Write(""),
    ),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/events", Read),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/patches", Read),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}",
        Read,
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/revert",
        Write(""),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/apply",
        Write(""),
    ),
    ("POST", "/v1/tasks/{task_id}/client-runs", Write("{}")),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/events",
        Write(r#"{"lease_token":"kcl_not_theirs","events":[{"kind":"intrusion"}]}"#),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/discard",
        Write(""),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/continue",
        Write(r#"{"prompt":"intruder"}"#),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/resume",
        Write("{}"),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/retry-from-model-call",
        Write(r#"{"model_call_index":1}"#),
    ),
    (
        "POST",
        "/v1/tasks/{task_id}/runs/{run_id}/retry",
        Write("{}"),
    ),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/steps", Read),
    (
        "GET",
        "/v1/tasks/{task_id}/runs/{run_id}/steps/{step_id}",
        Read,
    ),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/stream", Read),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/transcript", Read),
    ("GET", "/v1/tasks/{task_id}/runs/{run_id}/context", Read),
    ("GET", "/v1/tasks/{task_id}/schedule", Read),
    ("PUT", "/v1/tasks/{task_id}/schedule", Write(SCHEDULE)),
    ("DELETE", "/v1/tasks/{task_id}/schedule", Write("")),
    ("GET", "/v1/tasks/{task_id}/schedule/occurrences", Read),
    ("POST", "/v1/tasks/{task_id}/start", Write("{}")),
];

#[test]
fn the_walk_names_every_documented_route() {
    let mut documented = keel::api::documented_routes();
    let mut walked: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    walked.sort();
    assert_eq!(walked, documented, "walk every route the API serves");
}

/// One org's caller and the ids of its rows, as it lists them itself.
struct Org {
    name: &'static str,
    client: Client,
    tree: Tree,
}

#[derive(Debug, Default)]
struct Tree {
    tasks: Vec<TaskNode>,
    providers: Vec<String>,
    media_jobs: Vec<(String, Vec<String>)>,
    external_sources: Vec<String>,
    external_items: Vec<String>,
    external_actions: Vec<String>,
    triage: Vec<String>,
    triage_scans: Vec<String>,
}

#[derive(Debug)]
struct TaskNode {
    id: String,
    runs: Vec<RunNode>,
    approvals: Vec<String>,
}

#[derive(Debug)]
struct RunNode {
    id: String,
    artifacts: Vec<String>,
    steps: Vec<String>,
}

/// A vendor that answers every image generation with one PNG, and GitHub's pull request #4.
async fn image_vendor() -> MockServer {
    use base64::Engine;
    let vendor = MockServer::start().await;
    let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG\r\n\x1a\n-walk-image");
    Mock::given(method("POST"))
        .and(path("/v1/images/generations"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "data": [{ "b64_json": png }] })),
        )
        .mount(&vendor)
        .await;
    // GitHub's pull request #4, whose head moved on since the seeded import.
    let pull = json!({ "id": 2004, "number": 4, "title": "seeded pull", "state": "open",
                       "updated_at": "2026-01-02T00:00:00Z", "head": { "sha": "zzz" } });
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/pulls/4"))
        .respond_with(ResponseTemplate::new(200).set_body_json(pull))
        .mount(&vendor)
        .await;
    vendor
}

/// A `keel api` in remote mode (the header form; shell runs wait for approval) and a
/// `keel worker`, on a fresh database. The walks' callers are each org's operator, who may
/// do the most inside its workspace (resolve its own approvals included): a member may do
/// less (tests/roles.rs).
struct Stack {
    api: KeelProcess,
    worker: KeelProcess,
    base: String,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn stack() -> Stack {
    let db = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let settings = [
        ("KEEL_APPROVAL_POLICIES", "shell_exec"),
        (KEY_ENV, "sk-walk-test-key"),
        // Each org's operator seeds presets naming these: tenants name granted secrets only.
        ("KEEL_SECRET_GRANTS", GRANTS),
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "1"),
        ("KEEL_PROVIDER_HOSTS", "127.0.0.1"),
        ("KEEL_ALLOW_SELF_APPROVAL", "1"),
    ];
    let env = [REMOTE_ENV.as_slice(), &settings].concat();
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &env).await;
    let worker =
        support::spawn_worker_with_env(&db, logs.path(), "worker", 2_000, data.path(), &env);
    let base = api.client.as_ref().unwrap().base.clone();
    Stack {
        api,
        worker,
        base,
        _dirs: (logs, data),
    }
}

#[tokio::test]
async fn neither_workspace_can_read_change_list_or_stream_the_others_rows() {
    let mut stack = stack().await;
    let vendor = image_vendor().await;
    let (a, b) = (
        operator_client(&stack.base, "a"),
        operator_client(&stack.base, "b"),
    );
    let a_root = two_orgs::runtime_operator_client(&stack.base, "a");
    let b_root = two_orgs::runtime_operator_client(&stack.base, "b");
    let a_gated = seed(&a, &a_root, &vendor.uri()).await;
    let b_gated = seed(&b, &b_root, &vendor.uri()).await;
    // Without a worker, an approved run stays queued: each org gets a queue row of its own.
    stack.worker.terminate(Duration::from_secs(20));
    approve_adds_to_the_queue_of_its_workspace_alone(&a, &b, &a_gated).await;
    approve_adds_to_the_queue_of_its_workspace_alone(&b, &a, &b_gated).await;

    walk(("a", &a), ("b", &b)).await;
    walk(("b", &b), ("a", &a)).await;
    live_events_stay_in_their_workspace(&a, &a_gated, &b, &b_gated).await;
    let log = stack.api.log_text();
    assert!(stack.api.client.as_ref().unwrap().healthy().await, "{log}");
    assert!(!log.contains(SHARED_SECRET), "the secret reached the log");
}

/// A running job holds a lease: its org's stats and lease list count it, the other org's
/// count nothing, not even on the worker that serves both.
#[tokio::test]
async fn a_running_job_counts_in_its_own_workspace_alone() {
    let stack = stack().await;
    let (a, b) = (
        operator_client(&stack.base, "a"),
        operator_client(&stack.base, "b"),
    );
    let running = gated_run(&a, "sleep 30").await;
    resolve(&a, &running, "approve").await;
    a.wait_status(
        &running.task_id,
        &running.run_id,
        RunStatus::Running,
        TIMEOUT,
    )
    .await;
    let (a_stats, b_stats) = (live_stats(&a).await, live_stats(&b).await);
    // Tenants learn that workers are live, not the deployment's hosts and pids. (The
    // worker's id is a string: the record would not read otherwise.)
    for stats in [&a_stats, &b_stats] {
        let worker = &stats.workers.list[0];
        assert_eq!(worker.hostname, None, "{stats:?}");
        assert_eq!(worker.pid, None, "{stats:?}");
    }
    assert_eq!(a_stats.active_leases, 1, "{a_stats:?}");
    assert_eq!(worker_leases(&a_stats), 1, "{a_stats:?}");
    assert_eq!(b_stats.active_leases, 0, "{b_stats:?}");
    assert!(b_stats.queue.is_empty(), "{b_stats:?}");
    assert_eq!(worker_leases(&b_stats), 0, "{b_stats:?}");
    // keel-client has no operation listing leases: the lists are read raw.
    let (_, a_leases) = a.get("/v1/runtime/leases?status=active").await;
    assert_eq!(
        support::page::<LeaseRecord>(&a_leases).data[0].ref_id,
        running.run_id,
        "{a_leases}"
    );
    let (_, b_leases) = b.get("/v1/runtime/leases?status=active").await;
    let b_leases_listed = support::page::<LeaseRecord>(&b_leases).data;
    assert!(b_leases_listed.is_empty(), "{b_leases}");
    cancel(&a, &running).await;
}

/// The caller's system stats once the worker is live.
async fn live_stats(c: &Client) -> SystemStats {
    wait_for(TIMEOUT, "the worker in the stats", || async {
        let (status, stats) = c.api.system_stats().send_with_status().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{stats:?}");
        (stats.data.workers.live == 1).then_some(stats.data)
    })
    .await
}

/// The leases the stats' workers are said to hold.
fn worker_leases(stats: &SystemStats) -> i64 {
    stats.workers.list.iter().map(|w| w.active_leases).sum()
}

/// The org with the ids of its rows as they are now, and the snapshot they came from.
async fn org((name, client): (&'static str, &Client)) -> (Org, BTreeMap<String, Value>) {
    let (seen, tree) = snapshot(client).await;
    let client = client.clone();
    (Org { name, client, tree }, seen)
}

/// A gated run and its pending approval.
struct Gated {
    task_id: String,
    run_id: String,
    approval_id: String,
}

/// One of every kind of row: a task whose run was approved and ran `echo hi` (steps,
/// artifacts, events) and which has a schedule; a task whose run awaits approval; two
/// presets from the templates (one pointed at the vendor and enabled); a media job that
/// succeeded (with artifacts) and one never run; a source (registered by `root`, the
/// runtime operator in the org), an item with an action, and a pull request item with a
/// stale triage record. Returns a third gated run, approved once the worker is gone.
async fn seed(c: &Client, root: &Client, vendor: &str) -> Gated {
    let done = gated_run(c, "echo hi").await;
    resolve(c, &done, "approve").await;
    let schedule = format!("/v1/tasks/{}/schedule", done.task_id);
    let (status, body) = call(c, "PUT", &schedule, SCHEDULE).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    gated_run(c, "echo pending").await;
    let later = gated_run(c, "echo later").await;

    let image = from_template(
        c,
        "openai-images",
        json!({ "base_url": format!("{vendor}/v1"),
        "api_key_ref": format!("env:{KEY_ENV}"), "enabled": true }),
    )
    .await;
    from_template(c, "seedream", json!({})).await;
    let job = media_job(c, &image).await;
    let (status, body) = c.post_empty(&format!("/v1/media-jobs/{job}/run")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    media_job(c, &image).await;
    let source = json!({ "workflow_markdown": format!(
        "---\ntracker: {{kind: github, repository: acme/widgets, endpoint: '{vendor}'}}\n\
         task: {{execution_kind: shell, shell_command: echo ext}}\n---\nWork on {{{{ issue.title }}}}") });
    // Aimed at the stand-in: the runtime operator's to do.
    let (status, body) = root.post("/v1/external-work/sources", source).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source_id = support::record::<SourceRecord>(&body).id;
    // An imported item with its task, and an action proposed on it (never approved).
    let payload = json!({ "number": 3, "title": "seeded", "state": "open",
                          "updated_at": "2026-01-01T00:00:00Z" });
    let import = json!({ "source_id": source_id, "payload": payload });
    let (status, body) = c.post("/v1/external-work/import", import).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let item = support::record::<Imported>(&body).item.id;
    let comment = json!({ "kind": "comment", "body": "seeded" });
    let proposal = format!("/v1/external-work/items/{item}/actions");
    let (status, body) = c.post(&proposal, comment).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // A pull request whose head moved on: its triage records it stale.
    let head = json!({ "sha": "yyy", "ref": "feature" });
    let payload = json!({ "id": 2004, "number": 4, "title": "seeded pull", "state": "open",
                          "updated_at": "2026-01-01T00:00:00Z", "head": head });
    let import = json!({ "source_id": source_id, "payload": payload });
    let (status, body) = c.post("/v1/external-work/import", import).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let pull = support::record::<Imported>(&body).item.id;
    let triage = format!("/v1/external-work/items/{pull}/ci-triage");
    let (status, body) = c.post(&triage, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let scan = format!(
        "/v1/external-work/ci-triage/scans/{}",
        body["data"]["id"].as_str().unwrap()
    );
    wait_for(TIMEOUT, "the seeded triage to end", || async {
        let (_, body) = c.get(&scan).await;
        (body["data"]["status"] == "done").then_some(())
    })
    .await;

    let run_id = &done.run_id;
    let run = c.wait_terminal(&done.task_id, run_id, TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let task_id = done.task_id.as_str();
    let steps = c.api.list_steps(task_id, run_id).await.unwrap().data;
    assert!(!steps.is_empty(), "steps: {steps:?}");
    let artifacts = c.api.list_artifacts(task_id, run_id).await.unwrap().data;
    assert!(!artifacts.is_empty(), "artifacts: {artifacts:?}");
    let events = c.api.list_run_events(task_id, run_id, None).await;
    let events = events.unwrap().data;
    assert!(!events.is_empty(), "events: {events:?}");
    wait_for(TIMEOUT, "the media job to succeed", || async {
        let job = c.api.get_media_job(&job).await.unwrap().data;
        (job.status == MediaJobStatus::Succeeded).then_some(())
    })
    .await;
    later
}

async fn gated_run(c: &Client, command: &str) -> Gated {
    let (task_id, run_id) = c.run_shell(command).await;
    c.wait_status(&task_id, &run_id, RunStatus::AwaitingApproval, TIMEOUT)
        .await;
    let approvals = c.api.list_task_approvals(&task_id, None).await.unwrap();
    let approval_id = approvals.data[0].id.clone();
    Gated {
        task_id,
        run_id,
        approval_id,
    }
}

async fn resolve(c: &Client, gated: &Gated, decision: &str) {
    let path = format!(
        "/v1/tasks/{}/approvals/{}/resolve",
        gated.task_id, gated.approval_id
    );
    let (status, body) = c.post(&path, json!({ "decision": decision })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A preset from a template's body, with `changes`.
async fn from_template(c: &Client, template_id: &str, changes: Value) -> String {
    let templates = c.api.list_templates().await.unwrap().data;
    let template = templates
        .into_iter()
        .find(|t| t.template_id == template_id)
        .unwrap();
    let mut body = serde_json::to_value(template).unwrap();
    let fields = body.as_object_mut().unwrap();
    fields.remove("template_id");
    fields.remove("description");
    fields.extend(changes.as_object().unwrap().clone());
    let (status, body) = c.post("/v1/providers", body).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    support::record::<ProviderView>(&body).id
}

async fn media_job(c: &Client, provider: &str) -> String {
    let job = json!({ "provider_id": provider, "operation": "image_generate",
                      "prompt": "a lighthouse at dusk" });
    let (status, body) = c.post("/v1/media-jobs", job).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    support::record::<MediaJobRecord>(&body).id
}

/// The queue figures (depth, ready, leased per kind) the caller's stats show.
async fn queue_figures(c: &Client) -> Vec<(String, i64, i64, i64)> {
    let (status, stats) = c.api.system_stats().send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{stats:?}");
    stats
        .data
        .queue
        .into_iter()
        .map(|k| (k.kind, k.depth, k.ready, k.leased))
        .collect()
}

fn ready(figures: &[(String, i64, i64, i64)]) -> i64 {
    figures.iter().map(|(_, _, ready, _)| ready).sum()
}

/// Approving `gated` queues a job the owner's stats count and the other's do not.
async fn approve_adds_to_the_queue_of_its_workspace_alone(
    owner: &Client,
    other: &Client,
    gated: &Gated,
) {
    let (owner_before, other_before) = (queue_figures(owner).await, queue_figures(other).await);
    resolve(owner, gated, "approve").await;
    assert_eq!(ready(&queue_figures(owner).await), ready(&owner_before) + 1);
    assert_eq!(queue_figures(other).await, other_before);
}

/// Everything the owner can read of its own rows, by path, and the tree of their ids.
/// Walking the tree reads every resource, so two snapshots equal means nothing changed.
async fn snapshot(c: &Client) -> (BTreeMap<String, Value>, Tree) {
    let mut seen = Snapshot::default();
    let mut tree = Tree::default();
    for task in seen.ids(c, "/v1/tasks?limit=200").await {
        let base = format!("/v1/tasks/{task}");
        for path in ["", "/schedule", "/schedule/occurrences"] {
            seen.read(c, &format!("{base}{path}")).await;
        }
        let approvals = seen.ids(c, &format!("{base}/approvals?limit=200")).await;
        let mut runs = Vec::new();
        for run in seen.ids(c, &format!("{base}/runs?limit=200")).await {
            let run_base = format!("{base}/runs/{run}");
            for path in ["", "/events?limit=200"] {
                seen.read(c, &format!("{run_base}{path}")).await;
            }
            let steps = seen.ids(c, &format!("{run_base}/steps?limit=200")).await;
            for step in &steps {
                seen.read(c, &format!("{run_base}/steps/{step}")).await;
            }
            let artifacts = seen.artifacts(c, &format!("{run_base}/artifacts")).await;
            runs.push(RunNode {
                id: run,
                artifacts,
                steps,
            });
        }
        seen.read(c, &format!("{base}/artifacts?limit=200")).await;
        tree.tasks.push(TaskNode {
            id: task,
            runs,
            approvals,
        });
    }
    for provider in seen.ids(c, "/v1/providers?limit=200").await {
        seen.read(c, &format!("/v1/providers/{provider}")).await;
        tree.providers.push(provider);
    }
    for job in seen.ids(c, "/v1/media-jobs?limit=200").await {
        seen.read(c, &format!("/v1/media-jobs/{job}")).await;
        let artifacts = seen
            .artifacts(c, &format!("/v1/media-jobs/{job}/artifacts"))
            .await;
        tree.media_jobs.push((job, artifacts));
    }
    for source in seen.ids(c, "/v1/external-work/sources?limit=200").await {
        let base = format!("/v1/external-work/sources/{source}");
        for path in ["", "/status"] {
            seen.read(c, &format!("{base}{path}")).await;
        }
        for item in seen.ids(c, &format!("{base}/items?limit=200")).await {
            seen.read(c, &format!("/v1/external-work/items/{item}"))
                .await;
            let actions = format!("/v1/external-work/items/{item}/actions?limit=200");
            for action in seen.ids(c, &actions).await {
                seen.read(c, &format!("/v1/external-work/actions/{action}"))
                    .await;
                tree.external_actions.push(action);
            }
            tree.external_items.push(item);
        }
        tree.external_sources.push(source);
    }
    for record in seen
        .records(c, "/v1/external-work/ci-triage?limit=200")
        .await
    {
        let id = record["id"].as_str().unwrap().to_string();
        let scan = record["scan_id"].as_str().unwrap().to_string();
        seen.read(c, &format!("/v1/external-work/ci-triage/{id}"))
            .await;
        seen.read(c, &format!("/v1/external-work/ci-triage/scans/{scan}"))
            .await;
        tree.triage.push(id);
        tree.triage_scans.push(scan);
    }
    for list in [
        "/v1/approvals?limit=200",
        "/v1/runs?limit=200",
        "/v1/task-schedules?limit=200",
        "/v1/events?limit=200",
        "/v1/state-transitions?limit=200",
        "/v1/runtime/leases?status=active",
        "/v1/runtime/leases?status=released",
        "/v1/runtime/leases?status=expired",
        "/v1/workspace",
    ] {
        seen.read(c, list).await;
    }
    let figures = queue_figures(c).await;
    seen.0.insert("queue".into(), json!(figures));
    (seen.0, tree)
}

#[derive(Default)]
struct Snapshot(BTreeMap<String, Value>);

impl Snapshot {
    async fn read(&mut self, c: &Client, path: &str) -> Value {
        let (status, body) = c.get(path).await;
        let entry = json!({ "status": status.as_u16(), "body": without_request_ids(body) });
        self.0.insert(path.to_string(), entry.clone());
        entry["body"].clone()
    }

    /// The ids of a list's page (the owner's lists here fit one page).
    async fn ids(&mut self, c: &Client, path: &str) -> Vec<String> {
        let page = self.read(c, path).await;
        assert_eq!(page["has_more"], false, "{path}");
        page["data"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: {page}"))
            .iter()
            .map(|item| item["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// The rows of a list's page (the owner's lists here fit one page).
    async fn records(&mut self, c: &Client, path: &str) -> Vec<Value> {
        let page = self.read(c, path).await;
        assert_eq!(page["has_more"], false, "{path}");
        page["data"].as_array().cloned().unwrap_or_default()
    }

    /// The artifacts under `list`, each read with its bytes.
    async fn artifacts(&mut self, c: &Client, list: &str) -> Vec<String> {
        let ids = self.ids(c, list).await;
        for id in &ids {
            let artifact = format!("{list}/{id}");
            if list.starts_with("/v1/tasks/") {
                self.read(c, &artifact).await;
            }
            self.read(c, &format!("{artifact}/content")).await;
        }
        ids
    }
}

/// An error body without the ids that differ on every request.
fn without_request_ids(mut body: Value) -> Value {
    if let Some(error) = body.get_mut("error").and_then(Value::as_object_mut) {
        error.remove("request_id");
        error.remove("trace_id");
    }
    body
}

/// What must never appear in a response to the other org: the owner's row ids (tasks,
/// runs, approvals, steps, artifacts, events, schedules, presets, media jobs, …), its
/// actor and its workspace.
fn secrets_of(snapshot: &BTreeMap<String, Value>, owner: &Org) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in snapshot.values() {
        collect_ids(entry, &mut found);
    }
    // Workers serve every workspace: their ids are no workspace's.
    found.retain(|id| !id.starts_with("wrk_"));
    found.insert(format!("actor_{}", owner.name));
    found.insert(format!("org_{}", owner.name));
    found
}

fn collect_ids(value: &Value, found: &mut BTreeSet<String>) {
    match value {
        Value::String(s) if is_row_id(s) => {
            found.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| collect_ids(v, found)),
        Value::Object(fields) => fields.values().for_each(|v| collect_ids(v, found)),
        _ => {}
    }
}

/// `prefix_` and 32 hex digits: the shape of every id Keel generates.
fn is_row_id(s: &str) -> bool {
    s.rsplit_once('_').is_some_and(|(prefix, hex)| {
        let kind = |b: u8| b.is_ascii_lowercase() || b == b'_';
        !prefix.is_empty()
            && prefix.bytes().all(kind)
            && hex.len() == 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

fn assert_shows_none_of(text: &str, secrets: &BTreeSet<String>, what: &str) {
    let leaked: Vec<&String> = secrets
        .iter()
        .filter(|s| text.contains(s.as_str()))
        .collect();
    assert!(
        leaked.is_empty(),
        "{what} shows the other org's {leaked:?}: {text}"
    );
}

/// The walk of every route as `intruder` against `owner`'s rows; the owner's snapshot is
/// the same afterwards.
async fn walk(owner: (&'static str, &Client), intruder: (&'static str, &Client)) {
    let ((owner, before), (intruder, _)) = (org(owner).await, org(intruder).await);
    let secrets = secrets_of(&before, &owner);
    let w = Walker {
        owner,
        intruder,
        secrets,
    };
    for (method, template, walk) in ROUTES {
        match *walk {
            Global(query) => w.global(template, query).await,
            List(queries) => w.lists(template, queries).await,
            FeedStream => w.feed_stream().await,
            Read => w.by_id(method, template, "", StatusCode::NOT_FOUND).await,
            Write(body) => w.by_id(method, template, body, StatusCode::NOT_FOUND).await,
            Operator(body) => w.by_id(method, template, body, StatusCode::FORBIDDEN).await,
            Create(body) => w.create(template, body).await,
            LocalOnly => w.local_only(method, template).await,
            Compute(body) => w.compute(method, template, body).await,
            Page(path) => w.global(path, "").await,
        }
    }
    let (after, _) = snapshot(&w.owner.client).await;
    assert_unchanged(&before, &after, w.owner.name);
}

/// One direction of the walk: the intruder calls, the owner's rows are the targets.
struct Walker {
    owner: Org,
    intruder: Org,
    /// What no response to the intruder may hold (see [`secrets_of`]).
    secrets: BTreeSet<String>,
}

impl Walker {
    async fn global(&self, template: &str, query: &str) {
        let (status, body) = self
            .intruder
            .client
            .get(&format!("{template}{query}"))
            .await;
        assert_eq!(status, StatusCode::OK, "GET {template}: {body}");
        assert_shows_none_of(&body.to_string(), &self.secrets, template);
    }

    async fn compute(&self, method: &str, template: &str, body: &str) {
        let (status, got) = call(&self.intruder.client, method, template, body).await;
        assert_eq!(status, StatusCode::OK, "{method} {template}: {got}");
        assert_shows_none_of(&got.to_string(), &self.secrets, template);
    }

    async fn local_only(&self, method: &str, template: &str) {
        let (status, body) = call(&self.intruder.client, method, template, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {template}: {body}");
        assert_eq!(
            body["error"]["type"], "forbidden",
            "{method} {template}: {body}"
        );
    }

    async fn lists(&self, template: &str, queries: &[&str]) {
        for (n, query) in queries.iter().enumerate() {
            for (query, _) in fill_each(query, &self.owner.tree) {
                let path = format!("{template}{query}");
                let (status, body) = self.intruder.client.get(&path).await;
                assert_eq!(status, StatusCode::OK, "{path}: {body}");
                assert_shows_none_of(&body.to_string(), &self.secrets, &path);
                if n == 0 {
                    let data = &body["data"];
                    let empty = data.as_array().is_some_and(Vec::is_empty) || data.is_null();
                    assert!(!empty, "{path}: the caller's own rows are listed: {body}");
                }
            }
        }
    }

    /// Each combination of the owner's ids in the path: all of them the owner's, and the
    /// owner's under the intruder's own parents (its task, its run, its media job). Each call
    /// answers `expected` with the body a made-up id in the same places gets.
    async fn by_id(&self, method: &str, template: &str, body: &str, expected: StatusCode) {
        let names = params(template);
        let owner_ws = format!("org_{}", self.owner.name);
        let intruder_ws = format!("org_{}", self.intruder.name);
        let owned = self.owner.tree.combos(&names, &owner_ws);
        assert!(
            !owned.is_empty(),
            "{template}: org {} has nothing to walk",
            self.owner.name
        );
        for split in 0..names.len() {
            let Some(mine) = self
                .intruder
                .tree
                .combos(&names[..split], &intruder_ws)
                .into_iter()
                .next()
            else {
                continue;
            };
            let theirs: BTreeSet<&[String]> = owned.iter().map(|ids| &ids[split..]).collect();
            for theirs in theirs {
                let ids: Vec<String> = mine.iter().chain(theirs).cloned().collect();
                let unknown: Vec<String> = mine
                    .iter()
                    .cloned()
                    .chain(theirs.iter().map(|id| made_up(id)))
                    .collect();
                let path = fill(template, &ids);
                let (status, got) = call(&self.intruder.client, method, &path, body).await;
                let (_, baseline) = call(
                    &self.intruder.client,
                    method,
                    &fill(template, &unknown),
                    body,
                )
                .await;
                assert_eq!(
                    status, expected,
                    "{method} {path} as org {}: {got}",
                    self.intruder.name
                );
                assert_eq!(got, baseline, "{method} {path}: unlike a made-up id");
            }
        }
    }

    /// Creates as the intruder: naming the owner's rows in the body is 404 as for a made-up
    /// id; a body that names none makes the intruder's own row.
    async fn create(&self, template: &str, body: &str) {
        for (filled, id) in fill_each(body, &self.owner.tree) {
            let (status, got) = call(&self.intruder.client, "POST", template, &filled).await;
            let Some(id) = id else {
                assert_eq!(status, StatusCode::CREATED, "POST {template}: {got}");
                continue;
            };
            let unknown = filled.replace(&id, &made_up(&id));
            let (_, baseline) = call(&self.intruder.client, "POST", template, &unknown).await;
            assert_eq!(
                status,
                StatusCode::NOT_FOUND,
                "POST {template} {filled}: {got}"
            );
            assert_eq!(
                got, baseline,
                "POST {template} {filled}: unlike a made-up id"
            );
        }
    }

    /// The intruder's feed stream from the start holds its own events and none of the
    /// owner's; filtered by the owner's tasks or media jobs, it holds nothing at all.
    async fn feed_stream(&self) {
        let mut feed = SseReader::open(&self.intruder.client, "/v1/events/stream", None).await;
        let events = drain(&mut feed).await;
        assert!(
            !events.is_empty(),
            "org {}'s own events stream",
            self.intruder.name
        );
        assert_shows_none_of(&json!(events).to_string(), &self.secrets, "the feed stream");
        for query in ["?task_id={task_id}", "?media_job_id={media_job_id}"] {
            for (query, _) in fill_each(query, &self.owner.tree) {
                let path = format!("/v1/events/stream{query}");
                let mut filtered = SseReader::open(&self.intruder.client, &path, None).await;
                let events = drain(&mut filtered).await;
                assert!(events.is_empty(), "{path}: {events:?}");
            }
        }
    }
}

fn assert_unchanged(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    owner: &str,
) {
    for (path, was) in before {
        assert_eq!(after.get(path), Some(was), "org {owner}'s {path} changed");
    }
    let keys = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(after),
        keys(before),
        "org {owner} has rows it did not make"
    );
}

/// The placeholders a query or a body may hold.
const PLACEHOLDERS: [&str; 7] = [
    "task_id",
    "run_id",
    "approval_id",
    "media_job_id",
    "source_id",
    "item_id",
    "id",
];

/// `text` with its placeholder (if any) taking each of the tree's ids of that kind, each
/// with the id it took.
fn fill_each(text: &str, tree: &Tree) -> Vec<(String, Option<String>)> {
    let Some(param) = PLACEHOLDERS
        .iter()
        .find(|p| text.contains(&format!("{{{p}}}")))
    else {
        return vec![(text.to_string(), None)];
    };
    let placeholder = format!("{{{param}}}");
    tree.all(param)
        .into_iter()
        .map(|id| (text.replace(&placeholder, &id), Some(id)))
        .collect()
}

impl Tree {
    /// Every id of one path parameter's kind.
    fn all(&self, param: &str) -> Vec<String> {
        let runs = || self.tasks.iter().flat_map(|t| &t.runs);
        let ids: Vec<&String> = match param {
            "task_id" => self.tasks.iter().map(|t| &t.id).collect(),
            "run_id" => runs().map(|run| &run.id).collect(),
            "approval_id" => self.tasks.iter().flat_map(|t| &t.approvals).collect(),
            "media_job_id" => self.media_jobs.iter().map(|(id, _)| id).collect(),
            "source_id" => self.external_sources.iter().collect(),
            "id" => self.providers.iter().collect(),
            "item_id" => self.external_items.iter().collect(),
            other => panic!("no ids for {{{other}}}"),
        };
        ids.into_iter().cloned().collect()
    }

    /// Every combination of ids for the path's parameters, each child under its own parent
    /// (a run of that task, an artifact of that run or media job).
    fn combos(&self, params: &[&str], workspace: &str) -> Vec<Vec<String>> {
        let prepend = |id: &String, tails: Vec<Vec<String>>| {
            tails
                .into_iter()
                .map(|tail| std::iter::once(id.clone()).chain(tail).collect())
                .collect::<Vec<Vec<String>>>()
        };
        match params {
            [] => vec![vec![]],
            ["workspace_id"] => vec![vec![workspace.to_string()]],
            ["id"] => self.providers.iter().map(|p| vec![p.clone()]).collect(),
            ["item_id"] => children(&self.external_items, params),
            ["action_id"] => children(&self.external_actions, params),
            ["triage_id"] => children(&self.triage, params),
            ["scan_id"] => children(&self.triage_scans, params),
            ["source_id", rest @ ..] => self
                .external_sources
                .iter()
                .flat_map(|id| prepend(id, children(&[], rest)))
                .collect(),
            ["media_job_id", rest @ ..] => self
                .media_jobs
                .iter()
                .flat_map(|(id, artifacts)| prepend(id, children(artifacts, rest)))
                .collect(),
            ["task_id", rest @ ..] => self
                .tasks
                .iter()
                .flat_map(|task| prepend(&task.id, task.combos(rest)))
                .collect(),
            other => panic!("no ids for {other:?}"),
        }
    }
}

impl TaskNode {
    fn combos(&self, params: &[&str]) -> Vec<Vec<String>> {
        match params {
            [] => vec![vec![]],
            ["approval_id"] => children(&self.approvals, params),
            ["run_id", rest @ ..] => self
                .runs
                .iter()
                .flat_map(|run| {
                    // A run's leaves: its steps or its artifacts, as the path names them.
                    let leaves = match rest {
                        ["step_id"] => &run.steps,
                        _ => &run.artifacts,
                    };
                    children(leaves, rest)
                        .into_iter()
                        .map(move |tail| std::iter::once(run.id.clone()).chain(tail).collect())
                })
                .collect(),
            other => panic!("no ids for {other:?}"),
        }
    }
}

/// The last parameter's combinations: none left, or each leaf id.
fn children(ids: &[String], rest: &[&str]) -> Vec<Vec<String>> {
    match rest {
        [] => vec![vec![]],
        [_] => ids.iter().map(|id| vec![id.clone()]).collect(),
        other => panic!("no ids under {other:?}"),
    }
}

fn params(template: &str) -> Vec<&str> {
    template
        .split('{')
        .skip(1)
        .map(|part| part.split_once('}').unwrap().0)
        .collect()
}

fn fill(template: &str, ids: &[String]) -> String {
    let mut path = template.to_string();
    for (param, id) in params(template).iter().zip(ids) {
        path = path.replacen(&format!("{{{param}}}"), id, 1);
    }
    path
}

/// An id of the same kind that names nothing.
fn made_up(id: &str) -> String {
    let (prefix, _) = id.rsplit_once('_').unwrap();
    keel::domain::new_id(prefix)
}

/// One request; the body (without request ids) as JSON, or as `raw` text. A stream that
/// opens is not read: the status says enough.
async fn call(c: &Client, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = c.http.request(method, format!("{}{path}", c.base));
    if !body.is_empty() {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let streaming = response
        .headers()
        .get("content-type")
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if streaming {
        return (status, json!({ "raw": "an event stream" }));
    }
    let bytes = response.bytes().await.expect("body read");
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) }));
    (status, without_request_ids(body))
}

/// Every event `reader` sends until it is quiet for [`QUIET`].
async fn drain(reader: &mut SseReader) -> Vec<Value> {
    let mut events = Vec::new();
    while let Some(event) = reader.next(QUIET).await {
        events.push(event.data);
    }
    events
}

/// Live: while both orgs' feed streams are open, A cancels its queued run, B cancels its
/// own, then A retries its run. Each feed delivers its org's events in global order up to
/// the org's newest one, so an event of the other's made before it would have come first.
async fn live_events_stay_in_their_workspace(a: &Client, a_run: &Gated, b: &Client, b_run: &Gated) {
    let mut a_feed = open_feed_after_everything(a).await;
    let mut b_feed = open_feed_after_everything(b).await;
    cancel(a, a_run).await;
    cancel(b, b_run).await;
    let (status, retried) = a
        .post(
            &format!("/v1/tasks/{}/runs/{}/retry", a_run.task_id, a_run.run_id),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{retried}");
    let retried = support::record::<RunRecord>(&retried).id;
    let retried = retried.as_str();
    let seen = events_until(&mut b_feed, &b_run.run_id).await;
    assert!(
        seen.iter().all(|e| e["run_id"] == b_run.run_id),
        "org b's feed: {seen:?}"
    );
    let seen = events_until(&mut a_feed, retried).await;
    let a_runs = [a_run.run_id.as_str(), retried];
    assert!(
        seen.iter()
            .all(|e| a_runs.contains(&e["run_id"].as_str().unwrap_or_default())),
        "org a's feed: {seen:?}"
    );
}

async fn cancel(c: &Client, gated: &Gated) {
    let path = format!("/v1/tasks/{}/runs/{}/cancel", gated.task_id, gated.run_id);
    let (status, run) = c.post_empty(&path).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        support::record::<RunRecord>(&run).status,
        RunStatus::Cancelled,
        "{run}"
    );
}

/// The caller's feed stream from after its newest event.
async fn open_feed_after_everything(c: &Client) -> SseReader {
    // keel-client has no operation for the feed: its page is read raw.
    let (_, feed) = c.get("/v1/events?limit=200").await;
    let feed = support::page::<EventRecord>(&feed);
    // The list is in feed order: its last event is the newest.
    let newest = feed.data.last().unwrap().cursor.clone();
    assert!(!feed.has_more);
    let path = format!("/v1/events/stream?after={newest}");
    SseReader::open(c, &path, None).await
}

/// The events a feed delivers up to and including the first of `run_id`'s.
async fn events_until(feed: &mut SseReader, run_id: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let Some(event) = feed.next(TIMEOUT).await else {
            panic!("no event of {run_id} within {TIMEOUT:?}; saw {seen:?}");
        };
        let done = event.data["run_id"] == run_id;
        seen.push(event.data);
        if done {
            return seen;
        }
    }
}
