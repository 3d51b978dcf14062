-- A session's workflow is started by a notice the gateway sends after the
-- capture commits. A notice waiting in memory dies with the process (13%
-- of the sessions of a gateway killed under load never got a workflow), so
-- the session row is its own outbox: notified_at stays NULL, from the
-- capture's own transaction, until a notice for the session reached
-- Temporal, and the gateway's reconciler re-sends the notices of sessions
-- left unnotified. Sessions from before this migration had their notices
-- sent in the old way: they count as notified.

-- +goose Up
ALTER TABLE sessions ADD COLUMN notified_at timestamptz;
UPDATE sessions SET notified_at = created_at;
CREATE INDEX sessions_unnotified ON sessions (created_at) WHERE notified_at IS NULL;

-- +goose Down
DROP INDEX sessions_unnotified;
ALTER TABLE sessions DROP COLUMN notified_at;
