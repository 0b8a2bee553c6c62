//! CPU time of the processes a figure runs, from `/proc/<pid>/stat`: what the shared
//! machine's other load disturbs far less than wall-clock throughput.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// CPU milliseconds per run, by part.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct CpuPerRun {
    /// The postmaster and all its children (backends, background processes).
    pub postgres_ms: f64,
    pub api_ms: f64,
    /// The worker processes and the runs they spawned (their reaped children).
    pub workers_ms: f64,
    /// This process.
    pub bench_ms: f64,
}

impl CpuPerRun {
    pub fn total_ms(&self) -> f64 {
        self.postgres_ms + self.api_ms + self.workers_ms + self.bench_ms
    }

    /// The most runs/s `cores` cores can give at this CPU cost per run.
    pub fn ceiling(&self, cores: f64) -> f64 {
        cores * 1000.0 / self.total_ms()
    }
}

/// Cumulative CPU ticks of each part at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    postgres: u64,
    api: u64,
    workers: u64,
    bench: u64,
}

impl CpuSample {
    /// `api` and `workers` must be alive; the postmaster is the parent of `pool`'s backend.
    pub async fn read(pool: &PgPool, api: i32, workers: &[i32]) -> anyhow::Result<CpuSample> {
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await?;
        let postmaster = stat(backend)?.ppid;
        Ok(CpuSample {
            postgres: tree_ticks(postmaster)?,
            api: stat(api)?.with_children(),
            workers: workers
                .iter()
                .map(|&pid| Ok(stat(pid)?.with_children()))
                .sum::<anyhow::Result<u64>>()?,
            bench: stat(std::process::id() as i32)?.own(),
        })
    }

    pub fn per_run(&self, before: &CpuSample, runs: usize) -> anyhow::Result<CpuPerRun> {
        let ms_per_tick = 1000.0 / clock_ticks()?;
        let per = |after: u64, before: u64| {
            after.saturating_sub(before) as f64 * ms_per_tick / runs.max(1) as f64
        };
        Ok(CpuPerRun {
            postgres_ms: per(self.postgres, before.postgres),
            api_ms: per(self.api, before.api),
            workers_ms: per(self.workers, before.workers),
            bench_ms: per(self.bench, before.bench),
        })
    }
}

/// The program and arguments of a bare start of `sh -c true`: the floor under what a shell
/// run of `true` costs, which Keel's own processes add to.
pub const BARE_SPAWN: &[&str] = &["sh", "-c", "true"];

/// The same in the least a namespaced sandbox does: bubblewrap with a user and a pid
/// namespace of its own and the host's root bound as it is (Keel's jail adds the mounts,
/// the other namespaces and a uid of the run's own).
pub const BARE_SANDBOX_SPAWN: &[&str] = &[
    "bwrap",
    "--unshare-user",
    "--unshare-pid",
    "--bind",
    "/",
    "/",
    "--",
    "sh",
    "-c",
    "true",
];

/// [`BARE_SANDBOX_SPAWN`] with a network namespace of its own (only loopback), as every
/// jail of Keel's has.
pub const NETWORK_SANDBOX_SPAWN: &[&str] = &[
    "bwrap",
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--bind",
    "/",
    "/",
    "--",
    "sh",
    "-c",
    "true",
];

/// [`NETWORK_SANDBOX_SPAWN`] behind Keel's shim, as a jail with network starts: `shim`
/// (`keel-sandbox-shim`, or `keel`) as PID 1, checking the workspace (this process's working directory), listening
/// on the run's loopback and carrying connections to `socket` (an egress proxy's, which
/// the spawn never connects to) before it starts the command.
pub fn shimmed_sandbox_spawn(shim: &Path, socket: &Path) -> anyhow::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let here = std::fs::metadata(".")?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let argv = [
        "bwrap",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--as-pid-1",
        "--bind",
        "/",
        "/",
        "--ro-bind",
        &path(shim),
        "/run/keel/shim",
        "--ro-bind",
        &path(socket),
        "/run/keel/egress.sock",
        "--",
        "/run/keel/shim",
        keel_workers::shim::ARG,
        "--workspace",
        &format!("{}:{}", here.dev(), here.ino()),
        "--egress",
        "/run/keel/egress.sock",
        "3128",
        "1080",
        "--",
        "sh",
        "-c",
        "true",
    ];
    Ok(argv.map(String::from).into())
}

/// CPU milliseconds of one start of `argv` by this process (its own time and that of the
/// children it waits for, theirs included; not the kernel's deferred work, such as a
/// namespace's teardown), over `spawns` of them. Blocks while it spawns.
pub fn spawn_cost_ms(argv: &[&str], spawns: usize) -> anyhow::Result<f64> {
    let me = std::process::id() as i32;
    let before = stat(me)?.with_children();
    for _ in 0..spawns {
        let status = Command::new(argv[0]).args(&argv[1..]).status()?;
        anyhow::ensure!(status.success(), "{} exited with {status}", argv.join(" "));
    }
    let ticks = stat(me)?.with_children().saturating_sub(before);
    Ok(ticks as f64 * 1000.0 / clock_ticks()? / spawns.max(1) as f64)
}

/// The fields of `/proc/<pid>/stat` this module reads (ticks).
struct Stat {
    ppid: i32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

impl Stat {
    fn own(&self) -> u64 {
        self.utime + self.stime
    }

    /// Its own time and that of the children it has waited for.
    fn with_children(&self) -> u64 {
        self.own() + self.cutime + self.cstime
    }
}

fn stat(pid: i32) -> anyhow::Result<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_stat(&text).with_context(|| format!("parsing /proc/{pid}/stat"))
}

/// The command name (field 2) may hold spaces and parentheses: fields are counted from
/// its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is fields[n - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// A parent's time with its reaped children's, plus its live children's own time: a child
/// that exits between two samples moves from the second term to the first.
fn tree_ticks(parent: i32) -> anyhow::Result<u64> {
    let mut ticks = stat(parent)?.with_children();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A process may exit while the directory is read.
        if let Ok(child) = stat(pid)
            && child.ppid == parent
        {
            ticks += child.own();
        }
    }
    Ok(ticks)
}

fn clock_ticks() -> anyhow::Result<f64> {
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK")
}

#[cfg(test)]
mod tests {
    #[test]
    fn parse_stat_counts_fields_after_the_command() {
        let text = "42 (a (b) c) S 7 42 42 0 -1 4194304 10 0 0 0 11 12 13 14 20 0 1 0";
        let stat = super::parse_stat(text).unwrap();
        assert_eq!(stat.ppid, 7);
        assert_eq!(
            (stat.utime, stat.stime, stat.cutime, stat.cstime),
            (11, 12, 13, 14)
        );
    }
}
