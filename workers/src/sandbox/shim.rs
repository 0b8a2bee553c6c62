//! What every jail runs first, as its PID 1 (bubblewrap's `--as-pid-1`), before the run's
//! command:
//!
//! - it checks that the workspace bound in is the directory the worker opened and handed
//!   over: bubblewrap binds it by path, as the run's uid, after the worker's check, and a
//!   run that owns a directory on that path could have swapped it for a link to another
//!   tenant's directory in between. The bind is what it is once the jail exists, so the
//!   check, by device and inode of the jail's working directory, is final;
//! - with network, since the run's network namespace has only loopback, it listens there on
//!   the ports the run's `HTTP_PROXY` and `ALL_PROXY` name and carries every connection to
//!   the egress proxy's Unix socket ([`super::egress`]) bound into the jail. It listens
//!   before the command starts, so the command's first connection finds it;
//! - `--connect HOST PORT` is ssh's `ProxyCommand` in such a jail (the run's
//!   `GIT_SSH_COMMAND` names it): ssh speaks no HTTP or SOCKS, so this asks the proxy for a
//!   tunnel and carries ssh's stdin and stdout through it;
//! - it reaps what the command leaves behind, and no signal from inside the jail reaches it
//!   (a run's `kill -9 -1` ends the run's processes, not its way out). It ends as the
//!   command ends, and its end ends the jail.
//!
//! It is the small `keel-sandbox-shim` binary beside `keel` (or `keel` itself, whose
//! `sandbox-shim` subcommand, [`ARG`], is the same code), bound read-only into the jail.
//! It runs with the run's own uid and rights and guards nothing the run could get around:
//! the proxy outside decides where connections go.

use std::ffi::OsString;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The shim's binary, found beside `keel` ([`beside`]).
const BINARY: &str = "keel-sandbox-shim";

/// The shim for the `keel` binary at `keel`: `keel-sandbox-shim` beside it, or `keel`
/// itself (whose `sandbox-shim` subcommand is the same shim) where that is missing or was
/// built from another shim's source (`cargo run` builds `keel` alone and leaves an older
/// `keel-sandbox-shim` beside it, which would not speak what the worker asks of it).
pub fn beside(keel: &std::path::Path) -> PathBuf {
    let shim = keel.with_file_name(BINARY);
    let answer = Command::new(&shim).args([ARG, "--source"]).output();
    let same = answer.is_ok_and(|out| out.status.success() && out.stdout == source().as_bytes());
    match same {
        true => shim,
        false => keel.to_path_buf(),
    }
}

/// What identifies this shim's source: a hash (FNV-1a) of this file, the same in every
/// binary built from it.
fn source() -> String {
    const HASH: u64 = fnv1a(include_bytes!("shim.rs"));
    format!("{HASH:016x}\n")
}

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// The `keel` subcommand that is the shim; the binary's `main` hands it over before
/// anything else starts.
pub const ARG: &str = "sandbox-shim";
/// Where the jail sees the shim and the proxy's socket.
pub(super) const INSIDE: &str = "/run/keel/shim";
pub(super) const SOCKET_INSIDE: &str = "/run/keel/egress.sock";
/// The loopback ports inside the jail: HTTP's usual proxy port, and SOCKS's.
pub(super) const HTTP_PORT: u16 = 3128;
pub(super) const SOCKS_PORT: u16 = 1080;

/// The device and inode of the workspace the worker opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) device: u64,
    pub(super) inode: u64,
}

/// The argv that runs `command` behind the shim, inside the jail: with the egress proxy's
/// socket and ports when the jail has network.
pub(super) fn argv(workspace: Identity, network: bool, command: &[String]) -> Vec<String> {
    let mut argv = vec![
        INSIDE.to_string(),
        ARG.to_string(),
        "--workspace".to_string(),
        format!("{}:{}", workspace.device, workspace.inode),
    ];
    if network {
        argv.extend(["--egress".to_string(), SOCKET_INSIDE.to_string()]);
        argv.extend([HTTP_PORT, SOCKS_PORT].map(|port| port.to_string()));
    }
    argv.push("--".to_string());
    argv.extend(command.iter().cloned());
    argv
}

/// The variables that point a run's HTTP clients (curl, git, pip, npm, …) and SOCKS
/// clients at the shim's ports, and git's ssh at the shim's tunnel (`KEEL_SSH_PROXY_COMMAND`
/// is that `ProxyCommand`, for a run's own `ssh -o ProxyCommand=…`). Loopback inside the
/// jail is the run's own, so it is reached directly.
pub(super) fn proxy_environment() -> Vec<(&'static str, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PORT}");
    let direct = "localhost,127.0.0.1,::1".to_string();
    // What ssh runs (its `ProxyCommand`, `%h` and `%p` its own) to reach a host.
    let ssh = format!("{INSIDE} {ARG} --connect %h %p");
    vec![
        ("HTTP_PROXY", http.clone()),
        ("HTTPS_PROXY", http.clone()),
        ("http_proxy", http.clone()),
        ("https_proxy", http),
        ("ALL_PROXY", socks.clone()),
        ("all_proxy", socks),
        ("NO_PROXY", direct.clone()),
        ("no_proxy", direct),
        ("GIT_SSH_COMMAND", format!("ssh -o ProxyCommand='{ssh}'")),
        ("KEEL_SSH_PROXY_COMMAND", ssh),
    ]
}

/// What the shim was told: the workspace's identity, the proxy's socket and the ports to
/// serve it on (none without network), and the command.
struct Invocation {
    workspace: Identity,
    egress: Option<(PathBuf, Vec<u16>)>,
    command: Vec<OsString>,
}

/// `keel sandbox-shim --workspace DEV:INO [--egress SOCKET PORT…] -- COMMAND ARG…` (the
/// arguments after the subcommand).
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let mut args = args.peekable();
    if args.peek().is_some_and(|arg| arg == "--source") {
        print!("{}", source());
        return ExitCode::SUCCESS;
    }
    if args.peek().is_some_and(|arg| arg == "--connect") {
        return match (args.nth(1), args.next(), args.next()) {
            (Some(host), Some(port), None) => {
                tunnel(&host.to_string_lossy(), &port.to_string_lossy())
            }
            _ => failed("usage: keel sandbox-shim --connect HOST PORT"),
        };
    }
    let Some(invocation) = parse(args) else {
        return failed(
            "usage: keel sandbox-shim --workspace DEV:INO [--egress SOCKET PORT...] \
             -- COMMAND [ARG...]",
        );
    };
    if let Err(why) = check_workspace(invocation.workspace) {
        return failed(&why);
    }
    if let Some((socket, ports)) = &invocation.egress {
        for port in ports {
            match TcpListener::bind(("127.0.0.1", *port)) {
                Ok(listener) => {
                    let socket = socket.clone();
                    std::thread::spawn(move || accept(listener, socket));
                }
                Err(error) => return failed(&format!("listening on 127.0.0.1:{port}: {error}")),
            }
        }
    }
    let Some((program, rest)) = invocation.command.split_first() else {
        return failed("no command");
    };
    match Command::new(program).args(rest).spawn() {
        Ok(child) => reap_until(child.id() as i32),
        Err(error) => failed(&format!("execvp {}: {error}", program.to_string_lossy())),
    }
}

fn parse(mut args: impl Iterator<Item = OsString>) -> Option<Invocation> {
    let text = |arg: Option<OsString>| arg.and_then(|arg| arg.into_string().ok());
    if text(args.next())? != "--workspace" {
        return None;
    }
    let workspace = text(args.next())?;
    let (device, inode) = workspace.split_once(':')?;
    let workspace = Identity {
        device: device.parse().ok()?,
        inode: inode.parse().ok()?,
    };
    let mut egress = None;
    loop {
        match text(args.next())?.as_str() {
            "--" => break,
            "--egress" => {
                let socket = PathBuf::from(args.next()?);
                let ports = [text(args.next())?, text(args.next())?];
                let ports = ports
                    .iter()
                    .map(|port| port.parse().ok())
                    .collect::<Option<_>>()?;
                egress = Some((socket, ports));
            }
            _ => return None,
        }
    }
    Some(Invocation {
        workspace,
        egress,
        command: args.collect(),
    })
}

/// The jail's working directory, where bubblewrap bound the workspace, must be the very
/// directory the worker opened.
fn check_workspace(expected: Identity) -> Result<(), String> {
    let bound = std::fs::metadata(".").map_err(|e| format!("workspace_refused: {e}"))?;
    let found = Identity {
        device: bound.dev(),
        inode: bound.ino(),
    };
    match found == expected {
        true => Ok(()),
        false => Err(
            "workspace_refused: the workspace's path led elsewhere when the \
                      sandbox bound it than when the worker opened it (a link swapped in)"
                .into(),
        ),
    }
}

/// Reaps every process that ends in the jail (orphans become PID 1's) until `command`
/// does, and ends as it ended: its exit code, or 128 and its signal, as bubblewrap's own
/// PID 1 reports it.
fn reap_until(command: i32) -> ExitCode {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() == command => {
                return ExitCode::from(code as u8);
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid.as_raw() == command => {
                return ExitCode::from(128u8.wrapping_add(signal as u8));
            }
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(error) => return failed(&format!("waiting for the command: {error}")),
        }
    }
}

fn accept(listener: TcpListener, socket: PathBuf) {
    for client in listener.incoming().flatten() {
        let socket = socket.clone();
        std::thread::spawn(move || {
            if let Ok(proxy) = UnixStream::connect(&socket) {
                splice(client, proxy);
            }
        });
    }
}

/// Copies both ways, each direction closing its write side at the other's end of input.
fn splice(client: TcpStream, proxy: UnixStream) {
    let (Ok(mut client_in), Ok(mut proxy_out)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let upward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_in, &mut proxy_out);
        let _ = proxy_out.shutdown(Shutdown::Write);
    });
    let (mut proxy_in, mut client_out) = (proxy, client);
    let _ = std::io::copy(&mut proxy_in, &mut client_out);
    let _ = client_out.shutdown(Shutdown::Write);
    let _ = upward.join();
}

/// Asks the egress proxy for a tunnel to `host`:`port` (HTTP `CONNECT`) and carries this
/// process's stdin and stdout through it; a refusal is told on stderr, as ssh shows it.
fn tunnel(host: &str, port: &str) -> ExitCode {
    let Ok(port) = port.parse::<u16>() else {
        return failed(&format!("{port:?} is not a port"));
    };
    let target = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    let opened = UnixStream::connect(SOCKET_INSIDE).and_then(|mut proxy| {
        write!(proxy, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")?;
        Ok((response_head(&mut proxy)?, proxy))
    });
    let (head, proxy) = match opened {
        Ok(opened) => opened,
        Err(error) => return failed(&format!("the egress proxy: {error}")),
    };
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return failed(&format!("the egress proxy refused {target}: {status}"));
    }
    let Ok(mut proxy_out) = proxy.try_clone() else {
        return failed("the egress proxy's connection");
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut proxy_out);
        let _ = proxy_out.shutdown(Shutdown::Write);
    });
    let mut proxy_in = proxy;
    let _ = std::io::copy(&mut proxy_in, &mut std::io::stdout().lock());
    ExitCode::SUCCESS
}

/// The proxy's answer up to its blank line, read a byte at a time so nothing of the
/// tunnel after it is taken (it is 8 KiB at most).
fn response_head(proxy: &mut UnixStream) -> std::io::Result<String> {
    use std::io::Read;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || proxy.read(&mut byte)? == 0 {
            return Err(std::io::Error::other("no answer"));
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn failed(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "keel-sandbox: {message}");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> impl Iterator<Item = OsString> {
        words
            .iter()
            .map(OsString::from)
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// A shim beside keel is taken only when it answers with this source's hash.
    #[test]
    fn a_shim_built_from_other_source_is_passed_over() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let keel = dir.path().join("keel");
        std::fs::write(&keel, "").unwrap();
        assert_eq!(beside(&keel), keel, "no shim beside it");
        let shim = dir.path().join(BINARY);
        for (answer, expected) in [(source(), &shim), ("0123\n".to_string(), &keel)] {
            let script =
                format!("#!/bin/sh\n[ \"$1 $2\" = \"{ARG} --source\" ] && printf '{answer}'\n");
            std::fs::write(&shim, script).unwrap();
            std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(&beside(&keel), expected, "{answer:?}");
        }
    }

    #[test]
    fn the_jail_s_arguments_read_back() {
        let identity = Identity {
            device: 2049,
            inode: 77,
        };
        let command = ["sh".to_string(), "-c".to_string(), "true".to_string()];
        for network in [false, true] {
            let argv = argv(identity, network, &command);
            assert_eq!(&argv[..2], [INSIDE, ARG]);
            let parsed = parse(args(
                &argv.iter().skip(2).map(String::as_str).collect::<Vec<_>>(),
            ))
            .expect("parsed");
            assert_eq!(parsed.workspace, identity);
            assert_eq!(parsed.command, ["sh", "-c", "true"]);
            let egress = parsed.egress;
            match network {
                true => assert_eq!(
                    egress,
                    Some((PathBuf::from(SOCKET_INSIDE), vec![HTTP_PORT, SOCKS_PORT]))
                ),
                false => assert_eq!(egress, None),
            }
        }
        for bad in [
            &["--workspace", "1-2", "--", "true"][..],
            &["--egress", "/s", "1", "2", "--", "true"],
            &[
                "--workspace",
                "1:2",
                "--egress",
                "/s",
                "http",
                "2",
                "--",
                "true",
            ],
            &["--workspace", "1:2", "--unknown", "--", "true"],
        ] {
            assert!(parse(args(bad)).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_working_directory_that_is_not_the_opened_workspace_is_refused() {
        let here = std::fs::metadata(".").unwrap();
        let same = Identity {
            device: here.dev(),
            inode: here.ino(),
        };
        assert_eq!(check_workspace(same), Ok(()));
        let other = Identity {
            inode: here.ino() + 1,
            ..same
        };
        let refused = check_workspace(other).unwrap_err();
        assert!(refused.starts_with("workspace_refused:"), "{refused}");
    }
}
