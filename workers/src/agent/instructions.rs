//! The workspace prompt layer, the middle of seed 004's three system-prompt layers (the
//! operator's, the workspace's, the task's): the instruction files an agent finds at the
//! root of its run's workspace (`AGENTS.md`, `CLAUDE.md`), read without following a link
//! out of it.

use std::path::Path;

use super::Message;
use crate::file::beneath::{self, Unreadable};

/// The files read, in the order their messages take.
pub const FILES: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];
/// Most bytes of one file the model reads; the rest is cut, with a note saying so.
pub const MAX_BYTES: usize = 32 * 1024;
/// Files larger than this are left out rather than read only to be cut.
const READ_LIMIT: u64 = 1024 * 1024;

/// A system message per instruction file at the workspace's root, in [`FILES`] order. A
/// file that is missing is skipped; one that is not a plain file with a single link (a
/// link, a FIFO, a hard link to a file elsewhere) or is over 1 MiB is left out with a
/// warning. Blocking: call it off the async runtime.
pub fn workspace_layer(workspace: &Path) -> Vec<Message> {
    FILES
        .iter()
        .filter_map(
            |name| match beneath::read(workspace, Path::new(name), READ_LIMIT) {
                Ok(Some(bytes)) => Some(Message::System {
                    content: message(name, &String::from_utf8_lossy(&bytes)),
                }),
                Ok(None) => None,
                Err(unreadable) => {
                    let why = match unreadable {
                        Unreadable::NotRegular => "not a regular file".to_string(),
                        Unreadable::Linked => "it has other hard links".to_string(),
                        Unreadable::TooLarge(size) => format!("{size} bytes is over 1 MiB"),
                        Unreadable::Failed(error) => error,
                    };
                    tracing::warn!(file = name, %why, "workspace instructions left out");
                    None
                }
            },
        )
        .collect()
}

/// How each workspace layer's message starts (then the file's name).
const HEADING: &str = "Instructions from the workspace's ";

/// Whether a system message is one of the workspace layer's.
pub fn is_workspace_layer(content: &str) -> bool {
    FILES.iter().any(|name| {
        content
            .strip_prefix(HEADING)
            .is_some_and(|rest| rest.starts_with(name))
    })
}

/// The file's text as the model reads it, cut at [`MAX_BYTES`] on a character boundary.
fn message(name: &str, text: &str) -> String {
    if text.len() <= MAX_BYTES {
        return format!("{HEADING}{name}:\n\n{text}");
    }
    let cut = (0..=MAX_BYTES)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!(
        "{HEADING}{name}:\n\n{}\n\n[{name} is cut here: {MAX_BYTES} of its {} bytes]",
        &text[..cut],
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_files_become_system_messages_in_order_and_long_ones_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        assert!(workspace_layer(dir.path()).is_empty());
        std::fs::write(dir.path().join("CLAUDE.md"), "Use tabs.").unwrap();
        std::fs::write(dir.path().join("AGENTS.md"), "é".repeat(MAX_BYTES)).unwrap();
        let layer = workspace_layer(dir.path());
        assert_eq!(layer.len(), 2);
        let Message::System { content } = &layer[0] else {
            panic!("{layer:?}")
        };
        assert!(content.starts_with("Instructions from the workspace's AGENTS.md:"));
        assert!(content.ends_with(&format!(
            "[AGENTS.md is cut here: {MAX_BYTES} of its {} bytes]",
            2 * MAX_BYTES
        )));
        assert_eq!(
            layer[1],
            Message::System {
                content: "Instructions from the workspace's CLAUDE.md:\n\nUse tabs.".into()
            }
        );
    }

    #[test]
    fn a_link_out_of_the_workspace_is_not_read() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "worker secret").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("AGENTS.md")).unwrap();
        std::fs::hard_link(&secret, dir.path().join("CLAUDE.md")).unwrap();
        assert!(workspace_layer(dir.path()).is_empty());
    }
}
