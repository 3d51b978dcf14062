// Package config holds the one configuration struct of the flywheel binary
// and fills it, in this order of precedence, from: built-in defaults, an
// optional YAML file, FLYWHEEL_* environment variables, and command-line
// flags. Every leaf field becomes a flag and an environment variable named
// after its YAML path (gateway.listen → --gateway-listen,
// FLYWHEEL_GATEWAY_LISTEN), so the three sources can never drift apart.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/atdp"
)

// DefaultAdminKey is the development admin key. The gateway refuses to start
// with it on a non-loopback address.
const DefaultAdminKey = "flywheel-dev-admin-key"

// DevTenant is the tenant `flywheel up` issues its development key for.
const DevTenant = "default"

// Config is the flywheel binary's configuration. Each field's `help` tag is
// its documentation and names its default.
type Config struct {
	// Database is the Postgres connection.
	Database DatabaseConfig `yaml:"database"`
	// Temporal is the Temporal frontend connection.
	Temporal TemporalConfig `yaml:"temporal"`
	// Gateway is the HTTP API.
	Gateway GatewayConfig `yaml:"gateway"`
	// Worker is the Temporal worker process.
	Worker WorkerConfig `yaml:"worker"`
	// Control is what `flywheel up` schedules on the control plane.
	Control ControlConfig `yaml:"control"`
	// Trainer is the embedded trainer and its off-policy correction.
	Trainer TrainerConfig `yaml:"trainer"`
	// ModelServer serves the in-process policy in vLLM's dialect.
	ModelServer ModelServerConfig `yaml:"model_server"`
	// Docker is the Docker Engine used for sandboxes.
	Docker DockerConfig `yaml:"docker"`
	// Log controls logging.
	Log LogConfig `yaml:"log"`
	// DataDir holds checkpoints and other local artefacts.
	DataDir string `yaml:"data_dir" help:"directory for checkpoints and local artefacts (default .flywheel/data)"`
}

// DatabaseConfig is the Postgres connection.
type DatabaseConfig struct {
	URL      string `yaml:"url" help:"Postgres connection URL (default postgres://flywheel@127.0.0.1:55432/flywheel?sslmode=disable, the cluster scripts/services.sh starts)"`
	MaxConns int    `yaml:"max_conns" help:"maximum pool connections (default 16; a gateway opens 2 more of its own for capture)"`
}

// TemporalConfig is the Temporal frontend connection.
type TemporalConfig struct {
	Address   string `yaml:"address" help:"Temporal frontend host:port (default 127.0.0.1:7233)"`
	Namespace string `yaml:"namespace" help:"Temporal namespace (default flywheel)"`
	UIURL     string `yaml:"ui_url" help:"Temporal Web UI URL shown to users (default http://127.0.0.1:8233)"`
}

// GatewayConfig is the HTTP API.
type GatewayConfig struct {
	Listen       string        `yaml:"listen" help:"gateway listen address (default 127.0.0.1:8080)"`
	AdminKey     string        `yaml:"admin_key" help:"admin API key; the default is refused on a non-loopback address (default flywheel-dev-admin-key)"`
	MaxBodyBytes int64         `yaml:"max_body_bytes" help:"largest accepted request body in bytes, larger answers 413 (default 8388608)"`
	ReadTimeout  time.Duration `yaml:"read_timeout" help:"HTTP read timeout (default 30s)"`

	RateLimitRPS   float64 `yaml:"rate_limit_rps" help:"requests per second allowed per API key, over it answers 429 with Retry-After; 0 disables (default 100)"`
	RateLimitBurst int     `yaml:"rate_limit_burst" help:"requests an API key may burst above its rate (default 200)"`
	RateLimitTPM   int64   `yaml:"rate_limit_tpm" help:"prompt and completion tokens per minute allowed per API key, charged after each model call; over it the next call answers 429 with Retry-After; a key's own tpm overrides it; 0 disables (default 0)"`
	Replicas       int     `yaml:"replicas" help:"gateway replicas sharing the rate limits: each enforces rate_limit_rps, rate_limit_burst and every tokens-per-minute limit divided by this (default 1)"`

	CaptureBatchMax  int           `yaml:"capture_batch_max" help:"most interactions committed in one capture transaction (default 512)"`
	CaptureBatchWait time.Duration `yaml:"capture_batch_wait" help:"how long the capture committer waits to fill a batch; 0 commits as soon as the previous commit is done (default 0s)"`

	RewardMin     float64            `yaml:"reward_min" help:"smallest accepted reward value (default -1)"`
	RewardMax     float64            `yaml:"reward_max" help:"largest accepted reward value (default 1)"`
	RewardWeights map[string]float64 `yaml:"reward_weights" help:"weights merging reward sources, name=weight pairs; unlisted sources weigh 1 (default user=1)"`
	Discount      float64            `yaml:"discount" help:"discount factor gamma for returns, in (0, 1] (default 1)"`

	PolicyModel       string        `yaml:"policy_model" help:"model name served by the in-process policy (default flywheel-policy)"`
	UpstreamURL       string        `yaml:"upstream_url" help:"base URL of an OpenAI-compatible upstream (vLLM, SGLang), e.g. http://127.0.0.1:8000/v1; empty: none (default empty)"`
	UpstreamModels    []string      `yaml:"upstream_models" help:"model names routed to the upstream, comma separated; name=upstream_name renames (default empty)"`
	UpstreamAPIKeyEnv string        `yaml:"upstream_api_key_env" help:"environment variable holding the upstream API key (default empty)"`
	UpstreamTimeout   time.Duration `yaml:"upstream_timeout" help:"timeout of one upstream attempt (default 2m)"`
	UpstreamRetries   int           `yaml:"upstream_retries" help:"retries with backoff after a 429/5xx or connection error (default 2)"`
	UpstreamVLLM      bool          `yaml:"upstream_vllm" help:"ask the upstream for token ids with vLLM's return_token_ids / return_tokens_as_token_ids; turn off for servers that reject unknown parameters (default true)"`
	UpstreamFallbacks []string      `yaml:"upstream_fallbacks" help:"per-model fallbacks tried in order when a model fails, model=alt1|alt2 (default empty)"`
	RedactPatterns    []string      `yaml:"redact_patterns" help:"extra PII patterns kind=regexp applied on export and before training; YAML is safer for regexps with commas (default empty)"`
	NotifyInterval    time.Duration `yaml:"notify_interval" help:"how often session notices are flushed to Temporal, batched per session (default 200ms)"`
	KeyCacheTTL       time.Duration `yaml:"key_cache_ttl" help:"how long a verified API key is cached; a revoked key stops working within this time (default 10s)"`
	StatusDevTenant   string        `yaml:"status_dev_tenant" help:"tenant the /status page shows a browser without an API key, only while the gateway listens on a loopback address; empty: always ask for a key (default default)"`
}

// WorkerConfig is the Temporal worker process.
type WorkerConfig struct {
	TaskQueues []string `yaml:"task_queues" help:"task queues this worker polls, comma separated (default flywheel,flywheel-sessions,flywheel-tinker,flywheel-sandbox)"`
	GatewayURL string   `yaml:"gateway_url" help:"the gateway's base URL (http://host:port) through which evolution asks each deployment's reflector; 'flywheel up' uses its own gateway; empty: no reflector on this worker (default empty)"`
	GatewayKey string   `yaml:"gateway_key_env" help:"name of the environment variable holding an operator API key for gateway_url; the reflector's calls are that tenant's opted-out sessions (default FLYWHEEL_OPERATOR_KEY)"`
}

// ControlConfig is what `flywheel up` schedules on the control plane.
type ControlConfig struct {
	WatchdogEvery time.Duration `yaml:"watchdog_every" help:"how often the watchdog re-measures the serving version of the policy deployment against its anchor and rolls back a significant drop (a Temporal schedule); 0 turns it off (default 1m)"`
	EvolveEvery   time.Duration `yaml:"evolve_every" help:"how often evolution judges every deployment with traffic (the last interval's sessions are its evidence) and changes one layer if they call for it (a Temporal schedule, first run one interval after start); 0 turns it off (default 1h)"`
}

// TrainerConfig is the embedded trainer: the Go trainer of the in-process
// policy behind the Tinker training API, which the policy deployment
// trains through as any deployment trains on a Tinker service, and its
// off-policy token masks (a training policy's Masks override them).
type TrainerConfig struct {
	Listen     string  `yaml:"listen" help:"the embedded trainer's Tinker API listen address; 'flywheel up' runs it beside the model server, 'flywheel trainer-server' alone (default 127.0.0.1:8091)"`
	URL        string  `yaml:"url" help:"the embedded trainer's root URL as workers reach it, recorded as the policy deployment's trainer; empty: http://<listen address> (default empty)"`
	LoRARank   int     `yaml:"lora_rank" help:"rank of the LoRA adapter the policy deployment trains on every linear layer; 0 trains full weights, Flywheel's extension of the API (default 0)"`
	IcePop     bool    `yaml:"icepop" help:"IcePop: leave out of the loss tokens whose ratio of the proximal to the behaviour probability leaves [icepop_low, icepop_high] (default false)"`
	IcePopLow  float64 `yaml:"icepop_low" help:"IcePop's lower ratio bound, in (0, 1) (default 0.5)"`
	IcePopHigh float64 `yaml:"icepop_high" help:"IcePop's upper ratio bound, above 1 (default 2)"`
	KPop       bool    `yaml:"kpop" help:"KPop: leave out of the loss tokens whose bidirectional binary KL between the proximal and behaviour policy exceeds kpop_phi (default false)"`
	KPopPhi    float64 `yaml:"kpop_phi" help:"KPop's KL threshold, positive (default 0.05)"`
}

// ModelServerConfig is the model server of the in-process policy: the
// policy's weights served over vLLM's HTTP dialect, which the gateway,
// the gates and weight sync reach as they reach any vLLM deployment.
type ModelServerConfig struct {
	Listen string `yaml:"listen" help:"model server listen address; 'flywheel up' runs it beside the gateway, 'flywheel model-server' alone (default 127.0.0.1:8090, beside vLLM's usual 8000)"`
	URL    string `yaml:"url" help:"the model server's OpenAI base URL as the gateway and workers reach it, recorded on the policy deployment; empty: http://<listen address>/v1 (default empty)"`
}

// DockerConfig is the Docker Engine used for sandboxes.
type DockerConfig struct {
	Host string `yaml:"host" help:"Docker Engine address; empty uses DOCKER_HOST or the local socket (default empty)"`
}

// LogConfig controls logging.
type LogConfig struct {
	Level  string `yaml:"level" help:"debug, info, warn or error (default info)"`
	Format string `yaml:"format" help:"text or json (default text)"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Database: DatabaseConfig{
			URL:      "postgres://flywheel@127.0.0.1:55432/flywheel?sslmode=disable",
			MaxConns: 16,
		},
		Temporal: TemporalConfig{
			Address:   "127.0.0.1:7233",
			Namespace: "flywheel",
			UIURL:     "http://127.0.0.1:8233",
		},
		Gateway: GatewayConfig{
			Listen:       "127.0.0.1:8080",
			AdminKey:     DefaultAdminKey,
			MaxBodyBytes: 8 << 20,
			ReadTimeout:  30 * time.Second,

			RateLimitRPS:    100,
			RateLimitBurst:  200,
			Replicas:        1,
			CaptureBatchMax: 512,
			RewardMin:       -1,
			RewardMax:       1,
			RewardWeights:   map[string]float64{"user": 1},
			Discount:        atdp.DefaultDiscount,
			PolicyModel:     "flywheel-policy",
			UpstreamTimeout: 2 * time.Minute,
			UpstreamRetries: 2,
			UpstreamVLLM:    true,
			NotifyInterval:  200 * time.Millisecond,
			KeyCacheTTL:     10 * time.Second,
			StatusDevTenant: DevTenant,
		},
		Worker:      WorkerConfig{TaskQueues: []string{"flywheel", "flywheel-sessions", "flywheel-tinker", "flywheel-sandbox"}, GatewayKey: "FLYWHEEL_OPERATOR_KEY"},
		Control:     ControlConfig{WatchdogEvery: time.Minute, EvolveEvery: time.Hour},
		Trainer:     TrainerConfig{Listen: "127.0.0.1:8091", IcePopLow: 0.5, IcePopHigh: 2, KPopPhi: 0.05},
		ModelServer: ModelServerConfig{Listen: "127.0.0.1:8090"},
		Log:         LogConfig{Level: "info", Format: "text"},
		DataDir:     ".flywheel/data",
	}
}

// Validate reports every problem with c at once, each naming its flag.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	if u, err := url.Parse(c.Database.URL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		bad("database-url", "want a postgres:// URL, got %q", c.Database.URL)
	}
	if c.Database.MaxConns < 1 || c.Database.MaxConns > 1000 {
		bad("database-max-conns", "want 1..1000, got %d", c.Database.MaxConns)
	}
	if _, _, err := net.SplitHostPort(c.Temporal.Address); err != nil {
		bad("temporal-address", "want host:port, got %q", c.Temporal.Address)
	}
	if c.Temporal.Namespace == "" {
		bad("temporal-namespace", "must not be empty")
	}
	host, _, err := net.SplitHostPort(c.Gateway.Listen)
	if err != nil {
		bad("gateway-listen", "want host:port, got %q", c.Gateway.Listen)
	} else if c.Gateway.AdminKey == DefaultAdminKey && !IsLoopback(host) {
		bad("gateway-admin-key", "the default admin key is only allowed on a loopback address; set FLYWHEEL_GATEWAY_ADMIN_KEY to listen on %q", c.Gateway.Listen)
	}
	if len(c.Gateway.AdminKey) < 16 {
		bad("gateway-admin-key", "must be at least 16 characters")
	}
	if c.Gateway.MaxBodyBytes < 1024 {
		bad("gateway-max-body-bytes", "want at least 1024, got %d", c.Gateway.MaxBodyBytes)
	}
	if c.Gateway.ReadTimeout <= 0 {
		bad("gateway-read-timeout", "must be positive")
	}
	c.Gateway.validate(bad)
	if t := c.Trainer; !(t.IcePopLow > 0 && t.IcePopLow < 1 && t.IcePopHigh > 1) || math.IsInf(t.IcePopHigh, 0) {
		bad("trainer-icepop-low", "want 0 < icepop_low < 1 < icepop_high, got [%v, %v]", t.IcePopLow, t.IcePopHigh)
	}
	if t := c.Trainer; !(t.KPopPhi > 0) || math.IsInf(t.KPopPhi, 0) {
		bad("trainer-kpop-phi", "want a positive threshold, got %v", c.Trainer.KPopPhi)
	}
	if _, _, err := net.SplitHostPort(c.ModelServer.Listen); err != nil {
		bad("model-server-listen", "want host:port, got %q", c.ModelServer.Listen)
	}
	if _, _, err := net.SplitHostPort(c.Trainer.Listen); err != nil {
		bad("trainer-listen", "want host:port, got %q", c.Trainer.Listen)
	}
	if c.Trainer.URL != "" {
		if u, err := url.Parse(c.Trainer.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("trainer-url", "want an http(s):// URL, got %q", c.Trainer.URL)
		}
	}
	if c.Trainer.LoRARank < 0 || c.Trainer.LoRARank > 1024 {
		bad("trainer-lora-rank", "want 0 (full weights) to 1024, got %d", c.Trainer.LoRARank)
	}
	if c.ModelServer.URL != "" {
		if u, err := url.Parse(c.ModelServer.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("model-server-url", "want an http(s):// URL ending in /v1, got %q", c.ModelServer.URL)
		}
	}
	if len(c.Worker.TaskQueues) == 0 {
		bad("worker-task-queues", "name at least one task queue")
	}
	if w := c.Control.WatchdogEvery; w != 0 && (w < time.Second || w > 24*time.Hour) {
		bad("control-watchdog-every", "want 0 (off) or 1s..24h, got %s", w)
	}
	if w := c.Control.EvolveEvery; w != 0 && (w < time.Minute || w > 7*24*time.Hour) {
		bad("control-evolve-every", "want 0 (off) or 1m..168h, got %s", w)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "want debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log-format", "want text or json, got %q", c.Log.Format)
	}
	if c.DataDir == "" {
		bad("data-dir", "must not be empty")
	}
	return errors.Join(errs...)
}

// IsLoopback reports whether host (a name or an IP, possibly empty for "all
// interfaces") only accepts connections from this machine.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validate checks the gateway's capture, reward and upstream settings.
func (g *GatewayConfig) validate(bad func(flag, format string, args ...any)) {
	if g.RateLimitRPS < 0 || math.IsNaN(g.RateLimitRPS) {
		bad("gateway-rate-limit-rps", "want 0 (off) or a positive rate, got %v", g.RateLimitRPS)
	}
	if g.RateLimitRPS > 0 && g.RateLimitBurst < 1 {
		bad("gateway-rate-limit-burst", "want at least 1, got %d", g.RateLimitBurst)
	}
	if g.RateLimitTPM < 0 {
		bad("gateway-rate-limit-tpm", "want 0 (off) or a positive number of tokens per minute, got %d", g.RateLimitTPM)
	}
	if g.Replicas < 1 || g.Replicas > 1000 {
		bad("gateway-replicas", "want 1..1000 gateway replicas, got %d", g.Replicas)
	}
	if g.CaptureBatchMax < 1 || g.CaptureBatchMax > 10000 {
		bad("gateway-capture-batch-max", "want 1..10000, got %d", g.CaptureBatchMax)
	}
	if g.CaptureBatchWait < 0 || g.CaptureBatchWait > time.Second {
		bad("gateway-capture-batch-wait", "want 0..1s, got %s", g.CaptureBatchWait)
	}
	if math.IsNaN(g.RewardMin) || math.IsNaN(g.RewardMax) || math.IsInf(g.RewardMin, 0) || math.IsInf(g.RewardMax, 0) || g.RewardMin >= g.RewardMax {
		bad("gateway-reward-min", "want finite reward_min < reward_max, got [%v, %v]", g.RewardMin, g.RewardMax)
	}
	for src, w := range g.RewardWeights {
		if src == "" || w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			bad("gateway-reward-weights", "want name=weight with a finite weight >= 0, got %q=%v", src, w)
		}
	}
	if !(g.Discount > 0 && g.Discount <= 1) {
		bad("gateway-discount", "want 0 < gamma <= 1, got %v", g.Discount)
	}
	if g.PolicyModel == "" {
		bad("gateway-policy-model", "must not be empty")
	}
	if g.UpstreamURL != "" {
		if u, err := url.Parse(g.UpstreamURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("gateway-upstream-url", "want an http(s):// URL, got %q", g.UpstreamURL)
		}
		if len(g.UpstreamModels) == 0 {
			bad("gateway-upstream-models", "name the models the upstream serves")
		}
	}
	if g.UpstreamTimeout <= 0 {
		bad("gateway-upstream-timeout", "must be positive")
	}
	if g.UpstreamRetries < 0 || g.UpstreamRetries > 10 {
		bad("gateway-upstream-retries", "want 0..10, got %d", g.UpstreamRetries)
	}
	for _, fb := range g.UpstreamFallbacks {
		if m, alts, ok := strings.Cut(fb, "="); !ok || m == "" || alts == "" {
			bad("gateway-upstream-fallbacks", "want model=alt1|alt2, got %q", fb)
		}
	}
	for _, p := range g.RedactPatterns {
		if k, e, ok := strings.Cut(p, "="); !ok || k == "" || e == "" {
			bad("gateway-redact-patterns", "want kind=regexp, got %q", p)
		}
	}
	if g.NotifyInterval <= 0 {
		bad("gateway-notify-interval", "must be positive")
	}
	if g.KeyCacheTTL < 0 {
		bad("gateway-key-cache-ttl", "must not be negative")
	}
}
