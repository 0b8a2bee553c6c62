//! Secret references: how a preset names a credential without holding it. `env:NAME` reads
//! the process environment, `file:/path` a file (container secrets are mounted as files);
//! `keychain:` is understood but no keychain exists in this runtime. Values are resolved
//! only by the worker that needs them, at execution time, and never stored or logged.

use std::path::PathBuf;

use keel_workers::media::Secret;
use serde::Serialize;
use utoipa::ToSchema;

/// Largest secret file read; a credential is small, and a wrong path should not load a
/// large file into memory.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    Env(String),
    File(PathBuf),
    Keychain(String),
}

/// Whether a reference resolves, as `GET /v1/secrets/status` and provider views report it:
/// never the value.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq, Eq)]
pub struct SecretStatus {
    /// The reference as given.
    #[schema(example = "env:OPENAI_API_KEY")]
    pub r#ref: String,
    /// `env`, `file` or `keychain`.
    pub kind: &'static str,
    pub configured: bool,
    /// Why it is not configured: `secret_missing` or `secret_store_unavailable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A reference that does not resolve; the message names the reference, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Unresolved {
    pub code: &'static str,
    pub message: String,
}

impl SecretRef {
    pub fn parse(value: &str) -> Result<SecretRef, String> {
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
            "keychain" if !rest.is_empty() && rest.len() <= 200 => {
                Ok(SecretRef::Keychain(rest.to_string()))
            }
            _ => Err(invalid()),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            SecretRef::Env(_) => "env",
            SecretRef::File(_) => "file",
            SecretRef::Keychain(_) => "keychain",
        }
    }

    /// Reads the value. Surrounding whitespace (a file's trailing newline) is dropped.
    pub fn resolve(&self) -> Result<Secret, Unresolved> {
        let missing = |message: String| Unresolved {
            code: "secret_missing",
            message,
        };
        let value = match self {
            SecretRef::Env(name) => std::env::var(name)
                .map_err(|_| missing(format!("environment variable {name} is not set")))?,
            SecretRef::File(path) => read_secret_file(path).map_err(missing)?,
            SecretRef::Keychain(_) => {
                return Err(Unresolved {
                    code: "secret_store_unavailable",
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

    pub fn status(&self) -> SecretStatus {
        let resolved = self.resolve();
        let (error_code, message) = match &resolved {
            Ok(_) => (None, None),
            Err(e) => (Some(e.code), Some(e.message.clone())),
        };
        SecretStatus {
            r#ref: self.to_string(),
            kind: self.kind(),
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

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn read_secret_file(path: &std::path::Path) -> Result<String, String> {
    let unreadable = |why: &str| format!("secret file {} {why}", path.display());
    let meta = std::fs::metadata(path).map_err(|_| unreadable("cannot be read"))?;
    if !meta.is_file() || meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(unreadable("is not a small regular file"));
    }
    std::fs::read_to_string(path).map_err(|_| unreadable("cannot be read as text"))
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
        let file = SecretRef::File(path.clone());
        assert_eq!(file.resolve().unwrap().expose(), "s3cr3t-value");
        let status = file.status();
        assert!(status.configured);
        assert!(!serde_json::to_string(&status).unwrap().contains("s3cr3t"));
        let keychain = SecretRef::parse("keychain:x").unwrap().status();
        assert_eq!(keychain.error_code, Some("secret_store_unavailable"));
        let missing = SecretRef::File(dir.path().join("nope")).status();
        assert_eq!(missing.error_code, Some("secret_missing"));
    }
}
