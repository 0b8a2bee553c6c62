//! How the worker claims: the one seam between its claim loop and the claim strategies.
//! Fair claims across workspaces when the worker has a per-workspace limit, or when an
//! operator set a workspace's limit (which binds every worker, whatever its setting);
//! otherwise the full claim, or, while an old snapshot is held, claims by position with a
//! sweep beside them (`queue::snapshot`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::queue::snapshot::{Claiming, HeldSnapshot};
use crate::queue::{Lease, QueueError, fair};

pub(super) struct Claimer {
    claiming: Claiming,
    /// Set: claims are fair across workspaces, none holding more than this many jobs
    /// unless an operator set its own limit.
    max_per_workspace: Option<u32>,
    snapshot: Arc<HeldSnapshot>,
    /// Whether any workspace has an operator's limit, and when that was read.
    operator_limits: Mutex<Option<(Instant, bool)>>,
}

impl Claimer {
    pub(super) fn new(
        claiming: Claiming,
        max_per_workspace: Option<u32>,
        snapshot: Arc<HeldSnapshot>,
    ) -> Claimer {
        Claimer {
            claiming,
            max_per_workspace,
            snapshot,
            operator_limits: Mutex::new(None),
        }
    }

    /// The per-workspace limit claims keep to: the worker's own, else none (`u32::MAX`) but
    /// the operators' where any is set; None: no workspace is limited.
    async fn workspace_limit(&self) -> Result<Option<u32>, QueueError> {
        if self.max_per_workspace.is_some() {
            return Ok(self.max_per_workspace);
        }
        let known = *self.operator_limits.lock().expect("not poisoned");
        let any = match known {
            Some((read, any)) if read.elapsed() < fair::OPERATOR_LIMITS_TTL => any,
            _ => {
                let any = fair::any_operator_limit(self.claiming.pool.pool()).await?;
                *self.operator_limits.lock().expect("not poisoned") = Some((Instant::now(), any));
                any
            }
        };
        Ok(any.then_some(u32::MAX))
    }

    /// The room the worker has now.
    pub(super) fn room(&self, room: usize) {
        self.snapshot.set_room(room);
    }

    /// Claims up to `room` jobs of the worker's kinds.
    pub(super) async fn claim(&self, room: usize) -> Result<Vec<Lease>, QueueError> {
        let Claiming {
            pool,
            owner,
            kinds,
            lease,
            ..
        } = &self.claiming;
        if let Some(max) = self.workspace_limit().await? {
            // Each workspace is read from the head of its own stretch of the index: no
            // positions to keep.
            return kind_by_kind(kinds, room, |kind, limit| {
                fair::claim(pool.pool(), owner, kind, limit, *lease, max)
            })
            .await;
        }
        let leases = if self.snapshot.is_held() {
            kind_by_kind(kinds, room, |kind, limit| {
                self.snapshot.claim(&self.claiming, kind, limit)
            })
            .await?
        } else {
            let started = Instant::now();
            let leases = crate::queue::claim(pool, owner, kinds, room as i64, *lease).await?;
            self.snapshot.record_full_claim(started);
            leases
        };
        self.snapshot.advance(&leases);
        Ok(leases)
    }

    /// Moves each kind's positions up to jobs claimed elsewhere (the sweep).
    pub(super) fn advance(&self, leases: &[Lease]) {
        self.snapshot.advance(leases);
    }
}

/// Claims kind by kind, each for what room the kinds before it left, until the room is
/// filled: `claim(kind, limit)` claims up to `limit` jobs of one kind.
async fn kind_by_kind<'k, F, Claim>(
    kinds: &'k [String],
    room: usize,
    mut claim: F,
) -> Result<Vec<Lease>, QueueError>
where
    F: FnMut(&'k str, i64) -> Claim,
    Claim: Future<Output = Result<Vec<Lease>, QueueError>>,
{
    let mut leases = Vec::new();
    for kind in kinds {
        let left = room.saturating_sub(leases.len());
        if left == 0 {
            break;
        }
        leases.extend(claim(kind, left as i64).await?);
    }
    Ok(leases)
}
