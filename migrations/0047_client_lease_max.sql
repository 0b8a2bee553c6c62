-- The longest a client may hold its run (KEEL_CLIENT_LEASE_MAX_MS): its lease is renewed up
-- to `renewable_until` (its start plus the maximum then configured) and no further, so a
-- client that keeps appending still lets go of the run. NULL: no maximum (leases of
-- earlier releases, and local mode's default).
ALTER TABLE client_leases
    ADD COLUMN renewable_until TIMESTAMPTZ,
    ADD CONSTRAINT client_leases_within_max CHECK (expires_at <= renewable_until);
