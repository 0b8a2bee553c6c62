//! The run state machine: `queued → running → completed | failed | cancelled`, with
//! `awaiting_approval` before `queued` when a gate stops a run, and `running →
//! awaiting_approval → queued` when an agent loop's tool calls wait for one mid-run.
//! [`RunStatus::can_become`] is the one place that decides which transitions exist; the
//! store guards every status update with the states it allows.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::AwaitingApproval,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::AwaitingApproval => "awaiting_approval",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(value: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// Whether a run in this state may move to `next`.
    pub fn can_become(self, next: RunStatus) -> bool {
        use RunStatus::*;
        match (self, next) {
            (AwaitingApproval, Queued | Cancelled) => true,
            (Queued, Running | Cancelled | Failed) => true,
            // Running → Queued: the lease was lost and the run waits for another worker.
            (Running, Queued | Completed | Failed | Cancelled) => true,
            // An agent loop's model asked for gated tool calls: the run waits, leaseless.
            (Running, AwaitingApproval) => true,
            _ => false,
        }
    }

    /// Every state from which `next` may be reached: the guard of a status update.
    pub fn sources_of(next: RunStatus) -> Vec<&'static str> {
        RunStatus::ALL
            .into_iter()
            .filter(|s| s.can_become(next))
            .map(RunStatus::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::RunStatus::{self, *};

    #[test]
    fn terminal_states_are_final() {
        for from in [Completed, Failed, Cancelled] {
            for to in RunStatus::ALL {
                assert!(!from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn lifecycle_transitions() {
        assert!(Queued.can_become(Running));
        assert!(Running.can_become(Completed));
        assert!(Running.can_become(Queued));
        assert!(AwaitingApproval.can_become(Queued));
        // Mid-loop: an agent run waits for a tool-call approval, then is queued again.
        assert!(Running.can_become(AwaitingApproval));
        assert!(!Queued.can_become(AwaitingApproval));
        assert!(!Queued.can_become(Completed));
        assert!(!AwaitingApproval.can_become(Running));
        assert_eq!(
            RunStatus::sources_of(Cancelled),
            ["queued", "running", "awaiting_approval"]
        );
    }

    #[test]
    fn names_round_trip() {
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::parse(status.as_str()), Some(status));
        }
    }
}
