package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
)

// swapRelease is the release the model-server fault starts, as `flywheel
// release start` would: short phases, so that it ends within the settle
// time, and unevaluated gates allowed (the seeded policy has no held-out
// suite), so that it may promote and swap the serving weights.
var swapRelease = deployment.ReleasePolicy{
	ShadowDuration: time.Second, CanaryShare: 0.5, CanaryDuration: 3 * time.Second, CanaryChecks: 1, MinCanarySamples: 4,
	MaxTrafficWait: 5 * time.Second, AllowUnevaluated: true, WeightDrain: 5 * time.Second,
}

// SwapFigures are what a model server killed during a weight swap left
// behind.
type SwapFigures struct {
	// Candidate is the version whose release was loading it into the model
	// server when the server was killed; KilledIn the release's activity
	// then pending and its state ("scheduled" or "started"), attempt
	// KilledAttempt.
	Candidate     string `json:"candidate"`
	KilledIn      string `json:"killed_in"`
	KilledState   string `json:"killed_state"`
	KilledAttempt int32  `json:"killed_attempt"`
	// Outcome is how the release ended ("promoted", "rolled_back: why",
	// "failed: …", or "running" when the settle time ran out); DoneS the
	// time from the restart to its end (-1: not ended).
	Outcome string  `json:"outcome"`
	DoneS   float64 `json:"done_s"`
	// Serving is the version serving at the end, and Served whether the
	// restarted model server holds it (GET /v1/models; target true).
	Serving string `json:"serving"`
	Served  bool   `json:"served"`
}

// swapRun is a release whose model server was killed.
type swapRun struct {
	id        string
	restarted time.Time
	f         *SwapFigures
}

// killModelServerInSwap waits (up to wait) for a candidate of the trained
// deployment, releases it, and SIGKILLs the model server while the release
// loads it (its weight sync pending), then restarts the server.
func killModelServerInSwap(ctx context.Context, st *stack, wait time.Duration) (*swapRun, error) {
	c, conn, closeAll, err := st.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	f := &SwapFigures{DoneS: -1}
	deadline := time.Now().Add(wait)
	for f.Candidate == "" {
		err := conn.QueryRow(ctx, `SELECT id FROM model_versions WHERE deployment = $1 AND status = 'candidate'
ORDER BY created_at DESC LIMIT 1`, trainedDeployment).Scan(&f.Candidate)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, err
		}
		if f.Candidate == "" {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no candidate version of %s in %s", trainedDeployment, wait)
			}
			sleep(ctx, 200*time.Millisecond)
		}
	}
	id := flow.ReleaseWorkflowID(trainedDeployment, artefact.LayerWeights, f.Candidate)
	_, err = c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.ReleaseWorkflowName,
		flow.ReleaseInput{Deployment: trainedDeployment, Layer: artefact.LayerWeights, Candidate: f.Candidate,
			Policy: swapRelease, Reason: "bench faults: model-server-kill"})
	if err != nil {
		return nil, fmt.Errorf("start release of %s: %w", f.Candidate, err)
	}
	// The weight sync is the release's first step after it begins, and
	// loading a small checkpoint takes milliseconds: the kill comes as soon
	// as the sync is scheduled, so the load meets a dead server or dies
	// with it.
	for f.KilledIn == "" {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("release %s never reached its weight sync", id)
		}
		d, err := c.DescribeWorkflowExecution(ctx, id, "")
		if err != nil {
			return nil, fmt.Errorf("describe %s: %w", id, err)
		}
		if d.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return nil, fmt.Errorf("release %s ended before its weight sync could be cut", id)
		}
		for _, a := range d.GetPendingActivities() {
			if a.GetActivityType().GetName() == flow.ActivityName((*activities.Release).SyncWeights) {
				f.KilledIn, f.KilledAttempt = a.GetActivityType().GetName(), a.GetAttempt()
				f.KilledState = "scheduled"
				if a.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
					f.KilledState = "started"
				}
			}
		}
		if f.KilledIn == "" {
			sleep(ctx, 5*time.Millisecond)
		}
	}
	if err := st.ms.kill(); err != nil {
		return nil, err
	}
	if err := st.startModelServer(ctx); err != nil {
		return nil, err
	}
	return &swapRun{id: id, restarted: time.Now(), f: f}, nil
}

// settleSwap waits (up to settle) for the release to end, then asks the
// model server whether it serves the serving version.
func settleSwap(ctx context.Context, st *stack, r *swapRun, settle time.Duration) error {
	c, err := st.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	f := r.f
	wctx, cancel := context.WithTimeout(ctx, settle)
	defer cancel()
	var res flow.ReleaseResult
	err = c.GetWorkflow(wctx, r.id, "").Get(wctx, &res)
	switch {
	case err == nil:
		f.Outcome = res.State.Status
		if res.State.Status != flow.ReleasePromoted {
			f.Outcome += ": " + res.State.Reason
		}
		f.DoneS = time.Since(r.restarted).Seconds()
	case wctx.Err() != nil && ctx.Err() == nil:
		f.Outcome = "running"
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		f.Outcome = "failed: " + rootCause(err)
		f.DoneS = time.Since(r.restarted).Seconds()
	}
	conn, err := pgx.Connect(ctx, st.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT id FROM model_versions WHERE deployment = $1 AND status = 'serving'`, trainedDeployment).
		Scan(&f.Serving); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	served, err := st.servedModels(ctx)
	if err != nil {
		return err
	}
	f.Served = slices.Contains(served, f.Serving)
	return nil
}

// servedModels lists the model ids the model server answers for.
func (s *stack) servedModels(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.msAddr+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("model server: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("model server: /v1/models: %w", err)
	}
	ids := make([]string, len(out.Data))
	for i, m := range out.Data {
		ids[i] = m.ID
	}
	return ids, nil
}
