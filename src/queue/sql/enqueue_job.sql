-- Enqueues a job (queue::enqueue), idempotently: at most one live row per (kind, ref_id).
-- A function so that a statement that writes the job's domain row can enqueue it in the
-- same round trip. Wakes the workers (NOTIFY on `wake_channel`) unless a job of the kind
-- and workspace enqueued just before this one (within `wake_lookbehind` ids) is still
-- waiting: docs/queue.md, "Waking workers".
CREATE OR REPLACE FUNCTION enqueue_job(job_kind text, job_ref_id text, job_priority integer,
                                       job_traceparent text, job_workspace text,
                                       wake_channel text, wake_lookbehind bigint,
                                       OUT inserted boolean, OUT woken boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO queue_jobs (kind, ref_id, priority, traceparent, workspace_id)
    VALUES (job_kind, job_ref_id, job_priority, job_traceparent, job_workspace)
    ON CONFLICT (kind, ref_id) DO NOTHING
    RETURNING id INTO job_id;
    inserted := job_id IS NOT NULL;
    -- The ids just before this one, read by the primary key: `OFFSET 0` keeps the
    -- planner from reading the kind's due entries instead (the plan a cached generic plan
    -- picks, which walks every dead entry of a drained queue).
    woken := inserted AND NOT EXISTS (
        SELECT 1
        FROM (SELECT kind, workspace_id, lease_owner, run_after FROM queue_jobs
              WHERE id < job_id AND id >= job_id - wake_lookbehind OFFSET 0) AS q
        WHERE q.kind = job_kind AND q.workspace_id = job_workspace AND q.lease_owner IS NULL
          AND q.run_after <= now());
    IF woken THEN
        PERFORM pg_notify(wake_channel, job_kind);
    END IF;
END;
$$;
