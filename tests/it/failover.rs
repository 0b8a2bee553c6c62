//! Failover, with real `keel` processes: a PostgreSQL primary and a synchronous standby made
//! with `pg_basebackup`, the API and a worker reaching them through one address (a proxy, as
//! a virtual IP). Under a stream of shell runs started through the API, the primary is killed
//! (`pg_ctl stop -m immediate`), the standby promoted and the address moved to it: every run
//! whose start the API acknowledged completes exactly once (one terminal status, one
//! `run.finished`, its line in a shared file once). The recovery time is printed, not
//! asserted.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::proxy::DelayProxy;
use crate::support::{Client, spawn_api, spawn_worker_with_env, wait_for};
use keel_client::{EventType, ObjectEnvelope, RunRecord, RunStatus, TaskRecord};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::json;
use sqlx::{Connection, PgConnection};

/// Long enough that the switch (a kill, a promotion, a move) fits inside one lease: the
/// worker's runs in flight keep their leases instead of being stopped and run again.
const LEASE_MS: u64 = 10_000;
const BEFORE: usize = 8;
const AFTER: usize = 8;
const LONG: Duration = Duration::from_secs(60);

/// One PostgreSQL server of the pair, run as the `postgres` user (the tests run as root).
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
}

impl Server {
    fn url(&self, password: &str, database: &str) -> String {
        format!(
            "postgres://keel:{password}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    fn pg_ctl(&self, args: &[&str]) {
        as_postgres(&self.bin.join("pg_ctl"), |c| {
            c.arg("-D").arg(&self.data).args(args);
        });
    }

    fn start(&self, log: &Path, settings: &str) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c max_connections=200 -c fsync=off {settings}",
            self.port
        );
        self.pg_ctl(&["-l", log.to_str().unwrap(), "-o", &options, "-w", "start"]);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate"])
            .output();
    }
}

/// Runs `program` as `postgres`, configured by `configure`, and asserts it succeeded.
fn as_postgres(program: &Path, configure: impl FnOnce(&mut Command)) {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--"]).arg(program);
    configure(&mut command);
    let output = command.output().expect("runuser runs");
    assert!(
        output.status.success(),
        "{program:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn postgres_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL under /usr/lib/postgresql")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("pg_basebackup").exists())
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL with pg_basebackup")
}

/// A primary whose commits wait for the standby named `standby`, and that standby, streaming
/// from it; returns them with the superuser's password once the standby is synchronous.
async fn synchronous_pair(root: &Path) -> (Server, Server, String) {
    let bin = postgres_bin();
    std::fs::create_dir_all(root).unwrap();
    support::let_the_sandbox_through(root);
    let password = keel::domain::new_id("pw").replace('_', "");
    let password_file = root.join("password");
    std::fs::write(&password_file, &password).unwrap();
    let chown = Command::new("chown")
        .arg("-R")
        .arg("postgres:")
        .arg(root)
        .status()
        .unwrap();
    assert!(chown.success());
    let primary = Server {
        bin: bin.clone(),
        data: root.join("primary"),
        port: support::free_port(),
    };
    as_postgres(&bin.join("initdb"), |c| {
        c.arg("-D")
            .arg(&primary.data)
            .arg("--pwfile")
            .arg(&password_file);
        c.args([
            "-U",
            "keel",
            "--auth=scram-sha-256",
            "--no-locale",
            "--no-sync",
        ]);
    });
    primary.start(
        &root.join("primary.log"),
        "-c wal_level=replica -c synchronous_commit=on -c synchronous_standby_names=standby",
    );
    let standby = Server {
        bin: bin.clone(),
        data: root.join("standby"),
        port: support::free_port(),
    };
    as_postgres(&bin.join("pg_basebackup"), |c| {
        c.env("PGPASSWORD", &password)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "keel", "-D"])
            .arg(&standby.data)
            .args(["-R", "-X", "stream", "-c", "fast"]);
    });
    // Named, so that the primary's synchronous_standby_names matches it (-R wrote one
    // without application_name; the later line wins).
    let conninfo = format!(
        "\nprimary_conninfo = 'host=127.0.0.1 port={} user=keel password={password} application_name=standby'\n",
        primary.port
    );
    let auto_conf = standby.data.join("postgresql.auto.conf");
    let mut settings = std::fs::read_to_string(&auto_conf).unwrap();
    settings.push_str(&conninfo);
    std::fs::write(&auto_conf, settings).unwrap();
    standby.start(&root.join("standby.log"), "");
    let admin = support::pool(&primary.url(&password, "postgres")).await;
    wait_for(LONG, "the standby to be synchronous", || async {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'",
        )
        .fetch_optional(&admin)
        .await
        .unwrap();
        (state.as_deref() == Some("sync")).then_some(())
    })
    .await;
    sqlx::query("CREATE DATABASE keel")
        .execute(&admin)
        .await
        .unwrap();
    let mut keel_db = PgConnection::connect(&primary.url(&password, "keel"))
        .await
        .unwrap();
    keel::db::MIGRATOR.run(&mut keel_db).await.unwrap();
    (primary, standby, password)
}

/// A run whose start the API acknowledged, and the line it appends to the shared file.
struct Acknowledged {
    task_id: String,
    run_id: String,
    line: String,
    at: Instant,
}

/// The resource a POST to `path` answered with 201 (sent raw: the acknowledgement is that
/// status); None for any other answer or none.
async fn created<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    body: &serde_json::Value,
) -> Option<T> {
    let response = client
        .http
        .post(format!("{}{path}", client.base))
        .json(body)
        .send()
        .await
        .ok()?;
    if response.status() != StatusCode::CREATED {
        return None;
    }
    let envelope: ObjectEnvelope<T> = response.json().await.ok()?;
    Some(envelope.data)
}

/// Creates and starts a shell run appending `line` to `effects`; `None` unless both
/// requests were acknowledged (a start that failed may or may not exist: it is not counted).
async fn try_start(client: &Client, effects: &Path, line: &str) -> Option<Acknowledged> {
    let command = format!("echo {line} >> {}", effects.display());
    let body = json!({ "execution_kind": "shell", "shell_command": command });
    let task: TaskRecord = created(client, "/v1/tasks", &body).await?;
    let start = format!("/v1/tasks/{}/start", task.id);
    let run: RunRecord = created(client, &start, &json!({})).await?;
    Some(Acknowledged {
        run_id: run.id,
        task_id: task.id,
        line: line.to_string(),
        at: Instant::now(),
    })
}

/// Starts runs one after another until `stop`, keeping the acknowledged ones.
fn load(
    client: Client,
    effects: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (
    Arc<Mutex<Vec<Acknowledged>>>,
    tokio::task::JoinHandle<usize>,
) {
    let acknowledged: Arc<Mutex<Vec<Acknowledged>>> = Arc::default();
    let record = acknowledged.clone();
    let handle = tokio::spawn(async move {
        let mut attempts = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            attempts += 1;
            match try_start(&client, &effects, &format!("run-{attempts}")).await {
                Some(run) => record.lock().unwrap().push(run),
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        attempts
    });
    (acknowledged, handle)
}

fn acknowledged_count(runs: &Mutex<Vec<Acknowledged>>, since: Option<Instant>) -> usize {
    let runs = runs.lock().unwrap();
    runs.iter()
        .filter(|r| since.is_none_or(|at| r.at > at))
        .count()
}

#[tokio::test]
async fn every_acknowledged_start_completes_once_across_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let (primary, standby, password) = synchronous_pair(&dir.path().join("pg")).await;
    let proxy = DelayProxy::freezable(&primary.url(&password, "keel")).await;
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let api = spawn_api(&proxy.url, &logs, "api").await;
    let client = api.client.clone().unwrap();
    let worker = spawn_worker_with_env(
        &proxy.url,
        &logs,
        "worker",
        LEASE_MS,
        &dir.path().join("data"),
        &[("KEEL_SANDBOX", "off")],
    );
    let effects = dir.path().join("effects");
    std::fs::write(&effects, "").unwrap();
    support::let_the_sandbox_through(&effects);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (runs, loader) = load(client.clone(), effects.clone(), stop.clone());
    wait_for(LONG, "runs started before the failover", || async {
        (acknowledged_count(&runs, None) >= BEFORE).then_some(())
    })
    .await;
    // The failover meets a worker mid-stream, not one still starting (which waits for the
    // database instead: partition::a_worker_started_before_its_database_answers_waits_for_it).
    wait_for(LONG, "the worker's first run", || async {
        let written = std::fs::read_to_string(&effects).unwrap_or_default();
        (!written.is_empty()).then_some(())
    })
    .await;

    let failed_over = Instant::now();
    primary.pg_ctl(&["stop", "-m", "immediate"]);
    standby.pg_ctl(&["promote", "-w"]);
    proxy.retarget(&standby.url(&password, "keel"));
    let promoted = failed_over.elapsed();
    let first_after = wait_for(LONG, "a run started after the failover", || async {
        let runs = runs.lock().unwrap();
        let run = runs.iter().find(|r| r.at > failed_over)?;
        Some((run.task_id.clone(), run.run_id.clone()))
    })
    .await;
    client
        .wait_status(&first_after.0, &first_after.1, RunStatus::Completed, LONG)
        .await;
    let recovered = failed_over.elapsed();
    wait_for(LONG, "runs started after the failover", || async {
        (acknowledged_count(&runs, Some(failed_over)) >= AFTER).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let attempts = loader.await.unwrap();

    let runs = std::mem::take(&mut *runs.lock().unwrap());
    for run in &runs {
        let done = client.wait_terminal(&run.task_id, &run.run_id, LONG).await;
        assert_eq!(done.status, RunStatus::Completed, "{done:?}");
        let events = client.events(&run.task_id, &run.run_id).await;
        let finished = events
            .iter()
            .filter(|e| e.event_type == EventType::RunFinished)
            .count();
        assert_eq!(finished, 1, "{}: {events:?}", run.run_id);
    }
    let written = std::fs::read_to_string(&effects).unwrap();
    for run in &runs {
        let times = written.lines().filter(|l| *l == run.line).count();
        assert_eq!(
            times,
            1,
            "{} ({}) ran {times} times; worker's log:\n{}",
            run.line,
            run.run_id,
            std::fs::read_to_string(&worker.log).unwrap()
        );
    }
    // An unacknowledged start may have run, but nothing ran twice.
    let mut lines: Vec<&str> = written.lines().collect();
    let all = lines.len();
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), all, "a run's side effect twice: {written}");
    let rewritten = std::fs::read_to_string(&worker.log)
        .unwrap()
        .matches("could not write the attempt's end; trying again")
        .count();
    eprintln!(
        "failover figures (lease {LEASE_MS} ms): {} acknowledged of {attempts} starts tried, \
         kill + promote + move took {promoted:?}; from the kill to the first run started \
         after it seen completed {recovered:?}; attempt ends written again {rewritten}",
        runs.len(),
    );
}
