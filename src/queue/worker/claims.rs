//! How the worker claims: the one seam between its claim loop and the claim strategies.
//! Fair claims across workspaces when the worker has a per-workspace limit; otherwise the
//! full claim, or, while an old snapshot is held, claims by position with a sweep beside
//! them (`queue::snapshot`).

use std::sync::Arc;
use std::time::Instant;

use crate::queue::snapshot::{Claiming, HeldSnapshot};
use crate::queue::{Lease, QueueError};

pub(super) struct Claimer {
    claiming: Claiming,
    /// Set: claims are fair across workspaces, none holding more than this many jobs
    /// unless an operator set its own limit.
    max_per_workspace: Option<u32>,
    snapshot: Arc<HeldSnapshot>,
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
        }
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
        if let Some(max) = self.max_per_workspace {
            // Each workspace is read from the head of its own stretch of the index: no
            // positions to keep.
            return kind_by_kind(kinds, room, |kind, limit| {
                crate::queue::fair::claim(pool.pool(), owner, kind, limit, *lease, max)
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
