//! The connection loop: axum's router over hyper's server, which axum::serve does not let
//! us tune. A client must send a request's whole head (request line and headers) within
//! the header read timeout, or its connection is closed: a slowloris client trickling a
//! byte at a time would otherwise hold a connection (and a task) for as long as it likes.
//! The body's deadline is the router's (`api::body`): hyper has none for it.

use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serves `app` over HTTP/1.1 on `listener` until `shutdown` fires, then waits for open
/// connections to finish. Every request carries its peer address ([`ConnectInfo`]) for
/// the local-only routes.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    wait_after(error).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let service = app
            .clone()
            .map_request(move |request: axum::http::Request<Incoming>| {
                let mut request = request.map(axum::body::Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An accept error: a connection that was reset before it was taken is nothing; anything
/// else (out of file descriptors, above all) is logged, and the loop waits a moment
/// rather than spin on it.
async fn wait_after(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
