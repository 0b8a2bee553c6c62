-- The runtime host's identity, reported by GET /v1/whoami: one row, written by the first
-- API process that starts on this database and read by every one after it, so the id is
-- stable across restarts and replicas. It identifies; it grants nothing.
CREATE TABLE runtime_identity (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    host_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
