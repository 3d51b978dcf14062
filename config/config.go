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
	"net"
	"net/url"
	"strings"
	"time"
)

// DefaultAdminKey is the development admin key. The gateway refuses to start
// with it on a non-loopback address.
const DefaultAdminKey = "flywheel-dev-admin-key"

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
	MaxConns int    `yaml:"max_conns" help:"maximum pool connections (default 16)"`
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
}

// WorkerConfig is the Temporal worker process.
type WorkerConfig struct {
	TaskQueues []string `yaml:"task_queues" help:"task queues this worker polls, comma separated (default flywheel,flywheel-trainer,flywheel-sandbox)"`
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
		},
		Worker:  WorkerConfig{TaskQueues: []string{"flywheel", "flywheel-trainer", "flywheel-sandbox"}},
		Log:     LogConfig{Level: "info", Format: "text"},
		DataDir: ".flywheel/data",
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
	if len(c.Worker.TaskQueues) == 0 {
		bad("worker-task-queues", "name at least one task queue")
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
