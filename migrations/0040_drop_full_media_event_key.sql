-- The full key 0038 replaces (no statement names it). An interrupted CONCURRENTLY build
-- leaves its index invalid (and IF NOT EXISTS then skips it): the full key stays until
-- the partial one exists and is valid, and the migration says what to do instead.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relname = 'run_events_media_sequence'
          AND c.relnamespace = current_schema()::regnamespace AND i.indisvalid
    ) THEN
        RAISE EXCEPTION 'index run_events_media_sequence is missing or invalid (an interrupted '
            'CREATE INDEX CONCURRENTLY): rebuild it with REINDEX INDEX CONCURRENTLY (or create '
            'it as migration 0038 does), then migrate again';
    END IF;
END
$$;

ALTER TABLE run_events DROP CONSTRAINT IF EXISTS run_events_media_job_sequence;
