-- Every statement that ends a lease (a settle, a claim that takes over an expired one, a
-- withdrawal) archives it through this function: lease_history's columns are mapped from
-- queue_jobs' in one place. `ended` are the job rows as they stood when their lease ended,
-- `outcomes` their outcomes, in the same order. PL/pgSQL, which keeps its plan for the
-- session (a SQL function is parsed and planned at every call), and a generic one: the
-- insert is the same whatever the arrays hold.
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
