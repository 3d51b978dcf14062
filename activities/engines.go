package activities

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/upstream"
)

// DeploymentEngines is a Completer that serves several deployments, each
// on its own engine (Request.Model names the deployment). The gates and
// the watchdog of a deployment it does not serve record that nothing was
// evaluated, rather than answering with another model.
type DeploymentEngines interface {
	Completer
	Serves(ctx context.Context, deployment string) (bool, error)
	// PinsVersions reports whether deployment's engine answers as any
	// weights version asked for by name, rather than only as the one it
	// holds.
	PinsVersions(ctx context.Context, deployment string) (bool, error)
}

// Engines answers each gate and watchdog request on the serving engine of
// its deployment: the upstream server its deployments row names (the
// built-in policy's is its own model server). A candidate is never judged
// on another model.
type Engines struct {
	DB store.DBTX
	// Timeout and Retries apply to upstream calls whose deployment does
	// not set its own (the gateway's upstream_timeout and retries).
	Timeout time.Duration
	Retries int

	mu sync.Mutex
	// upstreams are the backends built from deployments rows, by name and
	// config, so a changed config builds a new one.
	upstreams map[string]upstreamEngine
}

// Serves reports whether an engine here answers for deployment.
func (e *Engines) Serves(ctx context.Context, deployment string) (bool, error) {
	c, _, err := e.engine(ctx, deployment)
	return c != nil, err
}

// PinsVersions implements DeploymentEngines: a server that holds each
// version as an adapter (vLLM's dynamic LoRA, the policy's model server)
// answers as any version; a server whose weights are replaced in place
// (SGLang's update_weights_from_disk) answers only as the one it holds,
// so a candidate cannot answer beside the serving version there.
func (e *Engines) PinsVersions(ctx context.Context, deployment string) (bool, error) {
	c, _, err := e.engine(ctx, deployment)
	u, ok := c.(upstreamEngine)
	return !ok || u.byName, err
}

// Complete implements Completer on the engine of req.Model.
func (e *Engines) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	c, serving, err := e.engine(ctx, req.Model)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, &inference.Error{Status: http.StatusNotFound, Message: fmt.Sprintf("no engine on this worker serves deployment %q", req.Model)}
	}
	if u, ok := c.(upstreamEngine); ok && req.Version != "" && req.Version != serving && !u.byName {
		// Its server holds one set of weights: the serving version's,
		// which the releases' syncs load. Answering another version's
		// prompts with them would pass a candidate nobody evaluated. A
		// server that holds each version as an adapter (vLLM's dynamic
		// LoRA) answers as the version asked for, by its name.
		return nil, &inference.Error{Status: http.StatusBadRequest, Message: fmt.Sprintf(
			"deployment %q is served by an upstream that holds only its serving weights (%q), so it cannot answer as weights version %q",
			req.Model, serving, req.Version)}
	}
	return c.Complete(ctx, req)
}

// upstreamEngine marks an upstream deployment's backend; byName: its
// server answers each weights version under the version's name.
type upstreamEngine struct {
	inference.Backend
	byName bool
}

// engine is deployment's engine here (nil: none) and the version its
// routes serve.
func (e *Engines) engine(ctx context.Context, name string) (c Completer, serving string, err error) {
	if e.DB == nil {
		return nil, "", nil
	}
	d, err := store.GetDeployment(ctx, e.DB, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("engine of %s: %w", name, err)
	}
	if d.Backend != deployment.BackendUpstream {
		return nil, "", nil // a row from before the model server (backend 'policy'): nothing to ask
	}
	key := d.Name + "\x00" + string(d.Config)
	e.mu.Lock()
	defer e.mu.Unlock()
	if u, ok := e.upstreams[key]; ok {
		return u, d.ServingVersion, nil
	}
	s, err := deployment.Parse(d.Config)
	if err != nil {
		return nil, "", nil // the gateway cannot serve it either; nothing to evaluate
	}
	b, err := upstream.ForDeployment(s, d.Name, e.Timeout, e.Retries)
	if err != nil {
		return nil, "", nil
	}
	if e.upstreams == nil {
		e.upstreams = map[string]upstreamEngine{}
	}
	u := upstreamEngine{b, s.VersionsByName()}
	e.upstreams[key] = u
	return u, d.ServingVersion, nil
}
