-- Keys have a lifecycle: they expire, they may be limited to some models,
-- and they rotate. A session key remembers the key that issued it
-- (parent_id), so revoking a tenant key revokes the session keys it
-- issued. A rotated key points at the key it replaced (rotated_from); the
-- old key keeps working for the grace period the rotation gave it.

-- +goose Up
ALTER TABLE api_keys
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN models       text[] NOT NULL DEFAULT '{}',
    ADD COLUMN parent_id    bigint REFERENCES api_keys (id) ON DELETE CASCADE,
    ADD COLUMN rotated_from bigint REFERENCES api_keys (id) ON DELETE SET NULL;
CREATE INDEX api_keys_parent ON api_keys (parent_id) WHERE parent_id IS NOT NULL;

-- +goose Down
DROP INDEX api_keys_parent;
ALTER TABLE api_keys
    DROP COLUMN rotated_from,
    DROP COLUMN parent_id,
    DROP COLUMN models,
    DROP COLUMN expires_at;
