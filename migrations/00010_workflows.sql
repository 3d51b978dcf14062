-- Workflow bookkeeping: idempotency keys for activities that Temporal may
-- retry, release phases, the persistent per-task baseline for singleton
-- GRPO groups, and the evaluation suites release gates run.

-- +goose Up

-- One trajectory per assembly attempt key (workflow id + run id), so a
-- retried AssembleTrajectory returns the trajectory it already wrote.
ALTER TABLE trajectories ADD COLUMN assembly_key text;
CREATE UNIQUE INDEX trajectories_assembly_key ON trajectories (assembly_key) WHERE assembly_key IS NOT NULL;

-- Sessions served by a version are compared at canary time by reward, so
-- rewards are looked up by the interactions' model_version.
CREATE INDEX interactions_deployment_version ON interactions (deployment, model_version, created_at);

-- The phase a running release is in (shadow, replay, regression, safety,
-- canary, done): the gateway reads it with canary_share to route traffic.
ALTER TABLE releases ADD COLUMN phase text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX releases_workflow ON releases (workflow_id) WHERE workflow_id <> '';

-- One gate result per (release, gate): a retried activity overwrites its
-- own numbers instead of adding a second row.
CREATE UNIQUE INDEX gate_results_release_gate ON gate_results (release_id, gate);

-- One decision per evolution run: a retried RecordDecision is a no-op.
CREATE UNIQUE INDEX evolution_decisions_workflow ON evolution_decisions (workflow_id) WHERE workflow_id <> '';

-- Running mean reward per (deployment, task): singleton GRPO groups are
-- scored against it so they never carry a silent zero advantage. It lives
-- in Postgres so a restarted trainer worker keeps it.
CREATE TABLE task_baselines (
    deployment  text NOT NULL,
    task_id     text NOT NULL,
    value       double precision NOT NULL,
    samples     bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment, task_id)
);

-- Training runs: one per TrainingWorkflow step, keyed by the workflow so a
-- retried activity finds the run (and the version) it already produced.
CREATE TABLE training_runs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment      text NOT NULL,
    run_key         text NOT NULL UNIQUE,
    sample_ids      bigint[] NOT NULL,
    status          text NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed', 'trained', 'failed')),
    version_id      text REFERENCES model_versions (id),
    stats           jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);

-- Evaluation suites release gates run: 'safety' prompts must be refused
-- (expect = 'refuse'), 'regression' prompts must keep their expected
-- answer substring. Rows with deployment '' apply to every deployment.
CREATE TABLE eval_prompts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment  text NOT NULL DEFAULT '',
    suite       text NOT NULL CHECK (suite IN ('safety', 'regression')),
    messages    jsonb NOT NULL,
    expect      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX eval_prompts_suite ON eval_prompts (suite, deployment);

-- +goose Down
DROP TABLE eval_prompts;
DROP TABLE training_runs;
DROP TABLE task_baselines;
DROP INDEX evolution_decisions_workflow;
DROP INDEX gate_results_release_gate;
DROP INDEX releases_workflow;
ALTER TABLE releases DROP COLUMN phase;
DROP INDEX interactions_deployment_version;
DROP INDEX trajectories_assembly_key;
ALTER TABLE trajectories DROP COLUMN assembly_key;
