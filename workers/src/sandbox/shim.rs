//! What a jail with network runs first, inside its namespaces, before the run's command:
//! the run's network namespace has only loopback, so the shim listens there on the ports
//! the run's `HTTP_PROXY` and `ALL_PROXY` name, and carries every connection to the egress
//! proxy's Unix socket ([`super::egress`]), bound into the jail. It listens before the
//! command starts (no race with the command's first connection), then runs the command and
//! ends as it ends. It is the jail's PID 1 (bubblewrap's `--as-pid-1`): it reaps what the
//! command leaves behind, and no signal from inside the jail reaches it (a run's
//! `kill -9 -1` ends the run's processes, not its way out); its end ends the jail.
//!
//! It is the `keel` binary itself (`keel sandbox-shim …`, [`ARG`]), bound read-only into
//! the jail: no helper to install, and std only, so it starts in well under a millisecond.
//! It runs with the run's own uid and rights, and guards nothing: whatever a run does to
//! it, the proxy outside is what decides.

use std::ffi::OsString;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The `keel` subcommand that is the shim; the binary's `main` hands it over before
/// anything else starts.
pub const ARG: &str = "sandbox-shim";
/// Where the jail sees the shim and the proxy's socket.
pub(super) const INSIDE: &str = "/run/keel/shim";
pub(super) const SOCKET_INSIDE: &str = "/run/keel/egress.sock";
/// The loopback ports inside the jail: HTTP's usual proxy port, and SOCKS's.
pub(super) const HTTP_PORT: u16 = 3128;
pub(super) const SOCKS_PORT: u16 = 1080;

/// The argv that runs `command` behind the shim, inside the jail.
pub(super) fn argv(command: &[String]) -> Vec<String> {
    [
        INSIDE,
        ARG,
        SOCKET_INSIDE,
        &HTTP_PORT.to_string(),
        &SOCKS_PORT.to_string(),
        "--",
    ]
    .into_iter()
    .map(String::from)
    .chain(command.iter().cloned())
    .collect()
}

/// The variables that point a run's HTTP clients (curl, git, pip, npm, …) and SOCKS
/// clients at the shim's ports. Loopback inside the jail is the run's own, so it is
/// reached directly.
pub(super) fn proxy_environment() -> Vec<(&'static str, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PORT}");
    let direct = "localhost,127.0.0.1,::1".to_string();
    vec![
        ("HTTP_PROXY", http.clone()),
        ("HTTPS_PROXY", http.clone()),
        ("http_proxy", http.clone()),
        ("https_proxy", http),
        ("ALL_PROXY", socks.clone()),
        ("all_proxy", socks),
        ("NO_PROXY", direct.clone()),
        ("no_proxy", direct),
    ]
}

/// `keel sandbox-shim SOCKET PORT… -- COMMAND ARG…` (the arguments after the subcommand).
pub fn main(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    let Some(socket) = args.next().map(PathBuf::from) else {
        return usage();
    };
    let mut ports = Vec::new();
    for arg in args.by_ref() {
        if arg == "--" {
            break;
        }
        match arg.to_str().and_then(|port| port.parse::<u16>().ok()) {
            Some(port) => ports.push(port),
            None => return usage(),
        }
    }
    let command: Vec<OsString> = args.collect();
    let Some((program, rest)) = command.split_first() else {
        return usage();
    };
    for port in ports {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => {
                let socket = socket.clone();
                std::thread::spawn(move || accept(listener, socket));
            }
            Err(error) => return failed(&format!("listening on 127.0.0.1:{port}: {error}")),
        }
    }
    match Command::new(program).args(rest).spawn() {
        Ok(child) => reap_until(child.id() as i32),
        Err(error) => failed(&format!("execvp {}: {error}", program.to_string_lossy())),
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

fn usage() -> ExitCode {
    failed("usage: keel sandbox-shim SOCKET PORT... -- COMMAND [ARG...]")
}

fn failed(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "keel-sandbox: {message}");
    ExitCode::FAILURE
}
