package deployment

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Backend kinds of a deployment, as stored.
const (
	// BackendPolicy is the in-process policy of `flywheel up` before it was
	// served by its own model server (rows written by older versions).
	BackendPolicy = "policy"
	// BackendUpstream is an OpenAI-compatible server (vLLM, SGLang, …),
	// including the built-in policy's model server.
	BackendUpstream = "upstream"
)

// MaxName bounds a deployment name.
const MaxName = 200

// ErrNotUpstream is returned for a deployment that no upstream serves
// where one is needed.
var ErrNotUpstream = errors.New("the deployment is not served by an upstream")

// ValidName checks a name clients can ask for as a model: 1 to 200
// characters, none of them '@' (it separates a version), '/' (it would not
// fit in an admin path), whitespace or control characters.
func ValidName(name string) error {
	if name == "" || len(name) > MaxName || strings.ContainsAny(name, "@/") ||
		strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("deployment name %q: want 1..%d characters, no '@', '/', spaces or control characters", name, MaxName)
	}
	return nil
}

// Deployment is one deployment as stored: its name, its backend kind, its
// settings as JSON and the version it serves.
type Deployment struct {
	Name           string          `json:"name"`
	Backend        string          `json:"backend"`
	Config         json.RawMessage `json:"config"`
	ServingVersion string          `json:"serving_version,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
}

// Settings reads an upstream deployment's settings: ErrNotUpstream for
// another backend, a validation error for settings that no longer read.
func (d Deployment) Settings() (Settings, error) {
	if d.Backend != BackendUpstream {
		return Settings{}, fmt.Errorf("deployment %s: %w", d.Name, ErrNotUpstream)
	}
	return Parse(d.Config)
}
