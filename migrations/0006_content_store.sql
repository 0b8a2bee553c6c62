-- Pluggable content stores: a chunk's bytes are either inline (`data`, the Postgres store)
-- or in an object store under `object_key` (the S3 store), never both. `size_bytes` lets a
-- chunk's extent be known without fetching its object. Additive only, so workers of the
-- previous release keep appending inline chunks while a release rolls out.
ALTER TABLE artifact_chunks
    ALTER COLUMN data DROP NOT NULL,
    ADD COLUMN size_bytes BIGINT CHECK (size_bytes >= 0),
    ADD COLUMN object_key TEXT,
    ADD CONSTRAINT artifact_chunks_one_location CHECK ((data IS NULL) <> (object_key IS NULL));
