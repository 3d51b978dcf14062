-- Initial Flywheel schema. Released migrations are never edited: add a new
-- numbered file instead. Every tenant-owned row carries tenant_id, and every
-- query that serves a tenant filters on it.

-- +goose Up

CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    -- Tenant policy: whether its data may train shared models by default.
    train_by_default boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as SHA-256 hashes; the plaintext is shown once.
CREATE TABLE api_keys (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    -- First characters of the key, to recognise it in listings.
    prefix      text NOT NULL,
    kind        text NOT NULL DEFAULT 'tenant' CHECK (kind IN ('tenant', 'session')),
    session_id  text,
    name        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

-- A deployment is a model name clients ask for; it routes to versions.
CREATE TABLE deployments (
    name            text PRIMARY KEY,
    backend         text NOT NULL,
    -- Backend settings (upstream URL, fallbacks, sampling defaults).
    config          jsonb NOT NULL DEFAULT '{}',
    serving_version text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
    id              text PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    deployment      text NOT NULL DEFAULT '',
    -- The end user the agent acts for, as the client names them.
    end_user        text NOT NULL DEFAULT '',
    -- Task and GRPO group this session belongs to, if any.
    task_id         text NOT NULL DEFAULT '',
    group_id        text NOT NULL DEFAULT '',
    group_size      integer NOT NULL DEFAULT 1 CHECK (group_size >= 1),
    identity_mode   text NOT NULL CHECK (identity_mode IN ('key', 'header', 'path', 'stitched', 'explicit')),
    status          text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'ended', 'forgotten')),
    opt_out         boolean NOT NULL DEFAULT false,
    metadata        jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_active_at  timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE INDEX sessions_tenant_created ON sessions (tenant_id, created_at DESC);
CREATE INDEX sessions_tenant_user ON sessions (tenant_id, end_user) WHERE end_user <> '';
CREATE INDEX sessions_group ON sessions (tenant_id, group_id) WHERE group_id <> '';

-- Per end-user consent, set by the tenant; absence means the tenant default.
CREATE TABLE end_user_consent (
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    end_user    text NOT NULL,
    opt_out     boolean NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, end_user)
);

-- One row per model call, committed before the gateway answers 2xx.
CREATE TABLE interactions (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id            text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id           text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    -- Position in the session, from 0.
    seq                  integer NOT NULL,
    -- Id returned to the client (chatcmpl-…, msg_…); feedback refers to it.
    completion_id        text NOT NULL UNIQUE,
    protocol             text NOT NULL CHECK (protocol IN ('openai', 'anthropic')),
    stream               boolean NOT NULL DEFAULT false,
    deployment           text NOT NULL,
    model_version        text NOT NULL DEFAULT '',
    request              jsonb NOT NULL,
    response             jsonb,
    prompt_token_ids     integer[],
    completion_token_ids integer[],
    logprobs             real[],
    prompt_tokens        integer NOT NULL DEFAULT 0,
    completion_tokens    integer NOT NULL DEFAULT 0,
    finish_reason        text NOT NULL DEFAULT '',
    status               text NOT NULL CHECK (status IN ('ok', 'upstream_error', 'client_cancelled')),
    error                text NOT NULL DEFAULT '',
    latency_ms           double precision NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, seq)
);
CREATE INDEX interactions_tenant_session ON interactions (tenant_id, session_id, seq);
CREATE INDEX interactions_tenant_created ON interactions (tenant_id, created_at);

-- Rewards bind late and never rewrite a step: each is its own row.
CREATE TABLE rewards (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id      text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    -- The step it rewards; NULL rewards the session's outcome.
    interaction_id  bigint REFERENCES interactions (id) ON DELETE CASCADE,
    value           double precision NOT NULL CHECK (value = value AND value > '-Infinity' AND value < 'Infinity'),
    source          text NOT NULL DEFAULT 'user',
    final           boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rewards_tenant_session ON rewards (tenant_id, session_id);
CREATE INDEX rewards_interaction ON rewards (interaction_id) WHERE interaction_id IS NOT NULL;

-- An assembled trajectory: one per session end (re-assembly makes a new one).
CREATE TABLE trajectories (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id      text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    steps           integer NOT NULL,
    total_reward    double precision,
    discount        double precision NOT NULL,
    assembled_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, assembled_at)
);
CREATE INDEX trajectories_tenant ON trajectories (tenant_id, assembled_at);

-- ATDP steps ⟨o, h, a, y, r, m⟩ after redaction; immutable once written.
CREATE TABLE atdp_steps (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    trajectory_id       bigint NOT NULL REFERENCES trajectories (id) ON DELETE CASCADE,
    session_id          text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    interaction_id      bigint NOT NULL REFERENCES interactions (id) ON DELETE CASCADE,
    step_index          integer NOT NULL,
    parent_step_id      bigint REFERENCES atdp_steps (id) ON DELETE CASCADE,
    step                jsonb NOT NULL,
    reward              double precision,
    discounted_return   double precision,
    eligible            boolean NOT NULL,
    -- Why the step will not train: no_reward, upstream_error,
    -- zero_trainable_tokens, stale_version, redacted, opted_out, filtered_group.
    ineligible_reason   text NOT NULL DEFAULT '',
    redactions          jsonb NOT NULL DEFAULT '[]',
    created_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (trajectory_id, step_index)
);
CREATE INDEX atdp_steps_tenant_session ON atdp_steps (tenant_id, session_id);

-- Samples queued for training; the step id makes enqueueing idempotent.
CREATE TABLE training_samples (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id            text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    step_id              bigint NOT NULL UNIQUE REFERENCES atdp_steps (id) ON DELETE CASCADE,
    deployment           text NOT NULL,
    task_id              text NOT NULL DEFAULT '',
    group_id             text NOT NULL DEFAULT '',
    behaviour_version    text NOT NULL,
    prompt_token_ids     integer[] NOT NULL,
    completion_token_ids integer[] NOT NULL,
    logprobs             real[] NOT NULL,
    reward               double precision NOT NULL,
    status               text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'used', 'dropped_stale', 'retired')),
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX training_samples_queue ON training_samples (deployment, status, created_at) WHERE status = 'queued';

-- Immutable model versions of a deployment.
CREATE TABLE model_versions (
    id               text PRIMARY KEY,
    deployment       text NOT NULL,
    parent_version   text REFERENCES model_versions (id),
    status           text NOT NULL DEFAULT 'candidate' CHECK (status IN ('candidate', 'serving', 'superseded', 'rolled_back', 'retired')),
    checkpoint_path  text NOT NULL DEFAULT '',
    -- Training figures (loss, steps, tokens).
    metrics          jsonb NOT NULL DEFAULT '{}',
    retired_reason   text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX model_versions_deployment ON model_versions (deployment, created_at DESC);

-- Lineage: which samples trained which version, so forgetting finds them.
CREATE TABLE model_version_lineage (
    version_id  text NOT NULL REFERENCES model_versions (id) ON DELETE CASCADE,
    sample_id   bigint NOT NULL,
    tenant_id   text NOT NULL,
    session_id  text NOT NULL,
    PRIMARY KEY (version_id, sample_id)
);
CREATE INDEX lineage_sample ON model_version_lineage (sample_id);
CREATE INDEX lineage_session ON model_version_lineage (tenant_id, session_id);

-- Versioned memory / harness / tool-schema artefacts of a deployment.
CREATE TABLE artefacts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment  text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('playbook', 'harness', 'tool_schema')),
    version     integer NOT NULL,
    content     jsonb NOT NULL,
    status      text NOT NULL DEFAULT 'candidate' CHECK (status IN ('candidate', 'serving', 'superseded', 'rolled_back')),
    parent_id   bigint REFERENCES artefacts (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (deployment, kind, version)
);

-- A gated change of one layer: weights or an artefact.
CREATE TABLE releases (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment      text NOT NULL,
    layer           text NOT NULL CHECK (layer IN ('weights', 'playbook', 'harness', 'tool_schema')),
    candidate       text NOT NULL,
    baseline        text NOT NULL DEFAULT '',
    status          text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'promoted', 'rolled_back', 'aborted')),
    canary_share    double precision NOT NULL DEFAULT 0,
    workflow_id     text NOT NULL DEFAULT '',
    reason          text NOT NULL DEFAULT '',
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX releases_deployment ON releases (deployment, started_at DESC);

CREATE TABLE gate_results (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    release_id  bigint NOT NULL REFERENCES releases (id) ON DELETE CASCADE,
    gate        text NOT NULL CHECK (gate IN ('shadow', 'replay', 'regression', 'safety', 'canary')),
    passed      boolean NOT NULL,
    metrics     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gate_results_release ON gate_results (release_id);

CREATE TABLE evolution_decisions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment  text NOT NULL,
    decision    text NOT NULL CHECK (decision IN ('noop', 'memory', 'harness', 'tool_schema', 'weights', 'rollback')),
    evidence    jsonb NOT NULL,
    reason      text NOT NULL,
    workflow_id text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX evolution_decisions_deployment ON evolution_decisions (deployment, created_at DESC);

-- A request to forget a session's or an end user's data, kept for lineage.
CREATE TABLE forget_requests (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    scope              text NOT NULL CHECK (scope IN ('session', 'end_user')),
    subject            text NOT NULL,
    status             text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'failed')),
    affected_versions  text[] NOT NULL DEFAULT '{}',
    deleted            jsonb NOT NULL DEFAULT '{}',
    requested_at       timestamptz NOT NULL DEFAULT now(),
    completed_at       timestamptz
);
CREATE INDEX forget_requests_tenant ON forget_requests (tenant_id, requested_at DESC);

-- +goose Down
DROP TABLE forget_requests;
DROP TABLE evolution_decisions;
DROP TABLE gate_results;
DROP TABLE releases;
DROP TABLE artefacts;
DROP TABLE model_version_lineage;
DROP TABLE model_versions;
DROP TABLE training_samples;
DROP TABLE atdp_steps;
DROP TABLE trajectories;
DROP TABLE rewards;
DROP TABLE interactions;
DROP TABLE end_user_consent;
DROP TABLE sessions;
DROP TABLE deployments;
DROP TABLE api_keys;
DROP TABLE tenants;
