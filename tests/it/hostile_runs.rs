//! A hostile tenant attacks through what its runs execute, in remote mode with two orgs and
//! real `keel api` and `keel worker` processes: org b's shell runs try to read the
//! worker's secrets, the data directory and org a's workspace, to signal the worker, and to
//! pass as the worker's uid. Each attack runs against both sandbox modes that take
//! tenants: `isolated` (a root worker; each run a uid of its own) and `namespaces` (a worker
//! that is not root), and each asserts the attack failed and org a's data is untouched. The
//! mode that takes no tenants, `off`, refuses to start in remote mode.

use crate::support;
use crate::support::two_orgs;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Client, KeelProcess};
use two_orgs::{REMOTE_ENV, SHARED_SECRET, org_client};

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
}

/// Two orgs on one API and one worker; org a has run once and left a file behind.
struct Hostile {
    a: Client,
    b: Client,
    data: PathBuf,
    /// Org a's workspace, as its run printed it.
    a_workspace: PathBuf,
    worker: KeelProcess,
    _api: KeelProcess,
    _logs: tempfile::TempDir,
}

async fn hostile(mode: Mode) -> Hostile {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(logs.path());
    let data = logs.path().join("data");
    plant_data_dir(&data, mode.worker_uid());
    let mut env = REMOTE_ENV.to_vec();
    env.extend([OPERATOR_KEY, ("KEEL_SANDBOX", mode.setting())]);
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &REMOTE_ENV).await;
    let worker = support::spawn_worker_as(
        mode.worker_uid(),
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
    let (task_id, run_id) = client.run_shell(script).await;
    let run = client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, keel_client::RunStatus::Completed, "{run:?}");
    client.stdout(&task_id, &run_id).await
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
}
