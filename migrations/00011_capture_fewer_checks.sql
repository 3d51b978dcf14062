-- Capture writes one interactions row per model call; each row paid a
-- foreign-key check (an index probe plus a KEY SHARE lock on the one
-- tenants row every writer shares) and an index that duplicates another.
--
-- interactions -> tenants is implied: session_id references sessions,
-- whose tenant_id references tenants, and the capture statement only
-- inserts a row when its session belongs to the row's tenant (the session
-- upsert's WHERE sessions.tenant_id = EXCLUDED.tenant_id). Deleting a
-- tenant still removes its interactions, through sessions' cascade.
--
-- interactions_tenant_session (tenant_id, session_id, seq) duplicates
-- UNIQUE (session_id, seq): session ids are globally unique, so every
-- per-session lookup is served by the unique index with tenant_id as a
-- filter on the few rows of one session.

-- +goose Up
ALTER TABLE interactions DROP CONSTRAINT interactions_tenant_id_fkey;
DROP INDEX interactions_tenant_session;

-- +goose Down
CREATE INDEX interactions_tenant_session ON interactions (tenant_id, session_id, seq);
ALTER TABLE interactions ADD CONSTRAINT interactions_tenant_id_fkey
    FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE;
