-- no-transaction
-- The same for a media job's artifacts (two NULL entries per shell run), in two steps
-- (docs/operations.md, "Upgrading with running workers"): the previous release's artifact
-- upsert names the full key in its ON CONFLICT, so the full key stays until the release
-- after this one, whose upserts name this partial key, drops it.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS artifacts_media_name
    ON artifacts (media_job_id, name) WHERE media_job_id IS NOT NULL
