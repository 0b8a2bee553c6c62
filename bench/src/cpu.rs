//! CPU time of the processes a figure runs, from `/proc/<pid>/stat`: what the shared
//! machine's other load disturbs far less than wall-clock throughput. A process's `stat`
//! counts only the children it waited for, and a sandbox leaves some to the host's init
//! (bubblewrap's init in a run's pid namespace, about half of a bubblewrap start): where the
//! bench can make a cgroup of its own ([`CpuGroup`]), the workers and the floors' spawns
//! run in one, whose `cpu.stat` counts every process of theirs.

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
    /// The worker processes and the runs they spawned: all of their processes with
    /// `workers_by_cgroup`, else their reaped children only.
    pub workers_ms: f64,
    #[serde(default)]
    pub workers_by_cgroup: bool,
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

/// Cumulative CPU microseconds of each part at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    postgres: u64,
    api: u64,
    workers: u64,
    workers_by_cgroup: bool,
    bench: u64,
}

impl CpuSample {
    /// `api` and `workers` must be alive; the postmaster is the parent of `pool`'s backend.
    /// The workers' time is `group`'s where they run in one.
    pub async fn read(
        pool: &PgPool,
        api: i32,
        workers: &[i32],
        group: Option<&CpuGroup>,
    ) -> anyhow::Result<CpuSample> {
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await?;
        let postmaster = stat(backend)?.ppid;
        let us = ticks_to_us(clock_ticks()?);
        let workers = match group {
            Some(group) => group.usage_us()?,
            None => us(workers
                .iter()
                .map(|&pid| Ok(stat(pid)?.with_children()))
                .sum::<anyhow::Result<u64>>()?),
        };
        Ok(CpuSample {
            postgres: us(tree_ticks(postmaster)?),
            api: us(stat(api)?.with_children()),
            workers,
            workers_by_cgroup: group.is_some(),
            bench: us(stat(std::process::id() as i32)?.own()),
        })
    }

    pub fn per_run(&self, before: &CpuSample, runs: usize) -> CpuPerRun {
        let per = |after: u64, before: u64| {
            after.saturating_sub(before) as f64 / 1000.0 / runs.max(1) as f64
        };
        CpuPerRun {
            postgres_ms: per(self.postgres, before.postgres),
            api_ms: per(self.api, before.api),
            workers_ms: per(self.workers, before.workers),
            workers_by_cgroup: self.workers_by_cgroup,
            bench_ms: per(self.bench, before.bench),
        }
    }
}

fn ticks_to_us(ticks_per_s: f64) -> impl Fn(u64) -> u64 {
    move |ticks| (ticks as f64 * 1e6 / ticks_per_s) as u64
}

/// A cgroup v2 of the bench's own, beneath the one it runs in, that processes join as they
/// start ([`CpuGroup::wrap`]): its `cpu.stat` counts every process of theirs, those nobody
/// waits for included. Removed (with what the workers left in it) when dropped.
pub struct CpuGroup {
    dir: std::path::PathBuf,
}

impl CpuGroup {
    /// None where the bench cannot make one (no cgroup v2, a cgroup it may not write).
    pub fn create(name: &str) -> Option<CpuGroup> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = mountinfo
            .lines()
            .find(|line| {
                line.split(" - ")
                    .nth(1)
                    .is_some_and(|fs| fs.starts_with("cgroup2 "))
            })?
            .split_whitespace()
            .nth(4)?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = own.lines().find_map(|line| line.strip_prefix("0::"))?;
        let dir = Path::new(mount)
            .join(own.trim_start_matches('/'))
            .join(format!("keel-bench-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let group = CpuGroup { dir };
        group.usage_us().ok()?;
        Some(group)
    }

    /// `argv` started so that it joins the group before it execs (through `sh`, whose own
    /// start is outside the group).
    pub fn wrap(&self, argv: &[&str]) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs");
        [
            "sh",
            "-c",
            "echo 0 > \"$0\" && exec \"$@\"",
            &procs.to_string_lossy(),
        ]
        .into_iter()
        .chain(argv.iter().copied())
        .map(String::from)
        .collect()
    }

    pub fn usage_us(&self) -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat"))?;
        stat.lines()
            .find_map(|line| line.strip_prefix("usage_usec "))
            .and_then(|value| value.trim().parse().ok())
            .context("cpu.stat has no usage_usec")
    }
}

impl Drop for CpuGroup {
    /// The groups the workers' runs left, deepest first, then the group itself.
    fn drop(&mut self) {
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&entry.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.dir);
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

/// CPU milliseconds of one start of `argv`, over `spawns` of them: in a [`CpuGroup`] where
/// the bench can make one (every process of the start from its exec on), else this
/// process's own time and that of the children it waits for. Not the kernel's deferred
/// work, such as a namespace's teardown. Blocks while it spawns.
pub fn spawn_cost_ms(argv: &[&str], spawns: usize) -> anyhow::Result<f64> {
    let group = CpuGroup::create("spawns");
    let argv: Vec<String> = match &group {
        Some(group) => group.wrap(argv),
        None => argv.iter().map(|arg| arg.to_string()).collect(),
    };
    let us = ticks_to_us(clock_ticks()?);
    let counted = || match &group {
        Some(group) => group.usage_us(),
        None => Ok(us(stat(std::process::id() as i32)?.with_children())),
    };
    let before = counted()?;
    for _ in 0..spawns {
        let status = Command::new(&argv[0]).args(&argv[1..]).status()?;
        anyhow::ensure!(status.success(), "{} exited with {status}", argv.join(" "));
    }
    let spent = counted()?.saturating_sub(before);
    Ok(spent as f64 / 1000.0 / spawns.max(1) as f64)
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

/// The kernel's clock ticks per second, asked of `getconf` once: every CPU sample needs it.
fn clock_ticks() -> anyhow::Result<f64> {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    if let Some(ticks) = TICKS.get() {
        return Ok(*ticks);
    }
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    let ticks = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK")?;
    Ok(*TICKS.get_or_init(|| ticks))
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
