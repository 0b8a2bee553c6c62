-- The lease check every write of a job takes first (queue::fence): the job row, locked, if
-- the lease (its fencing token and owner) still holds it. A function so that a domain
-- statement can take the check first in its own round trip (a run's fenced lock and its
-- fenced transition) with the rule written once. PL/pgSQL, so its plan is kept per session.
CREATE OR REPLACE FUNCTION fence_job(job_id bigint, token bigint, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM queue_jobs q
    WHERE q.id = job_id AND q.fencing_token = token AND q.lease_owner = owner
    FOR UPDATE;
    RETURN FOUND;
END;
$$;
