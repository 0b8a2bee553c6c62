//! A TCP proxy that delays every chunk by a fixed time in each direction: a database "far
//! away" for tests (the Rust twin of ../shared/bench/tools/delay-proxy.py, which CI lacks).
//! Each chunk is forwarded at its arrival time plus the delay, in order, so the delay adds
//! latency without throttling what is in flight. It can also be frozen: it then reads,
//! writes and accepts nothing, as a proxy stopped with SIGSTOP (the kernel still takes the
//! bytes and the connections; nothing is refused, everything hangs), a network partition
//! seen from both ends; thawed, it forwards what waited. Its upstream can be moved, as a
//! failover manager moves a virtual IP: new connections go to the new server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A running proxy; it stops (and its connections close) when dropped.
pub struct DelayProxy {
    /// `database_url` with its host and port replaced by the proxy's.
    pub url: String,
    stop: CancellationToken,
    frozen: watch::Sender<bool>,
    /// `host:port` of the server new connections go to.
    target: Arc<Mutex<String>>,
}

/// `host:port` of the server of `database_url`.
fn server_of(database_url: &str) -> String {
    let options: PgConnectOptions = database_url.parse().expect("a database URL");
    format!("{}:{}", options.get_host(), options.get_port())
}

impl DelayProxy {
    /// Proxies the server of `database_url`, delaying each way by `delay`.
    pub async fn start(database_url: &str, delay: Duration) -> DelayProxy {
        let server = server_of(database_url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = database_url.replacen(&server, &listener.local_addr().unwrap().to_string(), 1);
        let stop = CancellationToken::new();
        let (frozen, thawed) = watch::channel(false);
        let target = Arc::new(Mutex::new(server));
        tokio::spawn(accept(
            listener,
            target.clone(),
            delay,
            thawed,
            stop.clone(),
        ));
        DelayProxy {
            url,
            stop,
            frozen,
            target,
        }
    }

    /// Sends new connections to the server of `database_url` (the address moved after a
    /// failover); connections already open stay where they are.
    pub fn retarget(&self, database_url: &str) {
        *self.target.lock().unwrap() = server_of(database_url);
    }

    /// Proxies the server of `database_url` without delay, to be frozen.
    pub async fn freezable(database_url: &str) -> DelayProxy {
        DelayProxy::start(database_url, Duration::ZERO).await
    }

    /// Stops forwarding anything, on every connection, until [`DelayProxy::thaw`].
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

/// Returns once the proxy is not frozen.
async fn unfrozen(thawed: &mut watch::Receiver<bool>) {
    let _ = thawed.wait_for(|frozen| !frozen).await;
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept(
    listener: TcpListener,
    target: Arc<Mutex<String>>,
    delay: Duration,
    mut thawed: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    loop {
        unfrozen(&mut thawed).await;
        let client = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        let server = target.lock().unwrap().clone();
        let Ok(server) = TcpStream::connect(&server).await else {
            continue;
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(pipe(
            client_read,
            server_write,
            delay,
            thawed.clone(),
            stop.clone(),
        ));
        tokio::spawn(pipe(
            server_read,
            client_write,
            delay,
            thawed.clone(),
            stop.clone(),
        ));
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, and none while frozen.
async fn pipe<R, W>(
    mut from: R,
    mut to: W,
    delay: Duration,
    thawed: watch::Receiver<bool>,
    stop: CancellationToken,
) where
    R: AsyncReadExt + Unpin + Send + 'static,
    W: AsyncWriteExt + Unpin + Send + 'static,
{
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut write_thawed = thawed.clone();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            unfrozen(&mut write_thawed).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0; 64 * 1024];
    let mut thawed = thawed;
    loop {
        unfrozen(&mut thawed).await;
        let read = tokio::select! {
            _ = stop.cancelled() => break,
            read = from.read(&mut buffer) => read,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if chunks
                    .send((Instant::now() + delay, buffer[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(chunks);
    let _ = writer.await;
}
