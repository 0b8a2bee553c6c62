//! Every kind of job Keel queues, by the name its queue rows carry: the one registry of
//! kinds. Each has a handler (built in `jobs`) and, for a row a lost worker may leave
//! running, a requeue (`jobs::requeue_lost`).

/// A kind of job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// An attempt of a run (`runs`, `agent`).
    Run,
    /// An attempt of a media job (`media`).
    Media,
    /// A background poll of an external work source (`external::poll`); the job's ref_id is
    /// the source id, so a source has at most one poll queued or in flight across every
    /// worker.
    Poll,
    /// Sending an approved tracker action (`external::actions`); one job per action.
    ExternalAction,
    /// Reading a pull request's failing CI (`external::triage`); one job per scan.
    CiTriage,
}

impl JobKind {
    pub const ALL: [JobKind; 5] = [
        JobKind::Run,
        JobKind::Media,
        JobKind::Poll,
        JobKind::ExternalAction,
        JobKind::CiTriage,
    ];

    /// The name queue rows, leases, metrics and `keel worker --kinds` use.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Run => "run",
            JobKind::Media => "media",
            JobKind::Poll => "poll",
            JobKind::ExternalAction => "external_action",
            JobKind::CiTriage => "ci_triage",
        }
    }

    /// The kind named `name`; None for a kind Keel does not run (the bench's, a test's).
    pub fn parse(name: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::JobKind;

    #[test]
    fn each_kind_parses_back_from_its_name() {
        for kind in JobKind::ALL {
            assert_eq!(JobKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(JobKind::parse("bench"), None);
    }
}
