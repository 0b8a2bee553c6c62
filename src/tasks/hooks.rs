//! A task's hooks: shell scripts run in its workspace around its attempts (Symphony's
//! hooks). A task imported from a WORKFLOW.md stores them, so the workers that run it need
//! not read the workflow again.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The scripts, each run in the task's workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Hooks {
    pub(crate) after_create: Option<String>,
    pub(crate) before_run: Option<String>,
    pub(crate) after_run: Option<String>,
    pub(crate) before_remove: Option<String>,
    /// At most [`MAX_HOOK_TIMEOUT_MS`].
    pub(crate) timeout_ms: u64,
}

/// The longest a hook may run (one hour): a workflow asking for more is refused.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 3_600_000;

impl Hooks {
    /// Whether any hook is set.
    pub(crate) fn any(&self) -> bool {
        self.scripts().next().is_some()
    }

    /// Each hook that is set, by name, in the order they run.
    pub(crate) fn scripts(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("after_create", &self.after_create),
            ("before_run", &self.before_run),
            ("after_run", &self.after_run),
            ("before_remove", &self.before_remove),
        ]
        .into_iter()
        .filter_map(|(name, script)| Some((name, script.as_deref()?)))
    }

    /// How long each hook may run before it and everything it started are killed. Capped
    /// here too: a task stored before the cap may carry a longer timeout.
    pub(crate) fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.min(MAX_HOOK_TIMEOUT_MS))
    }
}
