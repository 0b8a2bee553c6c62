-- no-transaction
-- Only a media job's events have a media_job_id, but its unique key was a full index, so
-- every run's event wrote a NULL entry into it: 11 of a shell run's 191 WAL records. The
-- key becomes a partial index holding media events alone; 0040 drops the full one once
-- this one is built and valid. Built CONCURRENTLY (in a migration of its own: a
-- multi-statement query is one implicit transaction), so event writes go on meanwhile.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS run_events_media_sequence
    ON run_events (media_job_id, sequence) WHERE media_job_id IS NOT NULL
