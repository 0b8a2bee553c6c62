-- The statements inside the run path's functions were planned anew at nearly every call
-- (`pg_stat_statements.track = all`, docs/benchmarks.md "Planning inside functions"):
--
-- - `append_events`' INSERT takes its events as arrays, and a custom plan, which knows their
--   lengths, always looks cheaper to PostgreSQL than the generic one: 2050 plans in 3000
--   calls, 0.47 ms each, a millisecond of a shell run's CPU. The generic plan is the same
--   walk (one probe of each subject's last event) whatever the arrays hold.
-- - `archive_leases` was a SQL function, which PostgreSQL (through 17) parses and plans at
--   every call: PL/pgSQL keeps the plan for the session.
ALTER FUNCTION append_events(integer, text[], text[], text[], text[], text[], jsonb[], text)
    SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION archive_leases(ended queue_jobs[], outcomes text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    archived bigint;
BEGIN
    INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                               expires_at, heartbeats, workspace_id, outcome)
    SELECT j.id, j.kind, j.ref_id, j.lease_owner, j.fencing_token, j.claimed_at,
           j.lease_expires_at, j.heartbeats, j.workspace_id, o.outcome
    FROM unnest(ended) WITH ORDINALITY AS j
    JOIN unnest(outcomes) WITH ORDINALITY AS o (outcome, n) ON o.n = j.ordinality;
    GET DIAGNOSTICS archived = ROW_COUNT;
    RETURN archived;
END;
$$;
