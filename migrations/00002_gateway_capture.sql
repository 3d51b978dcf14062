-- Gateway capture: per-session step counter, continuation hashes for
-- zero-change session stitching and prompt-id reuse, request ids.

-- +goose Up
ALTER TABLE sessions ADD COLUMN next_seq integer NOT NULL DEFAULT 0;

-- SHA-256 of the conversation (client messages + the response) after this
-- interaction; a later request whose messages start with exactly that
-- conversation continues this session.
ALTER TABLE interactions ADD COLUMN continuation_hash bytea;
ALTER TABLE interactions ADD COLUMN request_id text NOT NULL DEFAULT '';
CREATE INDEX interactions_continuation ON interactions (tenant_id, continuation_hash) WHERE continuation_hash IS NOT NULL;

-- +goose Down
DROP INDEX interactions_continuation;
ALTER TABLE interactions DROP COLUMN request_id;
ALTER TABLE interactions DROP COLUMN continuation_hash;
ALTER TABLE sessions DROP COLUMN next_seq;
