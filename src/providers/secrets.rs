//! Secret references: how a preset names a credential without holding it. `env:NAME` reads
//! the process environment, `file:/path` a file (container secrets are mounted as files);
//! `keychain:` is understood but no keychain exists in this runtime. Values are resolved
//! only by the worker that needs them, at execution time, and never stored or logged.
//!
//! Which references may be used at all is the operator's [`SecretPolicy`]: whoever can
//! write a preset can send its credential to any URL, so a preset must not be able to name
//! Keel's own database URL or an arbitrary file. Which of those a workspace's tenants (its
//! members and its operators) may name is the runtime operator's grants
//! (`KEEL_SECRET_GRANTS`): every other allowed reference is the deployment's, and only the
//! runtime operator writes a preset, a source or a task that names it
//! ([`SecretPolicy::check_for`]).

use keel_api_types::ErrorCode;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

pub(crate) use keel_api_types::SecretStatus;
use keel_workers::media::Secret;

use crate::domain::Role;

/// Largest secret file read; a credential is small, and a wrong path should not load a
/// large file into memory.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretRef {
    Env(String),
    File(PathBuf),
    Keychain(String),
}

/// A reference that does not resolve; the message names the reference, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub(crate) struct Unresolved {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

impl SecretRef {
    pub(crate) fn parse(value: &str) -> Result<SecretRef, String> {
        let invalid = || {
            "must be a secret reference: env:NAME, file:/absolute/path or keychain:NAME \
             (raw keys are never accepted)"
                .to_string()
        };
        let (scheme, rest) = value.split_once(':').ok_or_else(invalid)?;
        match scheme {
            "env" if is_env_name(rest) => Ok(SecretRef::Env(rest.to_string())),
            "file" if rest.starts_with('/') && !rest.contains('\0') => {
                Ok(SecretRef::File(PathBuf::from(rest)))
            }
            "keychain"
                if !rest.is_empty()
                    && !rest.contains('\0')
                    && rest.chars().count() <= keel_api_types::schema::MAX_KEYCHAIN_NAME =>
            {
                Ok(SecretRef::Keychain(rest.to_string()))
            }
            _ => Err(invalid()),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            SecretRef::Env(_) => "env",
            SecretRef::File(_) => "file",
            SecretRef::Keychain(_) => "keychain",
        }
    }

    /// Reads the value, if `policy` allows the reference; the policy is checked first, so a
    /// refused reference reads nothing. Surrounding whitespace (a file's trailing newline)
    /// is dropped. Blocking: it may read a file.
    pub(crate) fn resolve(&self, policy: &SecretPolicy) -> Result<Secret, Unresolved> {
        policy.check(self).map_err(|message| Unresolved {
            code: ErrorCode::SecretNotAllowed,
            message,
        })?;
        let missing = |message: String| Unresolved {
            code: ErrorCode::SecretMissing,
            message,
        };
        let value = match self {
            SecretRef::Env(name) => keel_workers::seal::var(name)
                .ok_or_else(|| missing(format!("environment variable {name} is not set")))?,
            SecretRef::File(path) => read_secret_file(path, policy).map_err(missing)?,
            SecretRef::Keychain(_) => {
                return Err(Unresolved {
                    code: ErrorCode::SecretStoreUnavailable,
                    message: "Keychain secret store is unavailable in this runtime.".into(),
                });
            }
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(missing(format!("{self} is empty")));
        }
        Ok(Secret::new(value.to_string()))
    }

    /// Whether the reference resolves under `policy`. Blocking: it may read a file.
    pub(crate) fn status(&self, policy: &SecretPolicy) -> SecretStatus {
        let resolved = self.resolve(policy);
        let (error_code, message) = match &resolved {
            Ok(_) => (None, None),
            Err(e) => (Some(e.code.to_string()), Some(e.message.clone())),
        };
        SecretStatus {
            r#ref: self.to_string(),
            kind: self.kind().to_string(),
            configured: resolved.is_ok(),
            error_code,
            message,
        }
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretRef::Env(name) => write!(f, "env:{name}"),
            SecretRef::File(path) => write!(f, "file:{}", path.display()),
            SecretRef::Keychain(name) => write!(f, "keychain:{name}"),
        }
    }
}

pub(crate) fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads a secret file of at most [`MAX_SECRET_FILE_BYTES`]. The file is opened first and
/// its real path taken from the open descriptor, so a symlink (anywhere on the path) that
/// leads out of the roots is refused, and cannot be swapped in between check and read.
/// Non-blocking open: a FIFO under a root cannot hang the reader.
fn read_secret_file(path: &Path, policy: &SecretPolicy) -> Result<String, String> {
    let unreadable = |why: &str| format!("secret file {} {why}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .map_err(|_| unreadable("cannot be read"))?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| unreadable("cannot be located"))?;
    if !policy.holds_real(&real) {
        return Err(unreadable(
            "leads outside KEEL_SECRET_FILE_ROOTS (a symbolic link); the secret policy refuses it",
        ));
    }
    let meta = file.metadata().map_err(|_| unreadable("cannot be read"))?;
    if !meta.is_file() {
        return Err(unreadable("is not a small regular file"));
    }
    let mut text = String::new();
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|_| unreadable("cannot be read as text"))?;
    if text.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(unreadable("is not a small regular file"));
    }
    Ok(text)
}

/// `KEEL_SECRET_ENV_ALLOW`'s default.
pub(crate) const DEFAULT_ENV_ALLOW: &str = "*_API_KEY,*_TOKEN,KEEL_SECRET_*";
/// `KEEL_SECRET_FILE_ROOTS`' default: where Docker and Kubernetes mount secrets.
pub(crate) const DEFAULT_FILE_ROOTS: &str = "/run/secrets";

/// Environment names no pattern can allow: Keel's own database (`DATABASE_URL`, libpq's
/// `PG*`), S3 (`AWS_*`) and telemetry (`OTEL_*`, whose exporter headers carry
/// credentials) settings, and every `KEEL_*` setting (the database URL, S3, the runtime
/// token, the remote-identity secrets) except the `KEEL_SECRET_*` family meant for presets.
/// Compared without case, so no spelling slips through.
const RESERVED_ENV: [&str; 4] = ["DATABASE_URL", "PG*", "AWS_*", "OTEL_*"];

/// Which secret references may be used: environment names matching one of `env_allow`
/// (glob patterns, `*` matching any run of characters) and not reserved, and files beneath
/// one of `file_roots`. Keychain references are allowed (they never resolve here).
#[derive(Debug, Clone)]
pub struct SecretPolicy {
    env_allow: Vec<String>,
    file_roots: Vec<PathBuf>,
    /// (workspace, reference pattern): what that workspace's members may name.
    grants: Vec<(String, String)>,
}

impl Default for SecretPolicy {
    fn default() -> Self {
        SecretPolicy::new(
            vec![DEFAULT_ENV_ALLOW.to_string()],
            vec![PathBuf::from(DEFAULT_FILE_ROOTS)],
        )
    }
}

impl SecretPolicy {
    /// Patterns may come comma-joined; empty ones are dropped. A relative root holds
    /// nothing (references are absolute).
    pub fn new(env_allow: Vec<String>, file_roots: Vec<PathBuf>) -> Self {
        SecretPolicy {
            env_allow: env_allow
                .iter()
                .flat_map(|p| p.split(','))
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
            file_roots: file_roots.into_iter().filter(|r| r.is_absolute()).collect(),
            grants: Vec::new(),
        }
    }

    /// The policy with the operator's grants: `WORKSPACE=PATTERN` entries (a pattern is a
    /// reference, `*` matching any run of characters: `env:ORG_A_*`). The workspace is
    /// what precedes the first `=`.
    pub(crate) fn with_grants(mut self, entries: &[String]) -> Result<Self, String> {
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (workspace, pattern) = entry
                .split_once('=')
                .filter(|(w, p)| !w.is_empty() && !p.is_empty())
                .ok_or_else(|| {
                    format!("KEEL_SECRET_GRANTS: {entry:?} is not WORKSPACE=REFERENCE")
                })?;
            self.grants
                .push((workspace.to_string(), pattern.to_string()));
        }
        Ok(self)
    }

    /// Whether what `writer` wrote in `workspace` may name `secret`: the runtime operator
    /// any reference the policy allows, a tenant (a member or the org's operator) only
    /// those granted to its workspace. The one rule for presets, sources' tracker keys,
    /// tasks' MCP servers and repository credentials, when written and at each use.
    pub(crate) fn check_for(
        &self,
        writer: Role,
        workspace: &str,
        secret: &SecretRef,
    ) -> Result<(), String> {
        match writer.is_runtime_operator() {
            true => self.check(secret),
            false => self.check_granted(workspace, secret),
        }
    }

    /// Whether `workspace`'s tenants may name `secret`: the policy allows it and a grant
    /// of that workspace matches it.
    pub(crate) fn check_granted(&self, workspace: &str, secret: &SecretRef) -> Result<(), String> {
        self.check(secret)?;
        let reference = secret.to_string();
        let granted = self
            .grants
            .iter()
            .any(|(w, pattern)| w == workspace && glob_match(pattern, &reference));
        if granted {
            return Ok(());
        }
        Err(format!(
            "{secret} is not granted to workspace {workspace} (KEEL_SECRET_GRANTS); only the \
             runtime operator may name it"
        ))
    }

    /// Whether the policy allows `secret`; the message names the reference and the
    /// setting that refuses it. Needs no file system: a file is checked by its path here,
    /// and by its real path when it is read.
    pub(crate) fn check(&self, secret: &SecretRef) -> Result<(), String> {
        match secret {
            SecretRef::Env(name) if is_reserved(name) => Err(format!(
                "{secret} names one of Keel's own settings (database, S3, runtime token, remote \
                 secrets, telemetry), which the secret policy never allows"
            )),
            SecretRef::Env(name) if !self.env_allow.iter().any(|p| glob_match(p, name)) => {
                Err(format!(
                    "{secret} is not allowed by the secret policy: environment names must match \
                     KEEL_SECRET_ENV_ALLOW ({})",
                    self.env_allow.join(",")
                ))
            }
            SecretRef::File(path) if !self.holds(path) => Err(format!(
                "{secret} is not allowed by the secret policy: files must lie beneath \
                 KEEL_SECRET_FILE_ROOTS ({}), named without `.` or `..`",
                self.roots_list()
            )),
            _ => Ok(()),
        }
    }

    /// Whether `path`, as written, lies strictly beneath a root.
    fn holds(&self, path: &Path) -> bool {
        let plain = path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        plain && self.file_roots.iter().any(|root| beneath(path, root))
    }

    /// Whether a real (symlink-free) path lies beneath a root's real path.
    fn holds_real(&self, real: &Path) -> bool {
        self.file_roots
            .iter()
            .filter_map(|root| root.canonicalize().ok())
            .any(|root| beneath(real, &root))
    }

    fn roots_list(&self) -> String {
        let roots: Vec<_> = self
            .file_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        roots.join(",")
    }
}

fn beneath(path: &Path, root: &Path) -> bool {
    path.starts_with(root) && path != root
}

fn is_reserved(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    (upper.starts_with("KEEL_") && !upper.starts_with("KEEL_SECRET_"))
        || RESERVED_ENV.iter().any(|p| glob_match(p, &upper))
}

/// `*` matches any run of characters (none included); everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_raw_keys_do_not() {
        assert_eq!(
            SecretRef::parse("env:OPENAI_API_KEY"),
            Ok(SecretRef::Env("OPENAI_API_KEY".into()))
        );
        assert!(SecretRef::parse("file:/run/secrets/key").is_ok());
        assert!(SecretRef::parse("keychain:provider_local").is_ok());
        for bad in ["sk-abc123", "env:", "env:1X", "file:relative", "vault:x"] {
            assert!(SecretRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn status_reports_configuration_never_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "s3cr3t-value\n").unwrap();
        let policy = SecretPolicy::new(vec![], vec![dir.path().to_path_buf()]);
        let file = SecretRef::File(path.clone());
        assert_eq!(file.resolve(&policy).unwrap().expose(), "s3cr3t-value");
        let status = file.status(&policy);
        assert!(status.configured);
        assert!(!serde_json::to_string(&status).unwrap().contains("s3cr3t"));
        let keychain = SecretRef::parse("keychain:x").unwrap().status(&policy);
        assert_eq!(
            keychain.error_code.as_deref(),
            Some("secret_store_unavailable")
        );
        let missing = SecretRef::File(dir.path().join("nope")).status(&policy);
        assert_eq!(missing.error_code.as_deref(), Some("secret_missing"));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("*_API_KEY", "OPENAI_API_KEY"));
        assert!(glob_match("*_API_KEY", "_API_KEY"));
        assert!(!glob_match("*_API_KEY", "OPENAI_API_KEYS"));
        assert!(glob_match("KEEL_SECRET_*", "KEEL_SECRET_X"));
        assert!(glob_match("A*B*C", "AxxBxxC"));
        assert!(!glob_match("A*B*C", "AC"));
        assert!(glob_match("PATH", "PATH"));
        assert!(!glob_match("PATH", "PATHS"));
        assert!(glob_match("*", "ANY"));
    }

    #[test]
    fn the_policy_never_allows_keels_own_settings() {
        let everything = SecretPolicy::new(vec!["*".into()], vec![]);
        for name in [
            "KEEL_DATABASE_URL",
            "DATABASE_URL",
            "PGPASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "aws_session_token",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "KEEL_RUNTIME_TOKEN",
            "KEEL_REMOTE_SHARED_SECRET",
        ] {
            assert!(
                everything.check(&SecretRef::Env(name.into())).is_err(),
                "{name}"
            );
        }
        let default = SecretPolicy::default();
        for (name, allowed) in [
            ("OPENAI_API_KEY", true),
            ("GITHUB_TOKEN", true),
            ("KEEL_SECRET_ARK", true),
            ("PATH", false),
            ("HOME", false),
        ] {
            let checked = default.check(&SecretRef::Env(name.into()));
            assert_eq!(checked.is_ok(), allowed, "{name}");
        }
    }

    #[test]
    fn members_name_only_what_their_workspace_was_granted() {
        let grants = [
            "org_a=env:OPENAI_API_KEY".into(),
            "org_a=env:ORG_A_*".into(),
        ];
        let policy = SecretPolicy::default().with_grants(&grants).unwrap();
        let env = |name: &str| SecretRef::Env(name.into());
        assert!(
            policy
                .check_granted("org_a", &env("OPENAI_API_KEY"))
                .is_ok()
        );
        assert!(policy.check_granted("org_a", &env("ORG_A_API_KEY")).is_ok());
        assert!(
            policy
                .check_granted("org_b", &env("OPENAI_API_KEY"))
                .is_err()
        );
        assert!(policy.check_granted("org_a", &env("GITHUB_TOKEN")).is_err());
        // A grant does not widen the policy: Keel's own settings stay out of reach.
        let wide = SecretPolicy::default()
            .with_grants(&["org_a=env:*".into()])
            .unwrap();
        assert!(
            wide.check_granted("org_a", &env("KEEL_RUNTIME_TOKEN"))
                .is_err()
        );
        // Only the runtime operator names what was not granted; an org's operator does not.
        let operators = env("GITHUB_TOKEN");
        assert!(
            policy
                .check_for(Role::Operator, "org_a", &operators)
                .is_err()
        );
        assert!(
            policy
                .check_for(Role::RuntimeOperator, "org_a", &operators)
                .is_ok()
        );
        assert!(
            policy
                .check_for(Role::Operator, "org_a", &env("ORG_A_API_KEY"))
                .is_ok()
        );
        for bad in ["org_a", "=env:X", "org_a="] {
            assert!(
                SecretPolicy::default().with_grants(&[bad.into()]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn files_must_stay_beneath_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("secrets");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(dir.path().join("outside"), "outside-value").unwrap();
        std::fs::write(root.join("key"), "inside-value").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link")).unwrap();
        let policy = SecretPolicy::new(vec![], vec![root.clone()]);
        let file = |p: PathBuf| SecretRef::File(p);
        assert!(policy.check(&file(root.join("key"))).is_ok());
        assert!(policy.check(&file(root.clone())).is_err());
        assert!(policy.check(&file(root.join("../outside"))).is_err());
        assert!(policy.check(&file("/etc/passwd".into())).is_err());
        let refused = file("/etc/passwd".into()).resolve(&policy).unwrap_err();
        assert_eq!(refused.code.as_str(), "secret_not_allowed");
        // Allowed by its path, refused by where it really leads.
        let link = file(root.join("link")).resolve(&policy).unwrap_err();
        assert!(link.message.contains("symbolic link"), "{}", link.message);
        std::fs::write(
            root.join("big"),
            vec![b'x'; MAX_SECRET_FILE_BYTES as usize + 1],
        )
        .unwrap();
        assert!(file(root.join("big")).resolve(&policy).is_err());
    }
}
