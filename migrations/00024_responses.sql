-- The OpenAI Responses API keeps what it answered: GET /v1/responses/{id}
-- returns it, and a request naming it as previous_response_id continues
-- its conversation. A row holds one response's own input items and the
-- response object (whose output items are the model's turn); a chain is
-- rebuilt by following previous_id, so a conversation of n turns is
-- stored once, not n times. Responses are a tenant's: the key includes
-- the tenant, and another tenant's id is not found. Forget deletes them
-- with their session. Their interactions have the protocol 'responses'.

-- +goose Up
CREATE TABLE responses (
    tenant_id   text NOT NULL,
    id          text NOT NULL,
    session_id  text NOT NULL,
    previous_id text,
    input       jsonb NOT NULL,
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX responses_session ON responses (tenant_id, session_id);

ALTER TABLE interactions DROP CONSTRAINT interactions_protocol_check,
    ADD CONSTRAINT interactions_protocol_check CHECK (protocol IN ('openai', 'anthropic', 'responses'));

-- +goose Down
-- Responses API interactions become Chat Completions ones: the neutral
-- request they store is the same.
UPDATE interactions SET protocol = 'openai' WHERE protocol = 'responses';
ALTER TABLE interactions DROP CONSTRAINT interactions_protocol_check,
    ADD CONSTRAINT interactions_protocol_check CHECK (protocol IN ('openai', 'anthropic'));
DROP TABLE responses;
