package gateway

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/upstream"
)

const (
	msgRoutesRefreshFailed = "deployment routes refresh failed; serving the last known routes"
	msgArtefactUnreadable  = "serving artefact is not readable; requests go without it"
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
	// system is the serving harness and the tenant's playbook lessons, as
	// injected in front of the system prompt.
	system string
	// artefacts are the artefacts the request is served under (the
	// serving ones, or an artefact canary's), artefactsKey names their
	// versions (store.ArtefactSuffix), and toolVersion is the version of
	// the tool schema among them.
	artefacts    artefact.Set
	artefactsKey string
	toolVersion  int
}

// routeArtefacts is a route's artefacts decoded: the serving set and, while
// an artefact release is in its canary, the set with the candidate in place
// of its kind's serving version.
type routeArtefacts struct {
	serving, canary       artefact.Set
	servingKey, canaryKey string
	// servingTools and canaryTools are the tool schema versions.
	servingTools, canaryTools int
	canaryShare               float64
}

// decodeArtefacts decodes a route's artefacts once per refresh.
func (r *router) decodeArtefacts(route *store.Route) routeArtefacts {
	var ra routeArtefacts
	versions := make([]store.StoredArtefact, 0, len(route.Artefacts))
	for kind, a := range route.Artefacts {
		if err := ra.serving.Decode(kind, a.Content); err != nil {
			r.logger.Warn(msgArtefactUnreadable, "deployment", route.Deployment, "kind", kind, "version", a.Version, "err", err)
			continue
		}
		versions = append(versions, store.StoredArtefact{Kind: kind, Version: a.Version})
	}
	ra.servingKey = store.ArtefactSuffix(versions, "", "")
	ra.servingTools = route.Artefacts[artefact.LayerToolSchema].Version
	if c := route.ArtefactCanary; c != nil {
		ra.canary = ra.serving
		if err := ra.canary.Decode(c.Kind, c.Content); err != nil {
			r.logger.Warn(msgArtefactUnreadable, "deployment", route.Deployment, "kind", c.Kind, "version", c.Version, "err", err)
			return ra
		}
		ra.canaryKey = store.ArtefactSuffix(versions, c.Kind, strconv.Itoa(c.Version))
		ra.canaryTools = ra.servingTools
		if c.Kind == artefact.LayerToolSchema {
			ra.canaryTools = c.Version
		}
		ra.canaryShare = c.Share
	}
	return ra
}

// router maps a model name to a backend and version.
type router struct {
	static map[string]inference.Backend
	// upstreams are the configured upstream models' deployments rows.
	upstreams map[string]deployment.Settings
	// started is when the static routes were built: their models' created
	// time in /v1/models.
	started time.Time
	db      store.DBTX
	logger  *slog.Logger
	cfg     config.GatewayConfig

	mu     sync.Mutex
	routes map[string]*store.Route
	// sets are the routes' artefacts, decoded once per refresh.
	sets       map[string]routeArtefacts
	loadedAt   time.Time
	refreshing bool
	dynamic    map[string]inference.Backend // upstream backends built from deployments rows, by config
}

// newRouter builds the static routes: the configured upstream models with
// their fallbacks. Every other model, the policy among them (its own model
// server, an upstream deployment), is routed by its deployments row.
func newRouter(cfg config.GatewayConfig, db store.DBTX, logger *slog.Logger) (*router, error) {
	r := &router{static: map[string]inference.Backend{}, upstreams: map[string]deployment.Settings{}, started: time.Now(),
		db: db, logger: logger, cfg: cfg, dynamic: map[string]inference.Backend{}}
	if cfg.UpstreamURL != "" {
		dialect := deployment.DialectOpenAI
		if cfg.UpstreamVLLM {
			dialect = deployment.DialectVLLM
		}
		for _, m := range cfg.UpstreamModels {
			name, remote, ok := strings.Cut(m, "=")
			if !ok {
				remote = name
			}
			b, err := upstream.New(upstream.Config{BaseURL: cfg.UpstreamURL, Model: remote, APIKey: os.Getenv(cfg.UpstreamAPIKeyEnv),
				Timeout: cfg.UpstreamTimeout, Retries: cfg.UpstreamRetries, Dialect: dialect})
			if err != nil {
				return nil, err
			}
			r.static[name] = b
			r.upstreams[name] = deployment.Settings{BaseURL: cfg.UpstreamURL, Model: remote, APIKeyEnv: cfg.UpstreamAPIKeyEnv, Dialect: dialect}
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

// register records the configured upstream models as deployments (rows
// that exist stay as they are). Without a row a model would be served
// with no artefacts, canary or gates.
func (r *router) register(ctx context.Context) error {
	if r.db == nil {
		return nil
	}
	names := make([]string, 0, len(r.upstreams))
	for name := range r.upstreams {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		uc := r.upstreams[name]
		if fb := r.fallbacks(name); len(fb) > 0 {
			uc.Fallbacks = fb
		}
		if _, err := store.RegisterUpstream(ctx, r.db, name, uc); err != nil {
			return err
		}
	}
	return nil
}

// fallbacks are the configured fallback models of name, by their upstream
// names.
func (r *router) fallbacks(name string) []string {
	for _, fb := range r.cfg.UpstreamFallbacks {
		model, alts, _ := strings.Cut(fb, "=")
		if model != name {
			continue
		}
		var out []string
		for _, a := range strings.Split(alts, "|") {
			out = append(out, r.upstreams[a].Model)
		}
		return out
	}
	return nil
}

// load returns the routing rows. The first call reads them; later calls
// return what is cached and, when it is older than routeTTL, refresh it in
// the background, so no request ever waits on the refresh.
func (r *router) load(ctx context.Context) map[string]*store.Route {
	routes, _ := r.loadSets(ctx)
	return routes
}

// loadSets is load with the routes' decoded artefacts.
func (r *router) loadSets(ctx context.Context) (map[string]*store.Route, map[string]routeArtefacts) {
	if r.db == nil {
		return nil, nil
	}
	r.mu.Lock()
	routes, sets, loaded, stale := r.routes, r.sets, !r.loadedAt.IsZero(), time.Since(r.loadedAt) >= routeTTL
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
	return routes, sets
}

func (r *router) refresh(ctx context.Context) (map[string]*store.Route, map[string]routeArtefacts) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	routes, err := store.LoadRoutes(ctx, r.db)
	sets := make(map[string]routeArtefacts, len(routes))
	for name, route := range routes {
		sets[name] = r.decodeArtefacts(route)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshing = false
	r.loadedAt = time.Now()
	if err != nil {
		r.logger.Warn(msgRoutesRefreshFailed, "err", err)
		return r.routes, r.sets
	}
	r.routes, r.sets = routes, sets
	return routes, sets
}

// resolve picks the backend and version for model and the artefacts that
// apply to the tenant's request; sessionID makes the canary split sticky,
// so one session never mixes versions.
func (r *router) resolve(ctx context.Context, model, tenantID, sessionID string) (*target, error) {
	routes, sets := r.loadSets(ctx)
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
		ra := sets[model]
		t.artefacts, t.artefactsKey, t.toolVersion = ra.serving, ra.servingKey, ra.servingTools
		// Its own split, so the sessions of a weights canary are not
		// also the artefact canary's.
		if ra.canaryShare > 0 && shareOf(sessionID+"\x00artefacts") < ra.canaryShare {
			t.artefacts, t.artefactsKey, t.toolVersion = ra.canary, ra.canaryKey, ra.canaryTools
		}
		t.system = t.artefacts.System(tenantID)
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
	if route.Backend != deployment.BackendUpstream {
		return nil, errf(http.StatusServiceUnavailable, "model %q is served by the %s backend, which this gateway does not run", route.Deployment, route.Backend)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := route.Deployment + "\x00" + string(route.Config)
	if b, ok := r.dynamic[key]; ok {
		return b, nil
	}
	dc, err := deployment.Parse(route.Config)
	if err != nil {
		return nil, errf(http.StatusServiceUnavailable, "model %q has no usable upstream config: %v", route.Deployment, err)
	}
	b, err := upstream.ForDeployment(dc, route.Deployment, r.cfg.UpstreamTimeout, r.cfg.UpstreamRetries)
	if err != nil {
		return nil, err
	}
	r.dynamic[key] = b
	return b, nil
}

// servedModel is one entry of /v1/models.
type servedModel struct {
	Name    string
	Created time.Time
}

// models lists every model this gateway serves, by name: a registered
// deployment's created time is its row's, a static model's the gateway's
// start.
func (r *router) models(ctx context.Context) []servedModel {
	seen := map[string]time.Time{}
	for m := range r.static {
		seen[m] = r.started
	}
	for m, route := range r.load(ctx) {
		if route.Backend == deployment.BackendUpstream || r.static[m] != nil {
			seen[m] = route.CreatedAt
		}
	}
	out := make([]servedModel, 0, len(seen))
	for m, at := range seen {
		out = append(out, servedModel{Name: m, Created: at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
