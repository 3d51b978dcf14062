package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/inference/upstream"
	"github.com/flywheel-ai/flywheel/store"
)

const msgRoutesRefreshFailed = "deployment routes refresh failed; serving the last known routes"

// Backend kinds in the deployments table.
const (
	BackendPolicy   = "policy"
	BackendUpstream = "upstream"
)

// routeTTL is how stale the routing rows (serving version, canary share,
// artefacts) may be: releases take effect within it, serving never pauses.
const routeTTL = time.Second

// target is where one request goes.
type target struct {
	deployment string
	backend    inference.Backend
	// version pins the weights version (serving or canary); "" lets the
	// backend serve its current one.
	version string
	// system is the serving playbook / harness text to inject.
	system string
	// tools is the serving tool-schema override, if any.
	tools *toolSchema
}

// toolSchema is a tool_schema artefact: per tool name, a description
// and/or an argument schema that replace what the client sent.
// Content: {"tools": {"NAME": {"description": "...", "parameters": {...}}}}.
type toolSchema struct {
	Version int
	Tools   map[string]struct {
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"tools"`
}

// apply overrides the offered tools it names and returns which it changed.
func (ts *toolSchema) apply(req *inference.Request) []string {
	if ts == nil {
		return nil
	}
	var changed []string
	tools := make([]inference.Tool, len(req.Tools))
	copy(tools, req.Tools)
	for i, t := range tools {
		o, ok := ts.Tools[t.Name]
		if !ok {
			continue
		}
		if o.Description != "" {
			tools[i].Description = o.Description
		}
		if len(o.Parameters) > 0 && json.Valid(o.Parameters) {
			tools[i].Parameters = o.Parameters
		}
		changed = append(changed, t.Name)
	}
	req.Tools = tools
	return changed
}

// router maps a model name to a backend and version.
type router struct {
	static map[string]inference.Backend
	db     store.DBTX
	logger *slog.Logger
	cfg    config.GatewayConfig

	mu         sync.Mutex
	routes     map[string]*store.Route
	loadedAt   time.Time
	refreshing bool
	dynamic    map[string]inference.Backend // upstream backends built from deployments rows, by config
}

// deploymentConfig is the deployments.config JSON of an upstream row.
type deploymentConfig struct {
	BaseURL   string   `json:"base_url"`
	Model     string   `json:"model"`
	APIKeyEnv string   `json:"api_key_env"`
	Fallbacks []string `json:"fallbacks"`
	VLLM      *bool    `json:"vllm"`
	Timeout   string   `json:"timeout"`
	Retries   *int     `json:"retries"`
}

// newRouter builds the static routes: the in-process policy under its
// model name, and the configured upstream models with their fallbacks.
func newRouter(cfg config.GatewayConfig, policy inference.Backend, db store.DBTX, logger *slog.Logger) (*router, error) {
	r := &router{static: map[string]inference.Backend{}, db: db, logger: logger, cfg: cfg, dynamic: map[string]inference.Backend{}}
	if policy != nil {
		r.static[cfg.PolicyModel] = policy
	}
	if cfg.UpstreamURL != "" {
		for _, m := range cfg.UpstreamModels {
			name, remote, ok := strings.Cut(m, "=")
			if !ok {
				remote = name
			}
			b, err := upstream.New(upstream.Config{BaseURL: cfg.UpstreamURL, Model: remote, APIKey: os.Getenv(cfg.UpstreamAPIKeyEnv),
				Timeout: cfg.UpstreamTimeout, Retries: cfg.UpstreamRetries, VLLM: cfg.UpstreamVLLM})
			if err != nil {
				return nil, err
			}
			r.static[name] = b
		}
		for _, fb := range cfg.UpstreamFallbacks {
			model, alts, _ := strings.Cut(fb, "=")
			primary, ok := r.static[model]
			if !ok {
				return nil, fmt.Errorf("upstream fallback for unknown model %q", model)
			}
			chain := upstream.Fallback{primary}
			for _, a := range strings.Split(alts, "|") {
				b, ok := r.static[a]
				if !ok {
					return nil, fmt.Errorf("upstream fallback %q of %q is not a configured model", a, model)
				}
				chain = append(chain, b)
			}
			r.static[model] = chain
		}
	}
	return r, nil
}

// load returns the routing rows. The first call reads them; later calls
// return what is cached and, when it is older than routeTTL, refresh it in
// the background, so no request ever waits on the refresh.
func (r *router) load(ctx context.Context) map[string]*store.Route {
	if r.db == nil {
		return nil
	}
	r.mu.Lock()
	routes, loaded, stale := r.routes, !r.loadedAt.IsZero(), time.Since(r.loadedAt) >= routeTTL
	if loaded && stale && !r.refreshing {
		r.refreshing = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			r.refresh(ctx)
		}()
	}
	r.mu.Unlock()
	if !loaded {
		return r.refresh(ctx)
	}
	return routes
}

func (r *router) refresh(ctx context.Context) map[string]*store.Route {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	routes, err := store.LoadRoutes(ctx, r.db)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshing = false
	r.loadedAt = time.Now()
	if err != nil {
		r.logger.Warn(msgRoutesRefreshFailed, "err", err)
		return r.routes
	}
	r.routes = routes
	return routes
}

// resolve picks the backend and version for model; sessionID makes the
// canary split sticky, so one session never mixes versions.
func (r *router) resolve(ctx context.Context, model, sessionID string) (*target, error) {
	routes := r.load(ctx)
	route := routes[model]
	t := &target{deployment: model, backend: r.static[model]}
	if route != nil {
		if t.backend == nil {
			b, err := r.dynamicBackend(route)
			if err != nil {
				return nil, err
			}
			t.backend = b
		}
		t.version = route.ServingVersion
		if route.CanaryVersion != "" && route.CanaryShare > 0 && shareOf(sessionID) < route.CanaryShare {
			t.version = route.CanaryVersion
		}
		t.system = injectedSystem(route)
		if a, ok := route.Artefacts["tool_schema"]; ok {
			var ts toolSchema
			if json.Unmarshal(a.Content, &ts) == nil && len(ts.Tools) > 0 {
				ts.Version = a.Version
				t.tools = &ts
			}
		}
	}
	if t.backend == nil {
		return nil, errf(http.StatusNotFound, "model %q does not exist", model)
	}
	return t, nil
}

func shareOf(key string) float64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return float64(h.Sum64()%10000) / 10000
}

func (r *router) dynamicBackend(route *store.Route) (inference.Backend, error) {
	if route.Backend != BackendUpstream {
		return nil, errf(http.StatusServiceUnavailable, "model %q is served by the %s backend, which this gateway does not run", route.Deployment, route.Backend)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := route.Deployment + "\x00" + string(route.Config)
	if b, ok := r.dynamic[key]; ok {
		return b, nil
	}
	var dc deploymentConfig
	if err := json.Unmarshal(route.Config, &dc); err != nil || dc.BaseURL == "" {
		return nil, errf(http.StatusServiceUnavailable, "model %q has no usable upstream config", route.Deployment)
	}
	mk := func(model string) (inference.Backend, error) {
		c := upstream.Config{BaseURL: dc.BaseURL, Model: model, APIKey: os.Getenv(dc.APIKeyEnv), Timeout: r.cfg.UpstreamTimeout,
			Retries: r.cfg.UpstreamRetries, VLLM: dc.VLLM == nil || *dc.VLLM}
		if d, err := time.ParseDuration(dc.Timeout); err == nil && d > 0 {
			c.Timeout = d
		}
		if dc.Retries != nil {
			c.Retries = *dc.Retries
		}
		return upstream.New(c)
	}
	model := dc.Model
	if model == "" {
		model = route.Deployment
	}
	primary, err := mk(model)
	if err != nil {
		return nil, err
	}
	var b inference.Backend = primary
	if len(dc.Fallbacks) > 0 {
		chain := upstream.Fallback{primary}
		for _, fb := range dc.Fallbacks {
			alt, err := mk(fb)
			if err != nil {
				return nil, err
			}
			chain = append(chain, alt)
		}
		b = chain
	}
	r.dynamic[key] = b
	return b, nil
}

// models lists every model name this gateway serves.
func (r *router) models(ctx context.Context) []string {
	seen := map[string]bool{}
	for m := range r.static {
		seen[m] = true
	}
	for m, route := range r.load(ctx) {
		if route.Backend == BackendUpstream || r.static[m] != nil {
			seen[m] = true
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// injectedSystem renders the serving harness and playbook of a deployment
// as system-prompt text. Artefact content is JSON: {"text": "..."} or
// {"system_prompt": "..."} or {"items": [{"id", "content"}, ...]}.
func injectedSystem(route *store.Route) string {
	var parts []string
	for _, kind := range []string{"harness", "playbook"} {
		a, ok := route.Artefacts[kind]
		if !ok {
			continue
		}
		var c struct {
			Text         string `json:"text"`
			SystemPrompt string `json:"system_prompt"`
			Items        []struct {
				ID      string `json:"id"`
				Content string `json:"content"`
			} `json:"items"`
		}
		if json.Unmarshal(a.Content, &c) != nil {
			continue
		}
		switch {
		case c.SystemPrompt != "":
			parts = append(parts, c.SystemPrompt)
		case c.Text != "":
			parts = append(parts, c.Text)
		case len(c.Items) > 0:
			var b strings.Builder
			b.WriteString("Playbook (lessons from earlier sessions):")
			for _, it := range c.Items {
				fmt.Fprintf(&b, "\n- [%s] %s", it.ID, it.Content)
			}
			parts = append(parts, b.String())
		}
	}
	return strings.Join(parts, "\n\n")
}

// inject prepends the deployment's system text to the request's system
// message (or adds one), leaving the client's messages otherwise intact.
func inject(req *inference.Request, system string) {
	if system == "" {
		return
	}
	msgs := make([]inference.Message, 0, len(req.Messages)+1)
	if len(req.Messages) > 0 && req.Messages[0].Role == inference.RoleSystem {
		first := req.Messages[0]
		first.Content = system + "\n\n" + first.Content
		msgs = append(msgs, first)
		msgs = append(msgs, req.Messages[1:]...)
	} else {
		msgs = append(msgs, inference.Message{Role: inference.RoleSystem, Content: system})
		msgs = append(msgs, req.Messages...)
	}
	req.Messages = msgs
}
