-- Gates with teeth: every suite prompt says how an answer is judged, each
-- version's greedy result on each prompt is kept (a version is answered
-- once per prompt, however many releases compare with it), the watchdog's
-- checks of the serving version are recorded, a session says when it was
-- assembled, and a training sample which session and group it came from.

-- +goose Up
-- match: 'exact' (the whole answer, trimmed), 'contains' (the expected
-- text appears), 'refusal' (a refusal in words or the expected marker);
-- '' keeps the suite's old rule (regression: contains; safety: refusal).
ALTER TABLE eval_prompts
    ADD COLUMN match text NOT NULL DEFAULT '' CHECK (match IN ('', 'exact', 'contains', 'refusal')),
    ADD COLUMN max_tokens integer NOT NULL DEFAULT 0 CHECK (max_tokens >= 0 AND max_tokens <= 4096);

-- One result per prompt and subject: a model version, with the artefacts
-- it was answered under appended ("d@v3", "d@v3+playbook:2"). Replacing a
-- suite deletes its prompts and so their results.
CREATE TABLE suite_results (
    subject     text NOT NULL,
    prompt_id   bigint NOT NULL REFERENCES eval_prompts (id) ON DELETE CASCADE,
    passed      boolean NOT NULL,
    answer      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, prompt_id)
);
CREATE INDEX suite_results_prompt ON suite_results (prompt_id);

-- The watchdog re-measures the serving version after promotion.
CREATE TABLE watchdog_checks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment  text NOT NULL,
    serving     text NOT NULL DEFAULT '',
    anchor      text NOT NULL DEFAULT '',
    verdict     text NOT NULL CHECK (verdict IN ('ok', 'rolled_back', 'not_evaluated')),
    reason      text NOT NULL,
    metrics     jsonb NOT NULL DEFAULT '{}',
    workflow_id text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX watchdog_checks_deployment ON watchdog_checks (deployment, created_at DESC);

-- Gate metrics name the anchor a regression gate compared with; the looks
-- at one anchor are counted by it.
CREATE INDEX gate_results_anchor ON gate_results ((metrics->>'anchor')) WHERE gate = 'regression';

-- When its workflow assembled a session: the sessions ended but not yet
-- assembled are the control plane's backlog (GET /v1/backlog), which a
-- load generator paces itself by.
ALTER TABLE sessions ADD COLUMN assembled_at timestamptz;
UPDATE sessions s SET assembled_at = t.at
FROM (SELECT tenant_id, session_id, min(assembled_at) AS at FROM trajectories GROUP BY 1, 2) t
WHERE s.tenant_id = t.tenant_id AND s.id = t.session_id;
CREATE INDEX sessions_awaiting_assembly ON sessions (tenant_id, ended_at) WHERE status = 'ended' AND assembled_at IS NULL;

-- A training sample knows its session and its GRPO group's size, so a
-- claim takes a group once all its sessions are queued (or it waited long
-- enough), instead of whatever part of it had arrived.
ALTER TABLE training_samples
    ADD COLUMN session_id text NOT NULL DEFAULT '',
    ADD COLUMN group_size integer NOT NULL DEFAULT 1;

-- +goose Down
ALTER TABLE training_samples DROP COLUMN group_size, DROP COLUMN session_id;
DROP INDEX sessions_awaiting_assembly;
ALTER TABLE sessions DROP COLUMN assembled_at;
DROP INDEX gate_results_anchor;
DROP TABLE watchdog_checks;
DROP TABLE suite_results;
ALTER TABLE eval_prompts DROP COLUMN max_tokens, DROP COLUMN match;
