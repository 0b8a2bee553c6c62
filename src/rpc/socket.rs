//! The socket transport: one session per connection on a Unix socket that only its owner
//! can open (mode 0600 from the moment it has its name), removed again at shutdown.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::rpc::session;
use crate::rpc::session::Server;

/// Serves every connection to `path` until `shutdown`, then removes the socket.
pub(crate) async fn serve_socket(
    server: Arc<Server>,
    path: &Path,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let listener = bind_owner_only(path)?;
    tracing::info!(socket = %path.display(), "serving NDJSON RPC");
    let served = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (input, output) = stream.into_split();
                    let server = server.clone();
                    tokio::spawn(async move {
                        if let Err(error) = session::run(server, input, output).await {
                            tracing::debug!(%error, "an RPC connection broke");
                        }
                    });
                }
                Err(error) => break Err(error),
            },
            () = shutdown.cancelled() => break Ok(()),
        }
    };
    let _ = fs::remove_file(path);
    served
}

/// A listener on `path` that nobody but this user can connect to: the socket is bound
/// in a private directory, made 0600 and only then renamed to `path`, so it is never
/// reachable with looser permissions.
fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    clear_stale(path)?;
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the socket path names no file")
    })?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging: PathBuf = parent.join(format!(
        ".{}.{}.staging",
        name.to_string_lossy(),
        std::process::id()
    ));
    DirBuilder::new().mode(0o700).create(&staging)?;
    let staged = staging.join("socket");
    let bound = UnixListener::bind(&staged).and_then(|listener| {
        fs::set_permissions(&staged, Permissions::from_mode(0o600))?;
        fs::rename(&staged, path)?;
        Ok(listener)
    });
    let _ = fs::remove_file(&staged);
    let _ = fs::remove_dir(&staging);
    bound
}

/// Removes a socket left by a process that is gone; refuses to touch a live socket or
/// anything that is not a socket.
fn clear_stale(path: &Path) -> io::Result<()> {
    let Ok(metadata) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        let message = format!(
            "{} exists and is not a socket; not replacing it",
            path.display()
        );
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, message));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        let message = format!("another process serves {}", path.display());
        return Err(io::Error::new(io::ErrorKind::AddrInUse, message));
    }
    fs::remove_file(path)
}
