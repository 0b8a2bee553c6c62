//! The embedded default: a private PostgreSQL cluster that Keel creates, starts and stops
//! itself from the PostgreSQL binaries installed on the machine. `keel serve` uses it when
//! no database URL is given; the tests use it for their throwaway cluster.
//!
//! The cluster listens on a free loopback port only (no Unix socket, whose path length is
//! limited). Running as root, it runs as the `postgres` user through `runuser`, since
//! initdb and postgres refuse to run as root. A watchdog stops the cluster if the process
//! that started it dies without stopping it.
//!
//! Every connection proves a password (SCRAM-SHA-256), even over loopback: a process a run
//! starts on this host must not reach the cluster as its superuser. The password is random,
//! kept in a 0600 file beside the cluster, and appears only in the URL Keel connects with.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SUPERUSER: &str = "keel";

/// The password's file, under the cluster's root (beside `pgdata`, not in it: initdb wants
/// an empty directory).
const PASSWORD_FILE: &str = "password";

/// Client authentication of a Keel cluster: SCRAM everywhere, for the superuser as for
/// anyone, over TCP (the only way in) and the Unix socket (if one is ever configured).
const PG_HBA: &str = "\
# Written by Keel: every connection proves its password (SCRAM-SHA-256).
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
local replication all scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
host replication all ::1/128 scram-sha-256
";

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
    /// The superuser's password; never logged (this type has no Debug).
    password: String,
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
        let password = password(&root.join(PASSWORD_FILE))?;
        let cluster = EmbeddedPostgres {
            root: root.clone(),
            durability,
            bindir,
            data,
            port,
            run_as,
            password,
        };
        if let Some(user) = &cluster.run_as {
            cluster.hand_over(&root, user)?;
        }
        if !cluster.data.join("PG_VERSION").exists() {
            cluster.initdb()?;
        } else if cluster.trusts()? {
            cluster.require_password()?;
        }
        cluster.pg_ctl_start(&root, durability)?;
        cluster.watch_owner()?;
        Ok(cluster)
    }

    /// A connection URL for `database` on this cluster, with the superuser's password:
    /// keep it out of logs. (The password is hex, so it needs no escaping.)
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:{}@127.0.0.1:{}/{database}",
            self.password, self.port
        )
    }

    /// The file holding the superuser's password (mode 0600).
    pub fn password_file(&self) -> PathBuf {
        self.root.join(PASSWORD_FILE)
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
                let mut command = bare("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => bare(program),
        }
    }

    /// Gives the cluster's directory to the unprivileged user, after checking it can
    /// reach it at all.
    fn hand_over(&self, root: &Path, user: &str) -> Result<(), EmbeddedError> {
        for ancestor in root.ancestors().skip(1) {
            let mut probe = bare("runuser");
            probe.args(["-u", user, "--", "test", "-x"]).arg(ancestor);
            if !probe.status().is_ok_and(|s| s.success()) {
                return Err(EmbeddedError::Unreachable {
                    user: user.to_string(),
                    path: root.display().to_string(),
                });
            }
        }
        let mut chown = bare("chown");
        chown.arg("-R").arg(format!("{user}:")).arg(root);
        run(chown, "chown")
    }

    fn initdb(&self) -> Result<(), EmbeddedError> {
        let mut initdb = self.command(&self.bindir.join("initdb"));
        initdb
            .arg("-D")
            .arg(&self.data)
            .arg("--pwfile")
            .arg(self.password_file());
        initdb.args([
            "-U",
            SUPERUSER,
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]);
        run(initdb, "initdb")
    }

    /// Whether `pg_hba.conf` lets any connection in without a password: a cluster created
    /// by a Keel from before passwords.
    fn trusts(&self) -> Result<bool, EmbeddedError> {
        let hba = std::fs::read_to_string(self.data.join("pg_hba.conf"))?;
        Ok(hba.lines().any(|line| {
            let line = line.split('#').next().unwrap_or_default();
            line.split_whitespace().any(|word| word == "trust")
        }))
    }

    /// Migrates a trusting cluster, before it starts: sets the superuser's password in
    /// single-user mode (no server listening, so no window where the password is set but
    /// not yet required), then requires it in `pg_hba.conf`, keeping the old file as
    /// `pg_hba.conf.trust`. Safe to repeat after a crash half way: the password file stays.
    fn require_password(&self) -> Result<(), EmbeddedError> {
        tracing::info!(
            data = %self.data.display(),
            "the embedded PostgreSQL trusts local connections; setting a password and requiring it"
        );
        let mut single = self.command(&self.bindir.join("postgres"));
        single
            .args(["--single", "-D"])
            .arg(&self.data)
            .args(["-j", "postgres"]);
        let statement = format!(
            "SET password_encryption = 'scram-sha-256';\n\
             ALTER ROLE \"{SUPERUSER}\" PASSWORD '{}';\n",
            self.password
        );
        run_with_input(single, "setting the superuser's password", &statement)
            .map_err(|e| self.redact(e))?;
        let hba = self.data.join("pg_hba.conf");
        std::fs::copy(&hba, self.data.join("pg_hba.conf.trust"))?;
        std::fs::write(&hba, PG_HBA)?;
        Ok(())
    }

    /// An error with the password taken out of whatever the server echoed.
    fn redact(&self, error: EmbeddedError) -> EmbeddedError {
        match error {
            EmbeddedError::Command { step, detail } => EmbeddedError::Command {
                step,
                detail: detail.replace(&self.password, "[redacted]"),
            },
            other => other,
        }
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
        bare("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(())
    }
}

/// A command that starts with only the locale, time zone and `PATH` of this process's
/// environment: the cluster and the tools around it need nothing else of Keel's, and a
/// process that runs as the `postgres` user must not carry Keel's settings or secrets.
fn bare(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command.env_clear().envs(
        std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(kept_for_the_cluster)),
    );
    command
}

fn kept_for_the_cluster(name: &str) -> bool {
    matches!(name, "PATH" | "LANG" | "LANGUAGE" | "TZ") || name.starts_with("LC_")
}

/// The cluster's password, from its file, or a new random one written to a new file
/// (0600; an existing file is set back to 0600).
fn password(path: &Path) -> Result<String, EmbeddedError> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            return Ok(text.trim().to_string());
        }
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let password: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{password}")?;
    file.sync_all()?;
    Ok(password)
}

fn run(mut command: Command, step: &'static str) -> Result<(), EmbeddedError> {
    command.stdin(Stdio::null());
    finish(command.output(), step)
}

/// Runs `command` with `input` on its stdin (never in its arguments, which any local user
/// can read in the process list).
fn run_with_input(
    mut command: Command,
    step: &'static str,
    input: &str,
) -> Result<(), EmbeddedError> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = command.spawn().and_then(|mut child| {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin.write_all(input.as_bytes())?;
        drop(stdin);
        child.wait_with_output()
    });
    // Single-user mode reports a failed statement on stderr and still exits 0.
    let output = output.map(|mut output| {
        if String::from_utf8_lossy(&output.stderr).contains("ERROR:") {
            output.status = std::process::ExitStatus::from_raw(1 << 8);
        }
        output
    });
    finish(output, step)
}

fn finish(
    output: std::io::Result<std::process::Output>,
    step: &'static str,
) -> Result<(), EmbeddedError> {
    let output = output.map_err(|e| EmbeddedError::Command {
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
    let from_pg_config = bare("pg_config")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The postmaster's environment holds none of this process's variables but the kept
    /// ones (the test process has cargo's, at least). runuser and pg_ctl set a few of their
    /// own (HOME, USER, PGDATA…), so entries are compared whole, name and value; PWD is
    /// left out, since pg_ctl's shell sets it from the working directory.
    #[test]
    fn the_cluster_starts_with_a_cleared_environment() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = EmbeddedPostgres::start(&dir.path().join("pg"), Durability::Throwaway)
            .expect("the embedded cluster starts");
        let pid_file = std::fs::read_to_string(cluster.data.join("postmaster.pid")).unwrap();
        let pid = pid_file.lines().next().unwrap().trim();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        cluster.stop();
        let theirs: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let ours: Vec<(String, String)> = std::env::vars()
            .filter(|(name, _)| !kept_for_the_cluster(name) && name != "PWD")
            .collect();
        assert!(
            !ours.is_empty(),
            "the test process has variables to leave out"
        );
        for (name, value) in &ours {
            let entry = format!("{name}={value}");
            assert!(
                !theirs.contains(&entry.as_bytes()),
                "the postmaster inherited {name}"
            );
        }
    }
}
