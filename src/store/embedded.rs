//! The embedded default: a private PostgreSQL cluster that Keel creates, starts and stops
//! itself from the PostgreSQL binaries installed on the machine. `keel serve` uses it when
//! no database URL is given; the tests use it for their throwaway cluster.
//!
//! The cluster listens on a free loopback port only (no Unix socket, whose path length is
//! limited). Running as root, it runs as the `postgres` user through `runuser`, since
//! initdb and postgres refuse to run as root. A watchdog stops the cluster if the process
//! that started it dies without stopping it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SUPERUSER: &str = "keel";

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries found (looked for initdb via pg_config --bindir, PATH \
         and /usr/lib/postgresql/*/bin). Either install PostgreSQL (for example \
         `apt-get install postgresql`) or pass --database-url (KEEL_DATABASE_URL / DATABASE_URL) \
         to use an existing server."
    )]
    NoBinaries,
    #[error(
        "running as root, the embedded cluster runs as the '{user}' user, which cannot reach \
         {path}: choose a --data-dir it can traverse (for example under /var/lib or /tmp)"
    )]
    Unreachable { user: String, path: String },
    #[error("{step} failed: {detail}")]
    Command { step: &'static str, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How the cluster is tuned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL's defaults (fsync on): for real use.
    Durable,
    /// fsync off: for throwaway test clusters, never for data that matters.
    Throwaway,
}

pub struct EmbeddedPostgres {
    root: PathBuf,
    durability: Durability,
    bindir: PathBuf,
    data: PathBuf,
    port: u16,
    run_as: Option<String>,
}

impl EmbeddedPostgres {
    /// Creates the cluster under `root` if needed and starts it.
    pub fn start(root: &Path, durability: Durability) -> Result<Self, EmbeddedError> {
        let bindir = find_bindir().ok_or(EmbeddedError::NoBinaries)?;
        std::fs::create_dir_all(root)?;
        let root = root.canonicalize()?;
        let run_as = nix::unistd::geteuid()
            .is_root()
            .then(|| "postgres".to_string());
        let data = root.join("pgdata");
        let port = free_port()?;
        let cluster = EmbeddedPostgres {
            root: root.clone(),
            durability,
            bindir,
            data,
            port,
            run_as,
        };
        if let Some(user) = &cluster.run_as {
            cluster.hand_over(&root, user)?;
        }
        if !cluster.data.join("PG_VERSION").exists() {
            cluster.initdb()?;
        }
        cluster.pg_ctl_start(&root, durability)?;
        cluster.watch_owner()?;
        Ok(cluster)
    }

    /// A connection URL for `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops and starts the cluster again on the same port (for restart tests).
    pub fn restart(&self) -> Result<(), EmbeddedError> {
        self.stop();
        self.pg_ctl_start(&self.root, self.durability)
    }

    pub fn stop(&self) {
        let mut stop = self.command(&self.bindir.join("pg_ctl"));
        stop.arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "fast", "-w", "-t", "30"]);
        if let Err(error) = run(stop, "pg_ctl stop") {
            tracing::warn!(%error, "stopping the embedded PostgreSQL failed");
        }
    }

    fn command(&self, program: &Path) -> Command {
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// Gives the cluster's directory to the unprivileged user, after checking it can
    /// reach it at all.
    fn hand_over(&self, root: &Path, user: &str) -> Result<(), EmbeddedError> {
        for ancestor in root.ancestors().skip(1) {
            let mut probe = Command::new("runuser");
            probe.args(["-u", user, "--", "test", "-x"]).arg(ancestor);
            if !probe.status().is_ok_and(|s| s.success()) {
                return Err(EmbeddedError::Unreachable {
                    user: user.to_string(),
                    path: root.display().to_string(),
                });
            }
        }
        let mut chown = Command::new("chown");
        chown.arg("-R").arg(format!("{user}:")).arg(root);
        run(chown, "chown")
    }

    fn initdb(&self) -> Result<(), EmbeddedError> {
        let mut initdb = self.command(&self.bindir.join("initdb"));
        initdb.arg("-D").arg(&self.data).args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]);
        run(initdb, "initdb")
    }

    fn pg_ctl_start(&self, root: &Path, durability: Durability) -> Result<(), EmbeddedError> {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
            self.port
        );
        if durability == Durability::Throwaway {
            options.push_str(
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
                 -c max_connections=500",
            );
        }
        let mut start = self.command(&self.bindir.join("pg_ctl"));
        start
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(root.join("postgres.log"))
            .args(["-o", &options, "-w", "-t", "60", "start"]);
        run(start, "pg_ctl start")
    }

    /// Stops the cluster when this process is gone, even after `kill -9`; a throwaway
    /// cluster's directory is removed too.
    fn watch_owner(&self) -> Result<(), EmbeddedError> {
        let pg_ctl = self.bindir.join("pg_ctl");
        let stop = match &self.run_as {
            Some(user) => format!("runuser -u {user} -- '{}'", pg_ctl.display()),
            None => format!("'{}'", pg_ctl.display()),
        };
        let mut script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} -D '{data}' stop -m fast",
            pid = std::process::id(),
            data = self.data.display(),
        );
        if self.durability == Durability::Throwaway {
            script.push_str(&format!("; rm -rf '{}'", self.root.display()));
        }
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(())
    }
}

fn run(mut command: Command, step: &'static str) -> Result<(), EmbeddedError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| EmbeddedError::Command {
            step,
            detail: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let detail = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Err(EmbeddedError::Command {
        step,
        detail: detail.trim().to_string(),
    })
}

use std::os::unix::process::CommandExt;

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
fn find_bindir() -> Option<PathBuf> {
    let has_server = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).exists())
    };
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let from_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(|d| d.ok())
                .map(|d| d.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    installed.sort_by_key(|dir| std::cmp::Reverse(version_of(dir)));
    from_pg_config
        .into_iter()
        .chain(from_path)
        .chain(installed)
        .find(|dir| has_server(dir))
}

fn version_of(bindir: &Path) -> u32 {
    bindir
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
