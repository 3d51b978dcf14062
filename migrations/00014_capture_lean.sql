-- Capture writes a session upsert and an interactions row per model call
-- inside the request's latency, and Postgres CPU per captured row is what
-- bounds the gateway's throughput. A perf profile of the capture statement
-- (16-row batches) put 18% of its server CPU in foreign-key triggers (an
-- SPI query with a row lock per inserted row) and 22% in index inserts.
--
-- Foreign keys whose checks the capture statement already guarantees:
-- - interactions -> sessions: a row is inserted only joined to its session
--   row, which the same statement has just upserted and holds locked, and
--   only while that session is open and the row's tenant's. Sessions are
--   never deleted (forget empties a session and marks it forgotten, under
--   the same row lock, deleting its interactions itself).
-- - sessions -> tenants: sessions are created for the tenant of an
--   authenticated key, and api_keys -> tenants still holds. Tenants are
--   never deleted.
-- (00011 dropped interactions -> tenants on the same grounds.)
--
-- Indexes no query needs:
-- - interactions_tenant_created: every per-tenant query also names the
--   deployment (served by interactions_deployment_recent) or a session
--   (served by UNIQUE (session_id, seq)).
-- - interactions_deployment_version: its one query (a release phase's
--   traffic of one version) is bounded below by the phase start, so
--   interactions_deployment_recent serves it with model_version as a
--   filter on a few minutes of rows.
-- - interactions_continuation drops tenant_id from its key: a SHA-256
--   continuation hash is selective alone, and the lookup still filters by
--   tenant; the key compares as bytes instead of as text first.

-- +goose Up
ALTER TABLE interactions DROP CONSTRAINT interactions_session_id_fkey;
ALTER TABLE sessions DROP CONSTRAINT sessions_tenant_id_fkey;
DROP INDEX interactions_tenant_created;
DROP INDEX interactions_deployment_version;
DROP INDEX interactions_continuation;
CREATE INDEX interactions_continuation ON interactions (continuation_hash) WHERE continuation_hash IS NOT NULL;

-- +goose Down
DROP INDEX interactions_continuation;
CREATE INDEX interactions_continuation ON interactions (tenant_id, continuation_hash) WHERE continuation_hash IS NOT NULL;
CREATE INDEX interactions_deployment_version ON interactions (deployment, model_version, created_at);
CREATE INDEX interactions_tenant_created ON interactions (tenant_id, created_at);
ALTER TABLE sessions ADD CONSTRAINT sessions_tenant_id_fkey
    FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE;
ALTER TABLE interactions ADD CONSTRAINT interactions_session_id_fkey
    FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE CASCADE;
