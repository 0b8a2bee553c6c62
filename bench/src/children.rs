//! Child processes of the bench: this same binary as `keel-bench worker`, and the `keel`
//! binary beside it (or `$KEEL_BIN`) as `keel worker` or `keel api`. Each is stopped (SIGTERM, then SIGKILL) when dropped, so a failed
//! figure leaves nothing running.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::PgPool;

use super::POLL;
use super::cpu::CpuGroup;

pub struct Process {
    child: Child,
}

impl Process {
    /// Starts `keel ARGS…` against `url`, with warnings and errors on the bench's stderr.
    pub fn keel(url: &str, args: &[String], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Process::spawn(keel_binary()?, url, args, env)
    }

    /// [`Process::keel`], joining `group` (where there is one) before it execs.
    pub fn keel_in(
        group: Option<&CpuGroup>,
        url: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let Some(group) = group else {
            return Process::keel(url, args, env);
        };
        let keel = keel_binary()?;
        let keel = keel.to_string_lossy();
        let argv: Vec<&str> = std::iter::once(keel.as_ref())
            .chain(args.iter().map(String::as_str))
            .collect();
        let wrapped = group.wrap(&argv);
        Process::spawn(PathBuf::from(&wrapped[0]), url, &wrapped[1..], env)
    }

    fn spawn(
        exe: PathBuf,
        url: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(&exe);
        command
            .args(args)
            .env("KEEL_DATABASE_URL", url)
            .env("RUST_LOG", "warn,sqlx=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Process { child })
    }

    /// `keel-bench worker` with `concurrency` jobs, `prefetch` and the given lease.
    pub fn bench_worker(
        url: &str,
        concurrency: usize,
        prefetch: usize,
        lease_ms: u64,
    ) -> anyhow::Result<Self> {
        let args = super::noop::worker_args(concurrency, prefetch, lease_ms);
        let flags = [
            "worker".to_string(),
            format!("--concurrency={}", args.concurrency),
            format!("--prefetch={}", args.prefetch),
            format!("--lease-ms={}", args.lease_ms),
            format!("--poll-interval-ms={}", args.poll_interval_ms),
            format!("--drain-timeout-ms={}", args.drain_timeout_ms),
            format!("--reconcile-interval-ms={}", args.reconcile_interval_ms),
            format!(
                "--db-max-connections={}",
                super::worker_pool_size(concurrency)
            ),
        ];
        let exe = std::env::current_exe().context("locating the keel-bench binary")?;
        Process::spawn(exe, url, &flags, &[])
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// kill -9: the process gets no chance to release anything.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Starts `count` bench workers and waits until each has registered (it is about to claim).
pub async fn bench_workers(
    pool: &PgPool,
    url: &str,
    count: usize,
    concurrency: usize,
    prefetch: usize,
    lease_ms: u64,
) -> anyhow::Result<Vec<Process>> {
    let workers = (0..count)
        .map(|_| Process::bench_worker(url, concurrency, prefetch, lease_ms))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pids: Vec<i32> = workers.iter().map(Process::pid).collect();
    wait_registered(pool, &pids).await?;
    Ok(workers)
}

/// Waits until the worker registry holds a row for every pid (within 30 s).
pub async fn wait_registered(pool: &PgPool, pids: &[i32]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let registered: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workers WHERE pid = ANY($1)")
                .bind(pids)
                .fetch_one(pool)
                .await?;
        if registered as usize >= pids.len() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "worker processes did not register within 30 s"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `$KEEL_BIN`, else the `keel` binary in this binary's directory (cargo builds both there).
pub(crate) fn keel_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KEEL_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the keel-bench binary")?;
    let keel = exe.with_file_name("keel");
    anyhow::ensure!(
        keel.is_file(),
        "no keel binary at {} (build it, or set KEEL_BIN)",
        keel.display()
    );
    Ok(keel)
}

/// Runs `measure` with a fresh data directory for the processes it starts, removed after
/// whatever the outcome.
pub async fn in_data_dir<T, F>(name: &str, measure: impl FnOnce(PathBuf) -> F) -> anyhow::Result<T>
where
    F: std::future::Future<Output = anyhow::Result<T>>,
{
    let data_dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let result = measure(data_dir.clone()).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}
