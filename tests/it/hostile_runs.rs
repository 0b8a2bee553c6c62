//! A hostile tenant attacks through what its runs execute, in remote mode with two orgs and
//! real `keel api` and `keel worker` processes: org b's shell runs try to read the
//! worker's secrets, the data directory and org a's workspace, to signal the worker, and to
//! pass as the worker's uid. Each attack runs against both sandbox modes that take
//! tenants: `isolated` (a root worker; each run a uid of its own) and `namespaces` (a worker
//! that is not root, in cgroups delegated to it), and each asserts the attack failed and org
//! a's data is untouched. Org b's fork bomb and memory hog end at their run's limits while
//! org a's runs complete. The mode that takes no tenants, `off`, and a worker that can hold
//! no run to its limits refuse to start in remote mode. And org b's member names a program
//! as a stdio MCP server, which its workspace's policy denies.

use crate::support;
use crate::support::{in_place, two_orgs};

use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::cgroups::cgroup_of;
use crate::support::llm::{FakeLlm, Turn};
use crate::support::{Client, KeelProcess, WorkerUser};
use keel_client::{
    ApprovalPolicyRequest, GateDecision, GateDecisions, McpServer, RunStatus, TaskDraft,
};
use reqwest::StatusCode;
use serde_json::json;
use two_orgs::{REMOTE_ENV, SHARED_SECRET, operator_client, org_client, runtime_operator_client};

const SOON: Duration = Duration::from_secs(30);
/// What the worker and the API were started with that no run may learn.
const OPERATOR_KEY: (&str, &str) = ("OPENAI_API_KEY", "canary-operator-openai-key");
const PG_PASSWORD: &str = "canary-embedded-postgres-password";
const ORG_A_FILE: &str = "org-a-private-contents";
/// The uid of the worker that is not root.
const NOBODY: u32 = 65534;

#[derive(Debug, Clone, Copy)]
enum Mode {
    Isolated,
    Namespaces,
}

impl Mode {
    const ALL: [Mode; 2] = [Mode::Isolated, Mode::Namespaces];

    fn setting(self) -> &'static str {
        match self {
            Mode::Isolated => "isolated",
            Mode::Namespaces => "namespaces",
        }
    }

    fn worker_uid(self) -> Option<u32> {
        match self {
            Mode::Isolated => None,
            Mode::Namespaces => Some(NOBODY),
        }
    }

    /// The worker that is not root gets cgroups of its own, as a deployment gives them.
    fn worker_user(self) -> Option<WorkerUser> {
        let uid = self.worker_uid()?;
        Some(WorkerUser {
            uid,
            delegated: true,
        })
    }
}

/// Two orgs on one API and one worker; org a has run once and left a file behind.
struct Hostile {
    a: Client,
    b: Client,
    data: PathBuf,
    /// Org a's workspace, as its run printed it.
    a_workspace: PathBuf,
    /// The database's URL, the API's base URL.
    db: String,
    api: String,
    worker: KeelProcess,
    _api: KeelProcess,
    _logs: tempfile::TempDir,
}

async fn hostile(mode: Mode) -> Hostile {
    hostile_with(mode, &[]).await
}

/// [`hostile`] with `extra` added to the API's and the worker's variables.
async fn hostile_with(mode: Mode, extra: &[(&str, &str)]) -> Hostile {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(logs.path());
    let data = logs.path().join("data");
    plant_data_dir(&data, mode.worker_uid());
    let mut env = REMOTE_ENV.to_vec();
    env.extend([OPERATOR_KEY, ("KEEL_SANDBOX", mode.setting())]);
    env.extend(extra);
    let api_env = [REMOTE_ENV.as_slice(), extra].concat();
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &api_env).await;
    let worker = support::spawn_worker_as(
        mode.worker_user(),
        &db,
        logs.path(),
        "worker",
        30_000,
        &data,
        &env,
    );
    let base = api.client.as_ref().unwrap().base.clone();
    let (a, b) = (org_client(&base, "a"), org_client(&base, "b"));
    let out = run(&a, &format!("echo {ORG_A_FILE} > private.txt; pwd")).await;
    let a_workspace = PathBuf::from(out.lines().last().unwrap());
    assert_eq!(
        read(&a_workspace.join("private.txt")),
        format!("{ORG_A_FILE}\n")
    );
    Hostile {
        a,
        b,
        data,
        a_workspace,
        db,
        api: base,
        worker,
        _api: api,
        _logs: logs,
    }
}

/// The data directory as the worker's own: with a password file where the embedded
/// cluster keeps one.
fn plant_data_dir(data: &Path, owner: Option<u32>) {
    let password = data.join("postgres/password");
    std::fs::create_dir_all(password.parent().unwrap()).unwrap();
    std::fs::write(&password, PG_PASSWORD).unwrap();
    if let Some(uid) = owner {
        for path in [data, password.parent().unwrap(), &password] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }
}

/// Runs `script` as a shell task of `client`'s org to its end; returns what it printed
/// (stderr folded in by the script itself).
async fn run(client: &Client, script: &str) -> String {
    completed_run(client, script).await.2
}

/// [`run`], with the task's and the run's ids.
async fn completed_run(client: &Client, script: &str) -> (String, String, String) {
    let (task_id, run_id) = client.run_shell(script).await;
    let run = client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, keel_client::RunStatus::Completed, "{run:?}");
    let out = client.stdout(&task_id, &run_id).await;
    (task_id, run_id, out)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Org a's file, and the workspace around it, are as its run left them.
fn assert_org_a_untouched(h: &Hostile) {
    assert_eq!(
        read(&h.a_workspace.join("private.txt")),
        format!("{ORG_A_FILE}\n")
    );
}

#[tokio::test]
async fn a_run_cannot_read_the_worker_s_secrets() {
    for mode in Mode::ALL {
        let h = hostile(mode).await;
        let worker = h.worker.pid();
        let script = format!(
            "cat /proc/$PPID/environ /proc/1/environ /proc/{worker}/environ 2>&1; \
             for f in /proc/[0-9]*/environ; do cat $f; done 2>&1; env; true"
        );
        let out = run(&h.b, &script).await;
        for secret in [SHARED_SECRET, OPERATOR_KEY.1] {
            assert!(
                !out.contains(secret),
                "{mode:?}: a secret reached the run: {out}"
            );
        }
        // Nor does the worker keep them where the host's root could read them: the block
        // the kernel shows is zeroed, and the process is not dumpable (its /proc files are
        // root's, whoever it runs as).
        let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        for secret in [SHARED_SECRET, OPERATOR_KEY.1] {
            assert!(
                !environ.contains(secret),
                "{mode:?}: {secret} in the worker's environ"
            );
        }
        let owner = std::fs::metadata(format!("/proc/{worker}/environ"))
            .unwrap()
            .uid();
        assert_eq!(owner, 0, "{mode:?}: the worker is dumpable");
        // The sealed environment still resolves what runs need: org a's run completed, and
        // the worker still serves runs after being probed.
        assert!(
            run(&h.a, "echo still-serving")
                .await
                .contains("still-serving")
        );
    }
}

#[tokio::test]
async fn a_run_cannot_reach_the_data_directory_or_another_org_s_workspace() {
    for mode in Mode::ALL {
        let h = hostile(mode).await;
        let (data, theirs) = (h.data.display(), h.a_workspace.display());
        let script = format!(
            "ls -la .. ../.. {data} {data}/workspaces 2>&1; cat {data}/postgres/password 2>&1; \
             cat {theirs}/private.txt 2>&1; cat ../*/private.txt 2>&1; rm -rf {theirs} 2>&1; \
             find / -name private.txt 2>/dev/null | sed 's/^/found: /'; touch /usr/keel-run /etc/keel-run 2>&1; true"
        );
        let out = run(&h.b, &script).await;
        assert!(!out.contains(PG_PASSWORD), "{mode:?}: {out}");
        assert!(!out.contains(ORG_A_FILE), "{mode:?}: {out}");
        assert!(
            !out.contains("found: "),
            "{mode:?}: org a's file was found: {out}"
        );
        assert!(!Path::new("/usr/keel-run").exists() && !Path::new("/etc/keel-run").exists());
        assert_org_a_untouched(&h);
    }
}

#[tokio::test]
async fn a_run_cannot_signal_the_worker_or_see_its_processes() {
    for mode in Mode::ALL {
        let mut h = hostile(mode).await;
        let worker = h.worker.pid();
        let script = format!(
            "kill -0 {worker} 2>/dev/null && echo SIGNALLED; kill -9 {worker} 2>&1; \
             kill -9 -1 2>&1; ls /proc | grep -c '^[0-9]'; true"
        );
        let out = run(&h.b, &script).await;
        assert!(!out.contains("SIGNALLED"), "{mode:?}: {out}");
        // Its own processes only: the jail's init, the shell, ls and grep.
        let visible: usize = out.lines().last().unwrap().trim().parse().unwrap();
        assert!(
            visible <= 5,
            "{mode:?}: the run sees {visible} processes: {out}"
        );
        assert!(
            h.worker.child.try_wait().unwrap().is_none(),
            "{mode:?}: the worker died"
        );
        assert!(run(&h.a, "echo alive").await.contains("alive"));
        assert_org_a_untouched(&h);
    }
}

#[tokio::test]
async fn a_run_is_not_the_worker_s_uid_nor_another_run_s() {
    for mode in Mode::ALL {
        let h = hostile(mode).await;
        let out = run(&h.b, "id -u; touch mine; stat -c %u mine").await;
        let ids: Vec<u32> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
        let worker_uid = mode.worker_uid().unwrap_or(0);
        assert_ne!(ids[0], worker_uid, "{mode:?}: {out}");
        assert_eq!(ids[0], ids[1], "{mode:?}: {out}");
        let a_owner = std::fs::metadata(h.a_workspace.join("private.txt"))
            .unwrap()
            .uid();
        match mode {
            // Each attempt a uid of its own outside too.
            Mode::Isolated => assert_ne!(a_owner, worker_uid),
            // Outside the namespaces the run has the worker's uid: that is the mode.
            Mode::Namespaces => assert_eq!(a_owner, NOBODY),
        }
        assert_org_a_untouched(&h);
    }
}

/// The modes that cannot keep tenants apart refuse to start rather than run them.
#[tokio::test]
async fn a_worker_without_the_sandbox_refuses_to_start_in_remote_mode() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let refusals = [
        ("off", "refused in remote mode"),
        // A root worker's runs would be root outside their namespaces.
        ("namespaces", "runs as root"),
    ];
    for (mode, reason) in refusals {
        let mut env = REMOTE_ENV.to_vec();
        env.push(("KEEL_SANDBOX", mode));
        let data = logs.path().join(mode);
        let mut worker =
            support::spawn_worker_with_env(&db, logs.path(), mode, 30_000, &data, &env);
        let status = worker.wait_exit(SOON);
        assert!(!status.success(), "KEEL_SANDBOX={mode} started");
        assert!(worker.log_text().contains(reason), "{}", worker.log_text());
    }
    // A worker that is not root, with no cgroup delegated to it, could limit no run.
    let mut env = REMOTE_ENV.to_vec();
    env.push(("KEEL_SANDBOX", "namespaces"));
    let data = logs.path().join("undelegated");
    plant_data_dir(&data, Some(NOBODY));
    let user = WorkerUser {
        uid: NOBODY,
        delegated: false,
    };
    let mut worker = support::spawn_worker_as(
        Some(user),
        &db,
        logs.path(),
        "undelegated",
        30_000,
        &data,
        &env,
    );
    let status = worker.wait_exit(SOON);
    assert!(!status.success(), "a worker without limits started");
    let log = worker.log_text();
    assert!(log.contains("can set no pids or memory limit"), "{log}");
}

/// Limits small enough for the attacks below to meet them at once.
const LIMITS: [(&str, &str); 2] = [("KEEL_SANDBOX_PIDS", "64"), ("KEEL_SANDBOX_MEMORY", "128M")];

/// The number after `key` in a cgroup file of `key value` lines.
fn counted(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        line.strip_prefix(key)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Org b's fork bomb stops at its run's pids limit: the kernel refuses its forks past 64
/// processes in the run's cgroup, org a's run starts and completes meanwhile, and the
/// bomb's run, ended by its timeout, fails with `pids_limit_reached`. The bomb is bounded
/// (511 processes), so that where there is no limit it cannot take the host down.
#[tokio::test]
async fn a_fork_bomb_stops_at_its_pids_limit_while_another_org_s_run_completes() {
    for mode in Mode::ALL {
        let mut h = hostile_with(mode, &LIMITS).await;
        // The bomb goes off in a subshell: a shell whose fork is refused exits, and the
        // run's own shell must outlive that to be ended by its timeout.
        let bomb = "bomb() { if [ \"$1\" -lt 8 ]; then bomb $(($1 + 1)) & bomb $(($1 + 1)) & fi; \
                    exec sleep 60; }; (bomb 0); exec sleep 60";
        let draft = TaskDraft {
            timeout_ms: Some(20_000),
            ..support::shell(bomb)
        };
        let (task_id, run_id) = h.b.start_task(&draft).await;
        // The run's processes are found by their environment; the kernel's figures are
        // those of the cgroup they are in.
        let entry = format!("KEEL_RUN_ID={run_id}");
        let group = support::wait_for(SOON, "the bomb to meet its limit", || async {
            let pid = *support::processes_with_env(&entry).first()?;
            let group = cgroup_of(pid, "pids")?;
            let events = std::fs::read_to_string(group.join("pids.events")).ok()?;
            (counted(&events, "max")? > 0).then_some(group)
        })
        .await;
        let figure = |file: &str| -> u64 {
            let text = std::fs::read_to_string(group.join(file)).unwrap();
            text.trim().parse().unwrap()
        };
        assert_eq!(figure("pids.max"), 64, "{mode:?}");
        assert!(figure("pids.current") <= 64, "{mode:?}");
        if group.join("pids.peak").exists() {
            assert!(figure("pids.peak") <= 64, "{mode:?}");
        }

        assert!(run(&h.a, "echo alive").await.contains("alive"));
        let bombing = h.b.run(&task_id, &run_id).await;
        assert_eq!(bombing.status, RunStatus::Running, "{mode:?}: {bombing:?}");

        let ended = h.b.wait_terminal(&task_id, &run_id, SOON).await;
        assert_eq!(ended.status, RunStatus::Failed, "{mode:?}: {ended:?}");
        let error = ended.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("pids_limit_reached: "),
            "{mode:?}: {error}"
        );
        assert!(
            error.contains("64 at once; timed out after 20000 ms"),
            "{error}"
        );
        assert_survived(&mut h, mode, "pids 64 (cgroup v");
    }
}

/// Org b's memory hog is killed at its run's memory limit, and the run fails with
/// `memory_limit_exceeded`, while org a's run completes. The hog stops at 1 GiB, so that
/// where there is no limit it cannot take the host down.
#[tokio::test]
async fn a_memory_hog_is_killed_at_its_memory_limit_while_another_org_s_run_completes() {
    for mode in Mode::ALL {
        let mut h = hostile_with(mode, &LIMITS).await;
        let hog = "python3 -c \"chunks = []\nfor _ in range(128): chunks.append(b'x' * (8 << 20))\n\
                   print('allocated 1 GiB')\"";
        let (task_id, run_id) = h.b.run_shell(hog).await;
        assert!(run(&h.a, "echo alive").await.contains("alive"));

        let ended = h.b.wait_terminal(&task_id, &run_id, SOON).await;
        assert_eq!(ended.status, RunStatus::Failed, "{mode:?}: {ended:?}");
        let error = ended.last_error.as_deref().unwrap_or_default();
        let killed = "memory_limit_exceeded: the kernel killed ";
        assert!(error.starts_with(killed), "{mode:?}: {error}");
        assert!(error.contains("limit of 128 MiB; process "), "{error}");
        assert!(!h.b.stdout(&task_id, &run_id).await.contains("allocated"));
        assert_survived(&mut h, mode, "memory 128 MiB without swap (cgroup v");
    }
}

/// The worker lives on, org a's data is untouched, and the worker logged the limit in
/// effect (`logged`) at start-up.
fn assert_survived(h: &mut Hostile, mode: Mode, logged: &str) {
    let alive = h.worker.child.try_wait().unwrap().is_none();
    assert!(alive, "{mode:?}: the worker died");
    assert_org_a_untouched(h);
    let log = h.worker.log_text();
    assert!(log.contains(logged), "{mode:?}: {log}");
}

/// The port of a `scheme://host:port/…` URL.
fn port_of(url: &str) -> u16 {
    reqwest::Url::parse(url).unwrap().port().unwrap()
}

/// Starts a run of org a that listens on `port` of its own loopback and writes `accepted`
/// into its workspace when anything connects; returns its ids and workspace once it
/// listens.
async fn listening_run(a: &Client, port: u16) -> (String, String, PathBuf) {
    let script = format!(
        "pwd; python3 -c \"import socket\ns = socket.socket()\n\
         s.bind(('127.0.0.1', {port}))\ns.listen()\nprint('listening', flush=True)\n\
         s.accept()\nopen('accepted', 'w').write('x')\""
    );
    let (task_id, run_id) = a.run_shell(&script).await;
    let out = support::wait_for(SOON, "org a's run to listen", || async {
        let out = a.stdout_so_far(&task_id, &run_id).await?;
        out.contains("listening").then_some(out)
    })
    .await;
    let workspace = PathBuf::from(out.lines().next().unwrap());
    (task_id, run_id, workspace)
}

/// Whether anything connected to `listener` (accepted and dropped if so).
fn was_reached(listener: &std::net::TcpListener) -> bool {
    match listener.accept() {
        Ok(_) => true,
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(error) => panic!("accept failed: {error}"),
    }
}

/// From inside a run with network, nothing of the host's network is in reach: not the
/// API, not a signer on loopback, not the database, not the cloud metadata address, not
/// another run's listener, directly or through the egress proxy (by HTTP or SOCKS5), and
/// none of the host's abstract Unix sockets. Every attempt through the proxy is refused
/// and recorded in the run's `egress` step.
#[tokio::test]
async fn a_run_reaches_none_of_the_host_s_listeners() {
    for mode in Mode::ALL {
        let h = hostile(mode).await;
        let signer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        signer.set_nonblocking(true).unwrap();
        // An abstract Unix socket of the host's, as the uid reservations once were.
        let name = SocketAddr::from_abstract_name(b"keel-hostile-abstract").unwrap();
        let _abstract = UnixListener::bind_addr(&name).unwrap();
        let other_run_port = support::free_port();
        let (a_task, a_run, a_workspace) = listening_run(&h.a, other_run_port).await;
        let targets = [
            ("api", port_of(&h.api)),
            ("signer", signer.local_addr().unwrap().port()),
            ("database", port_of(&h.db)),
            ("other-run", other_run_port),
        ];
        let mut script = String::new();
        for (name, port) in targets {
            script.push_str(&format!(
                "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo direct:{name}; \
                 curl -sS -m 5 --noproxy '' http://127.0.0.1:{port}/ 2>&1; echo; \
                 curl -sS -m 5 --noproxy '' -x socks5h://127.0.0.1:1080 http://localhost:{port}/ 2>&1; echo; "
            ));
        }
        script.push_str(
            "curl -sS -m 5 http://169.254.169.254/latest/meta-data/ 2>&1; echo; \
             grep -c @keel-hostile-abstract /proc/net/unix; true",
        );
        let (task_id, run_id, out) = completed_run(&h.b, &script).await;
        assert!(!out.contains("direct:"), "{mode:?}: {out}");
        assert_eq!(
            out.lines().last(),
            Some("0"),
            "{mode:?}: abstract sockets: {out}"
        );
        assert!(!was_reached(&signer), "{mode:?}: the signer was reached");

        let egress = h.b.egress(&task_id, &run_id).await.expect("an egress step");
        assert_eq!(egress["connections"], 0, "{mode:?}: {egress}");
        let refused: Vec<&str> = egress["refusals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|refusal| refusal["destination"].as_str().unwrap())
            .collect();
        for (name, port) in targets {
            for destination in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
                assert!(
                    refused.contains(&destination.as_str()),
                    "{mode:?}: {name} at {destination} not refused: {egress}"
                );
            }
        }
        assert!(
            refused.contains(&"169.254.169.254:80"),
            "{mode:?}: {egress}"
        );

        let cancel = format!("/v1/tasks/{a_task}/runs/{a_run}/cancel");
        h.a.post_empty(&cancel).await;
        h.a.wait_terminal(&a_task, &a_run, SOON).await;
        assert!(
            !a_workspace.join("accepted").exists(),
            "{mode:?}: org a's listener was reached"
        );
    }
}

/// A host the deployment allows one workspace (`org_a=host:port`) is that workspace's
/// alone: org a's run reaches it through its proxy; org b's run is refused it, as any
/// private address, and the refusal is recorded in its `egress` step.
#[tokio::test]
async fn a_workspace_s_allowed_host_is_no_other_workspace_s() {
    let registry =
        axum::Router::new().route("/", axum::routing::get(|| async { "org-a-registry" }));
    let registry = support::serve_on_loopback(registry).await;
    let host_port = registry.trim_start_matches("http://").to_string();
    let allow = format!("org_a={host_port}");
    let h = hostile_with(Mode::Isolated, &[("KEEL_SANDBOX_EGRESS_ALLOW", &allow)]).await;
    // `--noproxy ''`: a run's NO_PROXY keeps 127.0.0.1 for its own loopback.
    let fetch = format!("curl -sS -m 5 --noproxy '' {registry}/ 2>&1; echo");

    assert!(run(&h.a, &fetch).await.contains("org-a-registry"));

    let (task_id, run_id, out) = completed_run(&h.b, &fetch).await;
    assert!(!out.contains("org-a-registry"), "{out}");
    assert!(out.contains("is not a public address"), "{out}");
    let egress = h.b.egress(&task_id, &run_id).await.expect("an egress step");
    assert_eq!(egress["connections"], 0, "{egress}");
    assert_eq!(egress["refusals"][0]["destination"], host_port, "{egress}");
}

/// A run that binds the names every worker of the host once took sandbox uids by (abstract
/// Unix sockets) holds nothing another org's runs need: they still start.
#[tokio::test]
async fn a_run_cannot_squat_the_sandbox_uids() {
    let (first, last) = (1_900_950_000u32, 1_900_950_002u32);
    let uids = format!("{first}-{last}");
    let h = hostile_with(Mode::Isolated, &[("KEEL_SANDBOX_UIDS", &uids)]).await;
    let squat = format!(
        "python3 -c \"import socket, time\nheld = []\n\
         for uid in range({first}, {}):\n    s = socket.socket(socket.AF_UNIX)\n\
         \x20   s.bind('\\0keel-sandbox-uid-%d' % uid)\n    held.append(s)\n\
         print('squatted', len(held), flush=True)\ntime.sleep(120)\"",
        last + 1
    );
    let (task_id, run_id) = h.b.run_shell(&squat).await;
    support::wait_for(SOON, "org b's run to squat", || async {
        let out = h.b.stdout_so_far(&task_id, &run_id).await?;
        out.contains("squatted 3").then_some(())
    })
    .await;
    for _ in 0..2 {
        assert!(run(&h.a, "echo started").await.contains("started"));
    }
    let cancel = format!("/v1/tasks/{task_id}/runs/{run_id}/cancel");
    h.b.post_empty(&cancel).await;
}

/// The symlink race: whoever may write the parent of org b's `in_place` directories (a
/// process of the host here; a run cannot, since no task's directory may contain
/// another's) swaps them for links to org a's root, over and over, while those tasks run
/// 200 times. Each run either works in its own directory or is refused: none ever sees
/// org a's tree, and nothing of org a's is handed to org b's uids.
#[tokio::test]
async fn a_swapped_link_never_moves_a_run_into_another_org_s_directory() {
    const VICTIMS: usize = 8;
    const ROUNDS: usize = 25;
    let roots = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(roots.path());
    let root = std::fs::canonicalize(roots.path()).unwrap();
    let org_a = root.join("org_a");
    std::fs::create_dir_all(&org_a).unwrap();
    std::fs::write(org_a.join("secret"), ORG_A_FILE).unwrap();
    std::fs::set_permissions(org_a.join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
    let parent = root.join("org_b/parent");
    for n in 0..VICTIMS {
        std::fs::create_dir_all(parent.join(format!("victim{n}"))).unwrap();
    }
    let roots_setting = root.to_str().unwrap();
    let h = hostile_with(Mode::Isolated, &[("KEEL_WORKSPACE_ROOTS", roots_setting)]).await;

    // Created before the swapping starts: a link met at creation is refused there.
    let mut victims = Vec::new();
    for n in 0..VICTIMS {
        let directory = parent.join(format!("victim{n}"));
        let task =
            h.b.create_task(&in_place(&directory, "ls -la; cat secret 2>&1; true"))
                .await;
        victims.push(task.id);
    }
    let swapping = Arc::new(AtomicBool::new(true));
    let swapper = std::thread::spawn({
        let (swapping, parent, org_a) = (swapping.clone(), parent.clone(), org_a.clone());
        move || swap_for_links(&swapping, &parent, &org_a, VICTIMS)
    });

    let (mut completed, mut refused) = (0, 0);
    for _ in 0..ROUNDS {
        let mut runs = Vec::new();
        for task_id in &victims {
            runs.push((task_id, h.b.start(task_id).await.id));
        }
        for (task_id, run_id) in runs {
            let run = h.b.wait_terminal(task_id, &run_id, SOON).await;
            match run.status {
                keel_client::RunStatus::Completed => completed += 1,
                _ => refused += 1,
            }
            let out =
                h.b.stdout_so_far(task_id, &run_id)
                    .await
                    .unwrap_or_default();
            assert!(
                !out.contains(ORG_A_FILE) && !out.contains("secret\n"),
                "{out}"
            );
        }
    }
    swapping.store(false, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    // Nothing of org a's was handed over.
    for path in [&org_a, &org_a.join("secret")] {
        let owner = std::fs::symlink_metadata(path).unwrap().uid();
        assert_eq!(owner, 0, "{} was handed to uid {owner}", path.display());
    }
    eprintln!("the symlink race: {swaps} swaps, {completed} runs completed, {refused} refused");
    assert_eq!(completed + refused, VICTIMS * ROUNDS);
    assert!(completed > 0, "no run got through: the race was not run");
    assert!(swaps > 0, "nothing was swapped: the race was not run");
}

/// Swaps each `victim<n>` beneath `parent` for a link to `target` and back, while
/// `swapping`; returns how many swaps it made.
fn swap_for_links(swapping: &AtomicBool, parent: &Path, target: &Path, victims: usize) -> usize {
    let mut swaps = 0;
    while swapping.load(Ordering::Relaxed) {
        for n in 0..victims {
            let (victim, real) = (
                parent.join(format!("victim{n}")),
                parent.join(format!("real{n}")),
            );
            // The worker may make the directory again while it is away: then no link.
            if std::fs::rename(&victim, &real).is_err() {
                continue;
            }
            if std::os::unix::fs::symlink(target, &victim).is_ok() {
                swaps += 1;
                std::fs::remove_file(&victim).unwrap();
            }
            // The worker made it again, and a run may be writing in it: the real one goes
            // back once it could be removed, and stays aside otherwise.
            if std::fs::rename(&real, &victim).is_err() && std::fs::remove_dir_all(&victim).is_ok()
            {
                let _ = std::fs::rename(&real, &victim);
            }
        }
    }
    swaps
}

/// No `in_place` directory contains another task's, or lies inside one: refused at
/// creation, and before each run for a task written before the rule (or in a race with
/// another creation), since its run could change or swap the other's files.
#[tokio::test]
async fn an_in_place_directory_never_contains_another_task_s() {
    let roots = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(roots.path());
    let root = std::fs::canonicalize(roots.path()).unwrap();
    let (parent, inner) = (root.join("org_b/parent"), root.join("org_b/parent/inner"));
    std::fs::create_dir_all(inner.join("deeper")).unwrap();
    let other = root.join("org_b/other");
    std::fs::create_dir_all(&other).unwrap();
    let roots_setting = root.to_str().unwrap();
    let h = hostile_with(Mode::Isolated, &[("KEEL_WORKSPACE_ROOTS", roots_setting)]).await;

    let inner_task = h.b.create_task(&in_place(&inner, "pwd")).await;
    for nesting in [&parent, &inner.join("deeper")] {
        let body = serde_json::to_value(in_place(nesting, "true")).unwrap();
        let (status, refused) = h.b.post("/v1/tasks", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains("working_directory"), "{message}");
        assert!(message.contains("another task"), "{message}");
    }
    // The same directory is another task's to share (locking is another matter).
    let (status, _) =
        h.b.post(
            "/v1/tasks",
            serde_json::to_value(in_place(&inner, "true")).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);

    // A task that nests all the same (written before the rule) is refused at its run.
    let outer = h.b.create_task(&in_place(&other, "echo ran")).await;
    let pool = sqlx::PgPool::connect(&h.db).await.unwrap();
    sqlx::query("UPDATE tasks SET working_directory = $1 WHERE id = $2")
        .bind(parent.to_str().unwrap())
        .bind(&outer.id)
        .execute(&pool)
        .await
        .unwrap();
    let run = h.b.start(&outer.id).await;
    let run = h.b.wait_terminal(&outer.id, &run.id, SOON).await;
    assert_eq!(run.status, keel_client::RunStatus::Failed);
    let error = run.last_error.unwrap_or_default();
    assert!(error.contains("workspace_refused"), "{error}");
    // Nor does the task it nests with run while it stands; once it is gone, it does.
    let refused = h.b.start(&inner_task.id).await;
    let refused = h.b.wait_terminal(&inner_task.id, &refused.id, SOON).await;
    assert_eq!(refused.status, keel_client::RunStatus::Failed);
    let (status, _) = h.b.delete(&format!("/v1/tasks/{}", outer.id)).await;
    assert_eq!(status, StatusCode::OK);
    let ran = h.b.start(&inner_task.id).await;
    let done = h.b.wait_terminal(&inner_task.id, &ran.id, SOON).await;
    assert_eq!(done.status, keel_client::RunStatus::Completed);
}

/// Every gate `gates`, and `deny` for the MCP server `probe`.
fn denying_probe(gates: GateDecision) -> ApprovalPolicyRequest {
    ApprovalPolicyRequest {
        gates: GateDecisions {
            shell_exec: gates,
            git_exec: gates,
            file_write: gates,
            network_egress: gates,
            read_file: gates,
            all_tools: gates,
        },
        mcp_servers: [("probe".to_string(), GateDecision::Deny)].into(),
        allowed_write_paths: None,
    }
}

/// An agent task whose stdio MCP server `probe` (a command the deployment lists for
/// members) only leaves a marker in the run's workspace.
fn probing() -> TaskDraft {
    let probe = McpServer {
        name: "probe".into(),
        transport: None,
        command: Some("/bin/sh".into()),
        args: vec!["-c".into(), "echo started > probe-started".into()],
        env: Default::default(),
        url: None,
        headers: Default::default(),
        approval_policy: Some("require_approval".into()),
        tools: None,
    };
    TaskDraft {
        mcp_servers: Some(vec![probe]),
        ..support::agent_loop("Use the probe.")
    }
}

/// Org b's operator denies every gate and names the server `deny`: its member's task with
/// the server is refused at its start (403), as it is when only the server is denied, and
/// nothing of it runs. Org a, under the default policies, waits for its operator, and only
/// then does the server start: the marker shows up in org a's workspace alone.
#[tokio::test]
async fn a_denying_workspace_policy_keeps_a_members_mcp_server_from_starting() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(logs.path());
    let data = logs.path().join("data");
    let llm = FakeLlm::start(vec![Turn::text("Done.")]).await;
    let settings = [
        ("KEEL_APPROVAL_POLICIES", "shell_exec,git_exec,file_write"),
        ("KEEL_MCP_STDIO_COMMANDS", "/bin/sh"),
        ("FAKE_LLM_API_KEY", "fake-llm-key"),
        ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
    ];
    let env = [REMOTE_ENV.as_slice(), &settings].concat();
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &env).await;
    let _worker = support::spawn_worker_with_env(&db, logs.path(), "worker", 30_000, &data, &env);
    let base = api.client.as_ref().unwrap().base.clone();
    let preset = json!({ "kind": "openai-compatible", "model": "fake-model",
        "api": "openai-completions", "base_url": llm.openai_base(),
        "api_key_ref": "env:FAKE_LLM_API_KEY", "capabilities": ["chat", "tool_call"],
        "enabled": true });
    // The deployment's model, its key and its host: the runtime operator's to name.
    for org in ["a", "b"] {
        let (status, body) = runtime_operator_client(&base, org)
            .post("/v1/providers", preset.clone())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    let b = org_client(&base, "b");
    let b_operator = operator_client(&base, "b");
    let mut started = support::wire(&probing());
    started["start"] = json!(true);
    for (gates, denied) in [
        (GateDecision::Deny, "denies shell_exec"),
        (GateDecision::Allow, "denies the MCP server probe"),
    ] {
        let policy = b_operator.api.put_policy("org_b", &denying_probe(gates));
        policy.send().await.unwrap();
        let (status, body) = b.post("/v1/tasks", started.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(denied), "{body}");
    }
    let (status, runs) = b.get("/v1/runs").await;
    assert_eq!(status, StatusCode::OK, "{runs}");
    assert_eq!(runs["data"], json!([]), "org b has no run");

    let a = org_client(&base, "a");
    let (task_id, run_id) = a.start_task(&probing()).await;
    let approvals = a.api.list_task_approvals(&task_id, Some("pending"));
    let approval = approvals.await.unwrap().data.remove(0);
    assert!(support::files_named(&data, "probe-started").is_empty());
    let path = format!("/v1/tasks/{task_id}/approvals/{}/resolve", approval.id);
    let a_operator = operator_client(&base, "a");
    let (status, body) = a_operator
        .post(&path, json!({ "decision": "approve" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = a.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, keel_client::RunStatus::Completed, "{run:?}");
    let marked = support::files_named(&data, "probe-started");
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert_eq!(
        llm.requests().len(),
        1,
        "org a's run alone called the model"
    );
}

/// Byte quotas small enough for a test to reach: 256 KiB per run, 400 KiB per workspace.
const QUOTAS: [(&str, &str); 2] = [
    ("KEEL_RUN_MAX_STORED_BYTES", "262144"),
    ("KEEL_WORKSPACE_MAX_STORED_BYTES", "409600"),
];

/// Org b floods its output (`yes`, which never ends by itself): its run is stopped at its
/// byte quota and fails with `storage_quota_exceeded`, long before its timeout; a second
/// flood stops where the workspace's quota is spent, and org a's runs complete meanwhile.
/// The database's counts are what org b's rows hold, within its quotas.
#[tokio::test]
async fn a_flood_of_output_stops_at_the_run_s_and_the_workspace_s_byte_quota() {
    let h = hostile_with(Mode::Isolated, &QUOTAS).await;
    let pool = support::pool(&h.db).await;
    let flood = TaskDraft {
        timeout_ms: Some(600_000),
        ..support::shell("yes keel-flood")
    };
    let (task_id, run_id) = h.b.start_task(&flood).await;
    let ended = h.b.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(ended.status, RunStatus::Failed, "{ended:?}");
    let error = ended.last_error.unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "storage_quota_exceeded: run {run_id} would store "
        )),
        "{error}"
    );
    assert!(error.ends_with("over its quota of 262144 bytes"), "{error}");
    let stored = stored_bytes(&pool, "run_storage", "run_id", &run_id).await;
    assert!(stored > 0 && stored <= 262_144, "{stored}");
    assert!(run(&h.a, "echo alive").await.contains("alive"));

    // Each flood stores what its run may until the workspace's quota is spent (a run stops
    // at the write its quota refuses, which may leave far less than its quota stored).
    let workspace = two_orgs::workspace_of(&pool, &run_id).await;
    let mut refused_by_workspace = false;
    for _ in 0..8 {
        let (task_id, run_id) = h.b.start_task(&flood).await;
        let ended = h.b.wait_terminal(&task_id, &run_id, SOON).await;
        let error = ended.last_error.unwrap_or_default();
        let by_run = format!("storage_quota_exceeded: run {run_id} would store ");
        let by_workspace = format!("storage_quota_exceeded: workspace {workspace} would ");
        assert!(
            error.starts_with(&by_run) || error.starts_with(&by_workspace),
            "{error}"
        );
        if error.starts_with(&by_workspace) {
            refused_by_workspace = true;
            break;
        }
    }
    assert!(refused_by_workspace, "no flood met the workspace's quota");
    let stored = stored_bytes(&pool, "workspace_storage", "workspace_id", &workspace).await;
    assert!(stored > 0 && stored <= 409_600, "{stored}");
    assert_eq!(
        stored,
        rows_bytes(&pool, &workspace).await,
        "the count is the rows'"
    );
    assert!(run(&h.a, "echo still alive").await.contains("still alive"));
}

/// What a run's or a workspace's counter says it stores.
async fn stored_bytes(pool: &sqlx::PgPool, table: &str, key: &str, id: &str) -> i64 {
    let query = format!("SELECT stored_bytes FROM {table} WHERE {key} = $1");
    sqlx::query_scalar(sqlx::AssertSqlSafe(query))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What a workspace's artifacts and steps hold, counted from the rows themselves.
async fn rows_bytes(pool: &sqlx::PgPool, workspace: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT ((SELECT coalesce(sum(size_bytes), 0) FROM artifacts WHERE workspace_id = $1)
               + (SELECT coalesce(sum(octet_length(input::text)
                                      + coalesce(octet_length(output::text), 0)), 0)
                  FROM steps WHERE workspace_id = $1))::bigint",
    )
    .bind(workspace)
    .fetch_one(pool)
    .await
    .unwrap()
}
