package deployment

import (
	"fmt"
	"strings"
)

// Evolution is how a deployment's cheap layers (playbook, harness, tool
// schemas) learn: which model reflects on its failed sessions, and what
// the reflection may spend.
type Evolution struct {
	// Reflector is the deployment whose model reads failed sessions and
	// proposes changes: any model Flywheel routes (a stronger hosted
	// model behind an OpenAI-compatible upstream, or this deployment
	// itself). Its calls go through the gateway as the operator's
	// opted-out sessions, so they are recorded and never train. "": no
	// reflector, and the cheap layers propose nothing.
	Reflector string `json:"reflector,omitempty"`
	// DailyTokens bounds what reflection spends per tenant and UTC day
	// (prompt and completion tokens; the harness, which is no tenant's,
	// is charged to "*"). Default 200,000.
	DailyTokens int `json:"daily_tokens,omitempty"`
	// DecisionTokens bounds what one decision spends. Default 20,000.
	DecisionTokens int `json:"decision_tokens,omitempty"`
	// MaxTokens bounds one reflection's answer. Default 1,024.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Sessions is how many rewarded sessions one reflection reads at most.
	// Default 12.
	Sessions int `json:"sessions,omitempty"`
	// PlaybookMax caps a tenant's playbook items. Default 50.
	PlaybookMax int `json:"playbook_max,omitempty"`
}

// WithDefaults fills zero fields.
func (e Evolution) WithDefaults() Evolution {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&e.DailyTokens, 200_000)
	def(&e.DecisionTokens, 20_000)
	def(&e.MaxTokens, 1024)
	def(&e.Sessions, 12)
	def(&e.PlaybookMax, 50)
	return e
}

// Validate checks the settings' ranges.
func (e Evolution) Validate() error {
	if strings.TrimSpace(e.Reflector) != e.Reflector || len(e.Reflector) > maxModelName {
		return fmt.Errorf("evolution.reflector %q: want a deployment name", e.Reflector)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"daily_tokens", e.DailyTokens}, {"decision_tokens", e.DecisionTokens}, {"max_tokens", e.MaxTokens},
		{"sessions", e.Sessions}, {"playbook_max", e.PlaybookMax}} {
		if f.v < 0 {
			return fmt.Errorf("evolution.%s %d: want 0 (the default) or more", f.name, f.v)
		}
	}
	d := e.WithDefaults()
	if d.DecisionTokens > d.DailyTokens {
		return fmt.Errorf("evolution.decision_tokens %d is above daily_tokens %d", d.DecisionTokens, d.DailyTokens)
	}
	if d.Sessions > 100 {
		return fmt.Errorf("evolution.sessions %d: at most 100", d.Sessions)
	}
	return nil
}
