-- Client-orchestrated runs: a run an external agent (an editor, an ACP host) carries out
-- and records itself. Its client holds the run's lease instead of a worker: a secret token
-- (only its SHA-256 is kept) and an expiry each accepted append renews. The row stays for
-- the run's life, so boot recovery never hands the run to a worker.
CREATE TABLE client_leases (
    run_id       TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL,
    token_sha256 TEXT NOT NULL CHECK (length(token_sha256) = 64),
    holder       TEXT NOT NULL,
    lease_ms     INTEGER NOT NULL CHECK (lease_ms BETWEEN 1000 AND 600000),
    expires_at   TIMESTAMPTZ NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- The sweep that fails runs whose client went silent reads the soonest expiries.
CREATE INDEX client_leases_expiry ON client_leases (expires_at);
