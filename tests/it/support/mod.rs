//! Test harness: one throwaway PostgreSQL cluster per test run (started with Keel's own
//! embedded-cluster code, or `KEEL_TEST_DATABASE_URL`), a fresh database per test cloned
//! from a migrated template, Keel in-process or as real `keel` processes, and an SSE reader.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use keel::config::{Common, WorkerArgs};
use keel::db::embedded::{Durability, EmbeddedPostgres};
use keel::telemetry::LogFormat;
use keel_client::{
    EventRecord, ListEnvelope, ObjectEnvelope, RunRecord, RunStatus, StartRequest, TaskDraft,
    TaskRecord,
};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

pub mod agent_rows;
pub mod cgroups;
pub mod contracts;
pub mod fake_s3;
pub mod llm;
pub mod proxy;
pub mod tracker;
pub mod tracker_actions;
pub mod two_orgs;

const TEMPLATE: &str = "keel_test_template";

pub struct Cluster {
    admin_url: String,
    /// None with `KEEL_TEST_DATABASE_URL`; kept so the cluster lives as long as the run.
    _postgres: Option<EmbeddedPostgres>,
}

/// The cluster of this test binary, started on first use.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        if let Ok(url) = std::env::var("KEEL_TEST_DATABASE_URL") {
            return Cluster {
                admin_url: url,
                _postgres: None,
            };
        }
        let postgres = start_cluster("shared");
        Cluster {
            admin_url: postgres.url("postgres"),
            _postgres: Some(postgres),
        }
    })
}

/// Starts a throwaway cluster under a new directory of the temporary directory.
fn start_cluster(name: &str) -> EmbeddedPostgres {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let root =
        std::env::temp_dir().join(format!("keel-test-{name}-{}-{nanos}", std::process::id()));
    EmbeddedPostgres::start(&root, Durability::Throwaway).expect("starting a test cluster")
}

/// A cluster of the test's own and the URL of a migrated database on it, for a test that
/// stops or restarts PostgreSQL: every other test shares [`cluster`] at the same time.
pub async fn private_cluster() -> (EmbeddedPostgres, String) {
    let postgres = tokio::task::spawn_blocking(|| start_cluster("private"))
        .await
        .unwrap();
    let url = postgres.url("postgres");
    let mut conn = PgConnection::connect(&url).await.expect("connecting");
    keel::db::MIGRATOR
        .run(&mut conn)
        .await
        .expect("migrating the private cluster");
    conn.close().await.unwrap();
    (postgres, url)
}

fn database_url(admin_url: &str, name: &str) -> String {
    let (base, _) = admin_url
        .rsplit_once('/')
        .expect("a database URL has a path");
    format!("{base}/{name}")
}

/// A new, migrated database for one test; returns its URL.
pub async fn fresh_database() -> String {
    static TEMPLATE_READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let admin_url = cluster().admin_url.clone();
    TEMPLATE_READY
        .get_or_init(|| async {
            let mut admin = PgConnection::connect(&admin_url)
                .await
                .expect("admin connection");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {TEMPLATE}"
            )))
            .execute(&mut admin)
            .await
            .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {TEMPLATE}")))
                .execute(&mut admin)
                .await
                .unwrap();
            let mut template = PgConnection::connect(&database_url(&admin_url, TEMPLATE))
                .await
                .unwrap();
            keel::db::MIGRATOR
                .run(&mut template)
                .await
                .expect("migrating the template");
            template.close().await.unwrap();
        })
        .await;
    let name = format!("keel_test_{}", uuid_like());
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .expect("admin connection");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} TEMPLATE {TEMPLATE}"
    )))
    .execute(&mut admin)
    .await
    .expect("cloning the template");
    database_url(&admin_url, &name)
}

/// A new database with no schema at all (for tests that run `keel migrate` themselves).
pub async fn empty_database() -> String {
    let admin_url = cluster().admin_url.clone();
    let name = format!("keel_empty_{}", uuid_like());
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .expect("admin connection");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("creating an empty database");
    database_url(&admin_url, &name)
}

/// Runs `keel <args>` to completion and returns whether it succeeded, with its output.
pub fn run_keel(db_url: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .env("KEEL_DATABASE_URL", db_url)
        .output()
        .expect("keel ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn uuid_like() -> String {
    keel::domain::new_id("db")
        .trim_start_matches("db_")
        .to_string()
}

pub async fn pool(url: &str) -> PgPool {
    keel::db::connect(url, 10, "test").await.expect("test pool")
}

/// Waits until `check` returns Some, or panics after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The id a `keel worker` process registered under.
pub async fn worker_id_of(pool: &PgPool, process: &KeelProcess) -> String {
    let pid = process.pid();
    wait_for(
        Duration::from_secs(30),
        "the worker to register",
        || async {
            sqlx::query_scalar("SELECT id FROM workers WHERE pid = $1")
                .bind(pid)
                .fetch_optional(pool)
                .await
                .unwrap()
        },
    )
    .await
}

/// A client of Keel's API: raw HTTP (`get`, `post`, `send`: the status and the JSON body)
/// for tests about the wire, and the typed client of the same API with the same headers
/// (`api`, keel-client: the contract's records) for everything else. The helpers below
/// read through the typed client.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub api: keel_client::Client,
}

/// How long one typed request may take.
const API_TIMEOUT: Duration = Duration::from_secs(60);

/// A shell task's draft.
pub fn shell(command: &str) -> TaskDraft {
    TaskDraft {
        execution_kind: Some("shell".into()),
        shell_command: Some(command.into()),
        ..TaskDraft::default()
    }
}

/// A shell task's draft that works `in_place` in `directory`.
pub fn in_place(directory: &Path, command: &str) -> TaskDraft {
    TaskDraft {
        workspace_mode: Some("in_place".into()),
        working_directory: Some(directory.to_string_lossy().into_owned()),
        ..shell(command)
    }
}

/// An agent loop task's draft.
pub fn agent_loop(prompt: &str) -> TaskDraft {
    TaskDraft {
        execution_kind: Some("agent_loop".into()),
        prompt: Some(prompt.into()),
        ..TaskDraft::default()
    }
}

/// A request body as keel-client sends it (its unset fields left out), for a test that
/// posts it raw: to see it refused, or to check the answer's exact status.
pub fn wire(body: &impl serde::Serialize) -> Value {
    let mut body = serde_json::to_value(body).expect("request bodies serialize");
    if let Value::Object(fields) = &mut body {
        fields.retain(|_, value| !value.is_null());
    }
    body
}

/// The resource of an object envelope sent raw (`{"object", "data"}`), as the contract's
/// record: for a request whose exact status the test checks.
pub fn record<T: DeserializeOwned>(body: &Value) -> T {
    let envelope: ObjectEnvelope<T> = serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("not a {}: {e}: {body}", std::any::type_name::<T>()));
    envelope.data
}

/// A list envelope sent raw, with the contract's records: for a list keel-client has no
/// operation for (the feed), or whose exact status the test checks.
pub fn page<T: DeserializeOwned>(body: &Value) -> ListEnvelope<T> {
    serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("not a list of {}: {e}: {body}", std::any::type_name::<T>()))
}

impl Client {
    pub fn new(base: String) -> Self {
        client_with_headers(&base, &[])
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.expect("request sent");
        let status = response.status();
        let bytes = response.bytes().await.expect("body read");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({ "raw": String::from_utf8_lossy(&bytes) }));
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.http.post(format!("{}{path}", self.base)).json(&body))
            .await
    }

    /// POSTs to an action that takes no body (cancel, run, check, …), sending none.
    pub async fn post_empty(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.post(format!("{}{path}", self.base)))
            .await
    }

    /// The feed page at `path` (a `/v1/events?…` list) once `ready` holds for its events.
    /// The feed shows an event once every transaction older than the event's has ended, in
    /// any database of the cluster, and tests running alongside hold some open for a moment.
    pub async fn feed_when(
        &self,
        path: &str,
        ready: impl Fn(&[EventRecord]) -> bool,
    ) -> ListEnvelope<EventRecord> {
        wait_for(Duration::from_secs(20), path, || async {
            let (status, page) = self.get(path).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let page: ListEnvelope<EventRecord> = self::page(&page);
            ready(&page.data).then_some(page)
        })
        .await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    /// Creates a task (201).
    pub async fn create_task(&self, draft: &TaskDraft) -> TaskRecord {
        let created = self.api.create_task(draft).send_with_status().await;
        let (status, task) = created.expect("task created");
        assert_eq!(status, StatusCode::CREATED, "{task:?}");
        task.data
    }

    /// Creates a shell task and starts it; returns (task id, run id).
    pub async fn run_shell(&self, command: &str) -> (String, String) {
        self.start_task(&shell(command)).await
    }

    /// Creates a task from `draft` and starts it; returns (task id, run id).
    pub async fn start_task(&self, draft: &TaskDraft) -> (String, String) {
        let task = self.create_task(draft).await;
        let run = self.start(&task.id).await;
        (task.id, run.id)
    }

    /// Starts the task's next run (201).
    pub async fn start(&self, task_id: &str) -> RunRecord {
        let started = self.api.start_task(task_id, &StartRequest::default());
        let (status, run) = started.send_with_status().await.expect("run started");
        assert_eq!(status, StatusCode::CREATED, "{run:?}");
        run.data
    }

    /// The text of a run's stdout artifact.
    pub async fn stdout(&self, task_id: &str, run_id: &str) -> String {
        let stdout = self.stdout_so_far(task_id, run_id).await;
        stdout.expect("a stdout artifact")
    }

    /// What a running run printed so far; None before its stdout artifact exists.
    pub async fn stdout_so_far(&self, task_id: &str, run_id: &str) -> Option<String> {
        let artifacts = self.api.list_artifacts(task_id, run_id).await;
        let artifacts = artifacts.expect("the run's artifacts").data;
        let stdout = artifacts.iter().find(|a| a.name == "stdout")?;
        Some(self.artifact_text(task_id, run_id, &stdout.id).await)
    }

    /// The text of a run's artifact so far.
    pub async fn artifact_text(&self, task_id: &str, run_id: &str, artifact_id: &str) -> String {
        let content = self.api.artifact_content(task_id, run_id, artifact_id);
        let bytes = content.raw().await.expect("the artifact's content");
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub async fn run(&self, task_id: &str, run_id: &str) -> RunRecord {
        let run = self.api.get_run(task_id, run_id).send_with_status().await;
        let (status, run) = run.unwrap_or_else(|e| panic!("run {run_id}: {e}"));
        assert_eq!(status, StatusCode::OK, "{run:?}");
        run.data
    }

    /// Waits for the run to reach a terminal state and returns it.
    pub async fn wait_terminal(&self, task_id: &str, run_id: &str, timeout: Duration) -> RunRecord {
        wait_for(timeout, &format!("run {run_id} to end"), || async {
            let run = self.run(task_id, run_id).await;
            run.status.is_terminal().then_some(run)
        })
        .await
    }

    pub async fn wait_status(
        &self,
        task_id: &str,
        run_id: &str,
        status: RunStatus,
        timeout: Duration,
    ) -> RunRecord {
        wait_for(timeout, &format!("run {run_id} to be {status}"), || async {
            let run = self.run(task_id, run_id).await;
            (run.status == status).then_some(run)
        })
        .await
    }

    /// The output of the run's `egress` step: what its processes sent through the egress
    /// proxy and what it refused. None when they never used it.
    pub async fn egress(&self, task_id: &str, run_id: &str) -> Option<Value> {
        let steps = self.api.list_steps(task_id, run_id);
        let (status, steps) = steps.send_with_status().await.expect("the run's steps");
        assert_eq!(status, StatusCode::OK, "{steps:?}");
        let egress = steps.data.into_iter().find(|step| step.name == "egress")?;
        egress.output
    }

    /// The run's first 200 events.
    pub async fn events(&self, task_id: &str, run_id: &str) -> Vec<EventRecord> {
        let events = self.api.list_run_events(task_id, run_id, None);
        let events = events.query("limit", Some(200)).send_with_status().await;
        let (status, events) = events.expect("the run's events");
        assert_eq!(status, StatusCode::OK, "{events:?}");
        events.data
    }

    pub async fn healthy(&self) -> bool {
        self.http
            .get(format!("{}/healthz", self.base))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// Worker settings for tests: short leases and intervals so takeovers happen in seconds.
pub fn worker_args(lease_ms: u64) -> WorkerArgs {
    WorkerArgs {
        concurrency: 8,
        prefetch: 0,
        lease_ms,
        lease_margin_ms: None,
        heartbeat_timeout_ms: None,
        poll_interval_ms: 200,
        drain_timeout_ms: 2_000,
        reconcile_interval_ms: 500,
        history_retention_days: 0,
        artifact_max_bytes: 1024 * 1024,
        max_concurrent_per_workspace: None,
        run_env_passthrough: Vec::new(),
        media: Default::default(),
    }
}

/// The in-process worker shares its runtime with the test and the API: a lease that a
/// busy test body or a loaded machine cannot outlast between two heartbeats. (The tests
/// about lost leases use worker processes of their own.)
const IN_PROCESS_LEASE_MS: u64 = 6_000;

/// Keel's API (and optionally a worker) in this process, on a real socket.
pub struct TestApp {
    pub client: Client,
    pub db_url: String,
    pub pool: PgPool,
    pub data_dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl TestApp {
    /// API and worker, with no approval gates.
    pub async fn start() -> TestApp {
        TestApp::launch(true, "none").await
    }

    /// The API alone, with no approval gates: runs stay queued.
    pub async fn api_only() -> TestApp {
        TestApp::launch(false, "none").await
    }

    /// API and worker with the given `KEEL_APPROVAL_POLICIES`.
    pub async fn with_approvals(policies: &str) -> TestApp {
        TestApp::launch(true, policies).await
    }

    async fn launch(with_worker: bool, policies: &str) -> TestApp {
        let db_url = fresh_database().await;
        let pool = pool(&db_url).await;
        let data_dir = tempfile::tempdir().unwrap();
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let common = Common {
            database_url: Some(db_url.clone()),
            data_dir: data_dir.path().to_path_buf(),
            log: keel::config::LogArgs {
                log_format: LogFormat::Text,
            },
            db_max_connections: 10,
            approval_policies: policies.parse().expect("known approval policies"),
            model_prices: Default::default(),
            agent_system_prompt: String::new(),
            mcp_call_timeout_ms: 60_000,
            mcp_connect_timeout_ms: 30_000,
            mcp_stdio_commands: Vec::new(),
            approval_ttl_ms: 0,
            // The tests' in_place directories are temporary ones.
            workspace_roots: vec![std::env::temp_dir()],
            workspace_retention_ms: 24 * 3600 * 1000,
            content: Default::default(),
            timeouts: Default::default(),
            secrets: Default::default(),
            // The fake LLM (support::llm) listens on loopback.
            chat: keel::config::ChatArgs {
                chat_request_timeout_ms: 30_000,
                chat_allow_private_addresses: true,
            },
            provider_hosts: Vec::new(),
            sandbox: keel::config::SandboxArgs {
                sandbox: keel_workers::SandboxMode::Auto,
                sandbox_bwrap: "bwrap".into(),
                sandbox_uids: keel_workers::DEFAULT_SANDBOX_UIDS,
                sandbox_uid_locks: keel_workers::DEFAULT_SANDBOX_UID_LOCKS.into(),
                sandbox_read_only_paths: Vec::new(),
                sandbox_egress_allow: vec![RUNS_TEST_HOST.to_string()],
                // This process is the test binary: runs' network goes through the real one.
                sandbox_shim: Some(env!("CARGO_BIN_EXE_keel-sandbox-shim").into()),
                sandbox_pids: keel_workers::DEFAULT_RUN_LIMITS.pids,
                sandbox_memory: keel_workers::DEFAULT_RUN_LIMITS.memory,
                sandbox_nofile: keel_workers::DEFAULT_RUN_LIMITS.nofile,
            },
            quotas: Default::default(),
        };
        tokio::spawn(keel::api::serve(
            pool.clone(),
            listener,
            common.admission_rules().expect("consistent settings"),
            keel::artifacts::content::ContentStore::Postgres,
            Duration::from_millis(500),
            shutdown.clone(),
        ));
        if with_worker {
            let (pool, shutdown) = (pool.clone(), shutdown.clone());
            tokio::spawn(async move {
                keel::cli::run_worker(pool, &common, &worker_args(IN_PROCESS_LEASE_MS), shutdown)
                    .await
            });
        }
        let client = Client::new(base);
        wait_for(Duration::from_secs(10), "the API to answer", || async {
            client.healthy().await.then_some(())
        })
        .await;
        TestApp {
            client,
            db_url,
            pool,
            data_dir,
            shutdown,
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A real `keel` process; killed when dropped.
pub struct KeelProcess {
    pub child: Child,
    pub client: Option<Client>,
    pub log: PathBuf,
    /// The cgroups delegated to a worker that is not root: removed after it is killed.
    pub _delegated: Option<cgroups::Delegated>,
}

impl KeelProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal sent");
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "keel did not exit within {timeout:?}; log: {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL sent");
        self.child.wait().unwrap();
    }
}

impl Drop for KeelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keel_command(db_url: &str, log_dir: &Path, name: &str) -> (Command, PathBuf) {
    let_the_sandbox_through(log_dir);
    let log = log_dir.join(format!("{name}.log"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .env("KEEL_DATABASE_URL", db_url)
        .env(
            "RUST_LOG",
            std::env::var("KEEL_TEST_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (command, log)
}

/// A loopback port nothing listens on (the moment it is returned).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The address test servers that runs reach listen on. A run's network is its own, so
/// it reaches the host only through the egress proxy, which refuses loopback but for the
/// hosts the deployment lists: every test worker lists this one. It is not 127.0.0.1,
/// which a run's `NO_PROXY` keeps for the run's own loopback.
pub const RUNS_TEST_HOST: &str = "127.0.0.2";

/// Serves `app` where runs reach it through the egress proxy ([`RUNS_TEST_HOST`]) for the
/// rest of the test; returns its base URL.
pub async fn serve_for_runs(app: axum::Router) -> String {
    serve_at(RUNS_TEST_HOST, app).await
}

/// Serves `app` on a free loopback port for the rest of the test; returns its base URL.
pub async fn serve_on_loopback(app: axum::Router) -> String {
    serve_at("127.0.0.1", app).await
}

async fn serve_at(host: &str, app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, app).into_future());
    url
}

/// Gives `dir` and its ancestors below the temporary directory search permission for
/// others (`tempfile` makes them 0700): a root worker's runs are other uids, which must
/// pass through them to their workspaces, as through a deployment's data directory.
pub fn let_the_sandbox_through(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let temp = std::env::temp_dir();
    for ancestor in dir
        .ancestors()
        .take_while(|a| a.starts_with(&temp) && *a != temp)
    {
        if let Ok(meta) = std::fs::metadata(ancestor) {
            let mode = meta.permissions().mode() | 0o001;
            let _ = std::fs::set_permissions(ancestor, std::fs::Permissions::from_mode(mode));
        }
    }
}

/// The files named `name` anywhere beneath `root` (links not followed): where a run left a
/// marker, in whichever workspace it had.
pub fn files_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(files_named(&path, name)),
            Ok(_) if entry.file_name() == name => found.push(path),
            _ => {}
        }
    }
    found
}

/// Host pids of the live processes whose environment holds `entry` (`NAME=value`). A run's
/// own pids are its PID namespace's; the host finds its processes this way, by the home
/// directory in its workspace, say.
pub fn processes_with_env(entry: &str) -> Vec<i32> {
    let pids = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok());
    pids.filter(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        environ.split(|b| *b == 0).any(|e| e == entry.as_bytes())
    })
    .collect()
}

/// Starts `keel api` on a free port with no approval gates and waits until it answers.
pub async fn spawn_api(db_url: &str, log_dir: &Path, name: &str) -> KeelProcess {
    spawn_api_with_approvals(db_url, log_dir, name, "none").await
}

/// Starts `keel api` with the given `KEEL_APPROVAL_POLICIES`.
pub async fn spawn_api_with_approvals(
    db_url: &str,
    log_dir: &Path,
    name: &str,
    policies: &str,
) -> KeelProcess {
    spawn_api_with_env(
        db_url,
        log_dir,
        name,
        &[("KEEL_APPROVAL_POLICIES", policies)],
    )
    .await
}

/// Starts `keel api` with no approval gates and extra environment variables.
pub async fn spawn_api_with_env(
    db_url: &str,
    log_dir: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> KeelProcess {
    let process = start_api(db_url, log_dir, name, env);
    let client = process.client.clone().unwrap();
    wait_for(Duration::from_secs(20), "keel api to answer", || async {
        client.healthy().await.then_some(())
    })
    .await;
    process
}

/// Starts `keel api` on a free port, without waiting for it to answer.
pub fn start_api(db_url: &str, log_dir: &Path, name: &str, env: &[(&str, &str)]) -> KeelProcess {
    let port = free_port();
    let (mut command, log) = keel_command(db_url, log_dir, name);
    command.env("KEEL_APPROVAL_POLICIES", "none");
    command.envs(env.iter().copied());
    command.args([
        "api",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--stream-poll-ms",
        "500",
    ]);
    KeelProcess {
        child: command.spawn().unwrap(),
        client: Some(Client::new(format!("http://127.0.0.1:{port}"))),
        log,
        _delegated: None,
    }
}

/// Starts `keel worker` with a short lease.
pub fn spawn_worker(
    db_url: &str,
    log_dir: &Path,
    name: &str,
    lease_ms: u64,
    data_dir: &Path,
) -> KeelProcess {
    spawn_worker_with_env(db_url, log_dir, name, lease_ms, data_dir, &[])
}

/// Starts `keel worker` with a short lease and extra environment variables.
pub fn spawn_worker_with_env(
    db_url: &str,
    log_dir: &Path,
    name: &str,
    lease_ms: u64,
    data_dir: &Path,
    env: &[(&str, &str)],
) -> KeelProcess {
    spawn_worker_as(None, db_url, log_dir, name, lease_ms, data_dir, env)
}

/// A worker that is not root: its uid (and gid), and whether the deployment delegates it
/// cgroups, as systemd's `Delegate=yes` does, where it holds its runs to their limits.
#[derive(Debug, Clone, Copy)]
pub struct WorkerUser {
    pub uid: u32,
    pub delegated: bool,
}

/// [`spawn_worker_with_env`] as `user` when given.
pub fn spawn_worker_as(
    user: Option<WorkerUser>,
    db_url: &str,
    log_dir: &Path,
    name: &str,
    lease_ms: u64,
    data_dir: &Path,
    env: &[(&str, &str)],
) -> KeelProcess {
    let (mut command, log) = keel_command(db_url, log_dir, name);
    let mut delegated = None;
    if let Some(WorkerUser { uid, delegated: d }) = user {
        use std::os::unix::process::CommandExt;
        command.uid(uid).gid(uid);
        if d {
            let groups = cgroups::Delegated::to(uid);
            groups.join_on_spawn(&mut command);
            delegated = Some(groups);
        }
    }
    command.env("KEEL_SANDBOX_EGRESS_ALLOW", RUNS_TEST_HOST);
    command.envs(env.iter().copied());
    command.args([
        "worker",
        "--lease-ms",
        &lease_ms.to_string(),
        "--poll-interval-ms",
        "200",
        "--reconcile-interval-ms",
        "500",
        "--drain-timeout-ms",
        "1000",
        "--concurrency",
        "8",
    ]);
    command.env("KEEL_DATA_DIR", data_dir);
    KeelProcess {
        child: command.spawn().unwrap(),
        client: None,
        log,
        _delegated: delegated,
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Value,
}

/// Reads server-sent events from a streaming response.
pub struct SseReader {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
}

impl SseReader {
    pub async fn open(client: &Client, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut request = client.http.get(format!("{}{path}", client.base));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.expect("stream opened");
        Self::from_response(response)
            .await
            .unwrap_or_else(|(status, body)| panic!("{path}: {status} {body}"))
    }

    /// The stream of a response, or its status and body when it is not a 200.
    pub async fn from_response(
        response: reqwest::Response,
    ) -> Result<SseReader, (StatusCode, Value)> {
        let status = response.status();
        if status != StatusCode::OK {
            return Err((status, response.json().await.unwrap_or(Value::Null)));
        }
        Ok(SseReader {
            stream: response.bytes_stream().boxed(),
            buffer: String::new(),
        })
    }

    /// The next event (comments skipped), or None when the stream ends or `timeout` passes.
    pub async fn next(&mut self, timeout: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_frame(&frame) {
                    return Some(event);
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(chunk))) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }
}

fn parse_frame(frame: &str) -> Option<SseEvent> {
    let (mut id, mut event, mut data) = (None, None, String::new());
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    if data.is_empty() {
        return None;
    }
    Some(SseEvent {
        id,
        event,
        data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
    })
}

/// A client that sends `headers` with every request (credentials, a Host, …), on the raw
/// and the typed side alike.
pub fn client_with_headers(base: &str, headers: &[(&str, &str)]) -> Client {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        map.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_str(value).unwrap(),
        );
    }
    let api = keel_client::Client::with_headers(
        base,
        keel_client::Credentials::None,
        map.clone(),
        API_TIMEOUT,
    )
    .expect("a typed client");
    Client {
        base: base.to_string(),
        http: reqwest::Client::builder()
            .default_headers(map)
            .build()
            .unwrap(),
        api,
    }
}

impl KeelProcess {
    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "keel did not exit within {timeout:?}; log: {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Runs `keel <args>` with extra environment variables until it exits by itself (within
/// `timeout`); returns its exit status and output.
pub fn run_keel_until_exit(
    db_url: &str,
    log_dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> (std::process::ExitStatus, String) {
    let (mut command, log) = keel_command(db_url, log_dir, name);
    command.envs(env.iter().copied()).args(args);
    let mut process = KeelProcess {
        child: command.spawn().unwrap(),
        client: None,
        log,
        _delegated: None,
    };
    let status = process.wait_exit(timeout);
    (status, process.log_text())
}

/// A response's JSON body, or null for another content type (a live stream never ends:
/// its status and headers are the answer).
pub async fn json_or_null(response: reqwest::Response) -> Value {
    let is_json = response
        .headers()
        .get("content-type")
        .is_some_and(|t| t == "application/json");
    if is_json {
        response.json().await.unwrap()
    } else {
        Value::Null
    }
}

/// Sends `request` as it is over a new connection to the API at `base` and returns the
/// response's status code and body, read until the server closes.
pub async fn raw_exchange(base: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

/// Every table's rows, as text, that contain `needle`.
pub async fn rows_containing(db_url: &str, needle: &str) -> Vec<String> {
    let pool = pool(db_url).await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut found = Vec::new();
    for table in tables {
        let statement = format!("SELECT t::text FROM \"{table}\" t WHERE t::text LIKE $1");
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(statement))
            .bind(format!("%{needle}%"))
            .fetch_all(&pool)
            .await
            .unwrap();
        found.extend(rows.into_iter().map(|row| format!("{table}: {row}")));
    }
    found
}
