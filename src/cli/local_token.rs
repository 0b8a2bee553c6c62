//! Local mode's owner: the runtime token `keel serve` makes for itself when it is given
//! none, kept in `<data-dir>/runtime-token` where only the user who started it can read
//! it, and read back from there by the operator commands (`keel rpc` and `keel console`
//! too) that talk to a loopback API. Without a token, any process that reaches the loopback
//! port (a run with the network on, another user of the host) would be the local operator.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, bail};

use crate::config::{AuthArgs, Redacted};

/// The token's file in the data directory.
const FILE_NAME: &str = "runtime-token";
/// Shortest token a file may hold (the server's minimum for any runtime token).
const MIN_LEN: usize = 16;
/// Longest file read: a token is a line, not a document.
const MAX_BYTES: u64 = 4096;

/// `keel serve`'s authentication settings: in local mode without `KEEL_RUNTIME_TOKEN`, the
/// data directory's token, made at the first start. An explicit token wins, and remote
/// mode takes none.
pub(super) fn serve_auth(auth: &AuthArgs, data_dir: &Path) -> anyhow::Result<AuthArgs> {
    if auth.remote_mode || auth.runtime_token.is_some() {
        return Ok(auth.clone());
    }
    let path = data_dir.join(FILE_NAME);
    let token = load_or_create(data_dir, &path)?;
    eprintln!(
        "keel: the API's runtime token is in {} (readable by this user alone); `keel` \
         commands on this host read it from there, and `keel console` prints a sign-in link \
         for the console",
        path.display()
    );
    Ok(AuthArgs {
        runtime_token: Some(token),
        ..auth.clone()
    })
}

/// The token a client of `url` presents when it is given none: the local runtime's, from
/// `data_dir`, and only when `url` names a loopback address, so a file on this host never
/// hands a token to another one. No file: none (the API says 401 if it needs one).
pub(super) fn for_client(url: &str, data_dir: &Path) -> Result<Option<String>, String> {
    if !is_loopback(url) {
        return Ok(None);
    }
    let path = data_dir.join(FILE_NAME);
    let mut text = String::new();
    let read = File::open(&path).and_then(|file| file.take(MAX_BYTES).read_to_string(&mut text));
    match read {
        Ok(_) => Ok(Some(text.trim().to_string()).filter(|token| !token.is_empty())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!(
            "cannot read the local runtime token in {}: {e}; give it with --token \
             (KEEL_RUNTIME_TOKEN), or --data-dir (KEEL_DATA_DIR) for another data directory",
            path.display()
        )),
    }
}

/// Whether the URL's host is `localhost` or a loopback address.
fn is_loopback(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    // An IPv6 host is written in brackets.
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The token in `path`, or a new one published there.
fn load_or_create(data_dir: &Path, path: &Path) -> anyhow::Result<Redacted> {
    if let Some(token) = load(path)? {
        return Ok(token);
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    match publish(data_dir, path)? {
        Some(token) => Ok(token),
        // Another `keel serve` on this data directory published its token first.
        None => load(path)?.with_context(|| format!("{} vanished", path.display())),
    }
}

/// The token in an existing file that is this user's alone, or None when there is no file.
/// A file others may read is refused, not repaired: its token may be known already.
fn load(path: &Path) -> anyhow::Result<Option<Redacted>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| {
                format!("opening {} (a symbolic link is refused)", path.display())
            });
        }
    };
    check_private(&file, path)?;
    let mut text = String::new();
    file.take(MAX_BYTES)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    let token = text.trim();
    if token.len() < MIN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "{} does not hold a runtime token (at least {MIN_LEN} visible characters): \
             delete it to have a new one made",
            path.display()
        );
    }
    Ok(Some(token.parse()?))
}

/// Refuses a token file that is not a regular file of this user's, private to it.
fn check_private(file: &File, path: &Path) -> anyhow::Result<()> {
    let meta = file.metadata()?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.uid() != me {
        bail!(
            "{} belongs to uid {}, not to this user (uid {me}): it is not this runtime's \
             token; delete it, or choose another --data-dir",
            path.display(),
            meta.uid()
        );
    }
    if mode & 0o077 != 0 {
        bail!(
            "{path} may be read or written by others (mode {mode:04o}), so its token may be \
             known: delete it to have a new one made at the next start (or, if no one else \
             can have read it, `chmod 600 {path}`)",
            path = path.display()
        );
    }
    Ok(())
}

/// Writes a new token to a private staging file and links it into place: the file is
/// 0600 from its creation (never readable by others, not even for an instant), appears
/// whole, and never replaces another's. None: a file was there first.
fn publish(data_dir: &Path, path: &Path) -> anyhow::Result<Option<Redacted>> {
    let token = hex::encode(random::<32>());
    let staged = data_dir.join(format!(".{FILE_NAME}.{}", hex::encode(random::<8>())));
    let written = write_private(&staged, &token);
    let linked = written.and_then(|()| std::fs::hard_link(&staged, path));
    let _ = std::fs::remove_file(&staged);
    match linked {
        Ok(()) => {
            // The new name survives a crash once the directory is on disk too.
            File::open(data_dir)
                .and_then(|dir| dir.sync_all())
                .with_context(|| format!("syncing {}", data_dir.display()))?;
            Ok(Some(token.parse()?))
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e).with_context(|| format!("writing {}", path.display())),
    }
}

fn write_private(staged: &Path, token: &str) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(staged)?;
    writeln!(file, "{token}")?;
    file.sync_all()
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_loopback_urls_get_the_local_token() {
        for url in [
            "http://127.0.0.1:8420",
            "http://127.0.0.2:1",
            "http://localhost:8420/",
            "http://[::1]:8420",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "http://10.0.0.1:8420",
            "https://keel.example.com",
            "http://localhost.example.com",
            "not a url",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }

    #[test]
    fn a_token_is_made_once_private_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let path = data.join(FILE_NAME);
        let made = load_or_create(&data, &path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(made.expose().len(), 64);
        let again = load_or_create(&data, &path).unwrap();
        assert_eq!(again.expose(), made.expose());
        // Nothing staged is left behind.
        let names: Vec<_> = std::fs::read_dir(&data).unwrap().collect();
        assert_eq!(names.len(), 1);
        let read = for_client("http://127.0.0.1:8420", &data).unwrap();
        assert_eq!(read.as_deref(), Some(made.expose()));
        assert_eq!(for_client("https://keel.example.com", &data), Ok(None));
        assert_eq!(for_client("http://[::1]:1", dir.path()), Ok(None));
    }

    #[test]
    fn a_file_others_may_read_a_link_or_a_short_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "a-token-of-sixteen-chars\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = load_or_create(dir.path(), &path).unwrap_err().to_string();
        assert!(refused.contains("mode 0644"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_or_create(dir.path(), &path).is_ok());

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(load_or_create(dir.path(), &link).is_err());

        std::fs::write(&path, "short\n").unwrap();
        let refused = load_or_create(dir.path(), &path).unwrap_err().to_string();
        assert!(
            refused.contains("does not hold a runtime token"),
            "{refused}"
        );
    }
}
