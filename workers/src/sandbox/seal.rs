//! A server process's own hygiene, so nothing it runs (and no other process of its uid)
//! can read what it was started with: it becomes non-dumpable (its `/proc/<pid>/environ`,
//! `mem` and file descriptors are closed to everyone but root, and ptrace with them), and
//! it keeps no secret in its environment once it has started. The environment it was
//! given is kept in memory, where [`var`] reads it (a secret reference `env:NAME` resolves
//! there); the process environment keeps only what is not secret, and the copy the kernel
//! shows in `/proc/<pid>/environ` is overwritten with zeros.
// The crate's second exception to `deny(unsafe_code)`: the environment is process-global
// C state, and clearing the kernel's copy of it means writing to memory libc points at.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, OsString, c_char};
use std::sync::OnceLock;

/// Variables the process environment keeps: what libraries and children read that holds
/// no secret. The OTLP exporters' variables stay until telemetry has read them
/// ([`finish`]), except their headers, which carry collectors' credentials.
fn kept(name: &str) -> bool {
    const NAMES: [&str; 14] = [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "NO_COLOR",
        "RUST_LOG",
        "RUST_BACKTRACE",
        "RUST_LIB_BACKTRACE",
    ];
    NAMES.contains(&name) || name.starts_with("LC_") || name.starts_with("OTEL_")
}

/// Whether telemetry's variable holds credentials: removed by [`finish`].
fn exporter_secret(name: &str) -> bool {
    name.starts_with("OTEL_") && name.contains("HEADERS")
}

static SNAPSHOT: OnceLock<HashMap<String, String>> = OnceLock::new();

/// The value `name` had when the process started (after [`begin`]), or has now (a process
/// that never sealed itself, such as a test).
pub fn var(name: &str) -> Option<String> {
    match SNAPSHOT.get() {
        Some(snapshot) => snapshot.get(name).cloned(),
        None => std::env::var(name).ok(),
    }
}

/// Every variable whose name starts with `prefix`, as [`var`] reads them.
pub fn vars_with_prefix(prefix: &str) -> Vec<(String, String)> {
    let matching = |(name, _): &(String, String)| name.starts_with(prefix);
    match SNAPSHOT.get() {
        Some(snapshot) => snapshot
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .filter(matching)
            .collect(),
        None => std::env::vars().filter(matching).collect(),
    }
}

/// Seals the process: keeps its environment in memory, clears what is secret from the
/// process environment and the kernel's copy of it, and makes the process non-dumpable.
/// Call it once, before the process starts any thread.
pub fn begin() -> Result<(), String> {
    let initial = initial_entries();
    let all: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let snapshot = all
        .iter()
        .filter_map(|(name, value)| Some((name.to_str()?.into(), value.to_str()?.into())))
        .collect();
    let _ = SNAPSHOT.set(snapshot);
    for (name, value) in &all {
        let keep = name.to_str().is_some_and(kept);
        // SAFETY: called before any thread starts (the caller's contract), so nothing reads
        // the environment meanwhile. Setting a kept variable again moves its string to the
        // heap, away from the block zeroed below.
        unsafe {
            std::env::remove_var(name);
            if keep {
                std::env::set_var(name, value);
            }
        }
    }
    for (start, len) in initial {
        // SAFETY: each range is one string of the environment block the kernel placed on
        // the stack at exec, which no environment entry points at any more (all were
        // removed or moved to the heap above) and nothing else refers to.
        unsafe { std::ptr::write_bytes(start, 0, len) };
    }
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("prctl(PR_SET_DUMPABLE): {e}"))
}

/// Removes what telemetry read at start-up and nothing else may: the OTLP headers.
pub fn finish() {
    let names: Vec<OsString> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_str().is_some_and(exporter_secret))
        .collect();
    for name in names {
        // SAFETY: the exporters read their settings while they were built, before this;
        // no other code of the process reads these variables, or the environment at all
        // outside [`var`] and the start of a child, neither of which runs yet.
        unsafe { std::env::remove_var(name) };
    }
}

/// Where each `NAME=value` string of the environment the process started with lies.
fn initial_entries() -> Vec<(*mut u8, usize)> {
    unsafe extern "C" {
        static environ: *const *mut c_char;
    }
    let mut entries = Vec::new();
    // SAFETY: `environ` is libc's null-terminated array of null-terminated strings; no
    // thread changes it while the process has one thread.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let start = *entry;
            entries.push((start.cast::<u8>(), CStr::from_ptr(start).count_bytes()));
            entry = entry.add(1);
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_leave_the_environment_and_what_libraries_need_stays() {
        for secret in [
            "KEEL_RUNTIME_TOKEN",
            "OPENAI_API_KEY",
            "DATABASE_URL",
            "PGPASSWORD",
        ] {
            assert!(!kept(secret), "{secret}");
        }
        for plain in ["PATH", "LANG", "LC_ALL", "OTEL_EXPORTER_OTLP_ENDPOINT"] {
            assert!(kept(plain), "{plain}");
        }
        assert!(exporter_secret("OTEL_EXPORTER_OTLP_HEADERS"));
        assert!(exporter_secret("OTEL_EXPORTER_OTLP_TRACES_HEADERS"));
        assert!(!exporter_secret("OTEL_EXPORTER_OTLP_ENDPOINT"));
    }
}
