//! NDJSON RPC for hosts that are not Rust programs (seed 002's framing): `keel rpc
//! --stdio` serves one peer on stdin/stdout, `keel rpc --socket PATH` one peer per
//! connection on a Unix socket only its owner may use. Each method is one call of Keel's
//! HTTP API through the typed client, so the API's authentication, validation and
//! tenancy hold here as they do everywhere; pushed events come from the API's streams,
//! which carry only persisted events. stdout carries protocol lines only; logs go to
//! stderr.

mod methods;
pub(crate) mod protocol;
mod session;
mod socket;

pub(crate) use session::Server;

/// Serves one peer on stdin and stdout until stdin closes.
pub(crate) async fn serve_stdio(server: std::sync::Arc<Server>) -> std::io::Result<()> {
    session::run(server, tokio::io::stdin(), tokio::io::stdout()).await
}

pub(crate) use socket::serve_socket;
