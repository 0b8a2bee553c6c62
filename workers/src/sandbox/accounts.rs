//! The accounts a jail's processes look themselves up in: the host's `/etc/passwd` and
//! `/etc/group`, with a line for the jail's uid, which no host file has. Without one, a
//! program that asks who it is refuses to run (ssh: "No user exists for uid …"), or says
//! so (`whoami`, Python's `getpass`). The files reach bubblewrap as sealed memory files at
//! fixed descriptors, which it binds over the host's.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::OnceLock;

use super::inherited::sealed_memory_file;

/// The name the jail's uid goes by.
const NAME: &str = "keel-run";
/// The descriptors bubblewrap reads the files from.
const PASSWD_FD: i32 = 4;
const GROUP_FD: i32 = 5;

#[derive(Debug)]
pub(super) struct Accounts {
    passwd: String,
    group: String,
}

impl Accounts {
    /// The host's accounts with `uid` (its own group, `home` its home) added, unless the
    /// host has it already.
    pub(super) fn with(uid: u32, home: &Path) -> Accounts {
        let (passwd, group) = host();
        let mut accounts = Accounts {
            passwd: passwd.clone(),
            group: group.clone(),
        };
        if !has_id(passwd, uid) {
            let home = home.to_string_lossy();
            accounts
                .passwd
                .push_str(&format!("{NAME}:x:{uid}:{uid}:Keel run:{home}:/bin/sh\n"));
        }
        if !has_id(group, uid) {
            accounts.group.push_str(&format!("{NAME}:x:{uid}:\n"));
        }
        accounts
    }

    /// The bubblewrap arguments that bind the files over the host's.
    pub(super) fn binds() -> Vec<String> {
        [(PASSWD_FD, "/etc/passwd"), (GROUP_FD, "/etc/group")]
            .into_iter()
            .flat_map(|(fd, file)| ["--ro-bind-data".into(), fd.to_string(), file.into()])
            .collect()
    }

    /// The files, each at the descriptor [`Accounts::binds`] names: new ones for each
    /// bubblewrap, which reads them to their end.
    pub(super) fn handed(&self) -> std::io::Result<[(OwnedFd, i32); 2]> {
        Ok([
            (
                sealed_memory_file("keel-passwd", self.passwd.as_bytes())?,
                PASSWD_FD,
            ),
            (
                sealed_memory_file("keel-group", self.group.as_bytes())?,
                GROUP_FD,
            ),
        ])
    }
}

/// The host's files as this process first read them (empty where it has none), each
/// ending with a newline.
fn host() -> &'static (String, String) {
    static HOST: OnceLock<(String, String)> = OnceLock::new();
    HOST.get_or_init(|| (read("/etc/passwd"), read("/etc/group")))
}

fn read(file: &str) -> String {
    let mut text = std::fs::read_to_string(file).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// Whether a line of `file` (`name:password:id:…`) has `id` as its third field.
fn has_id(file: &str, id: u32) -> bool {
    let id = id.to_string();
    file.lines()
        .any(|line| line.split(':').nth(2) == Some(id.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jail_s_uid_is_added_once() {
        let added = Accounts::with(1_900_000_123, Path::new("/w/.keel/home"));
        assert!(
            added
                .passwd
                .ends_with("keel-run:x:1900000123:1900000123:Keel run:/w/.keel/home:/bin/sh\n"),
            "{}",
            added.passwd
        );
        assert!(added.group.ends_with("keel-run:x:1900000123:\n"));
        let root = Accounts::with(0, Path::new("/root"));
        assert_eq!(root.passwd, host().0);
        assert!(!has_id("a:x:10:10::/:/bin/sh\n", 1));
        assert!(has_id("a:x:10:10::/:/bin/sh\n", 10));
    }
}
