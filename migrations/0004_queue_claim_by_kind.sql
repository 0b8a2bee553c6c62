-- The claim path reads due jobs of one kind in claim order. With the kind leading the
-- index, that read is an ordered index scan that stops after one batch whatever the
-- planner's statistics say. A queue's statistics are always stale (it fills and empties
-- between two ANALYZEs); with (priority, run_after, id) alone, a freshly filled queue
-- was planned as a bitmap scan that sorted every pending row on each claim.
DROP INDEX queue_jobs_due;
CREATE INDEX queue_jobs_due ON queue_jobs (kind, priority DESC, run_after, id)
    WHERE lease_owner IS NULL;
