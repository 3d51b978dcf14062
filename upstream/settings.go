package upstream

import (
	"os"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

// ForDeployment builds the backend a deployment's settings describe for
// deployment name: its model (default: name), then its fallbacks in order;
// an *Anthropic for the anthropic dialect, a *ResponsesRelay for a
// server that speaks the Responses API.
// timeout and retries apply where the settings do not say.
func ForDeployment(c deployment.Settings, name string, timeout time.Duration, retries int) (inference.Backend, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	config := func(model string) Config {
		cfg := Config{BaseURL: c.BaseURL, Model: model, APIKey: os.Getenv(c.APIKeyEnv), Timeout: timeout,
			Retries: retries, Dialect: c.ServerDialect(), VersionsByName: c.VersionsByName() && model == c.Primary(name)}
		if d, err := time.ParseDuration(c.Timeout); err == nil && d > 0 {
			cfg.Timeout = d
		}
		if c.Retries != nil {
			cfg.Retries = *c.Retries
		}
		return cfg
	}
	if c.ServerDialect() == deployment.DialectAnthropic {
		return NewAnthropic(config(c.Primary(name)), c.Fallbacks)
	}
	chat, err := chatBackend(c, name, config)
	if err != nil || !c.Responses {
		return chat, err
	}
	return NewResponsesRelay(chat, config(c.Primary(name)), c.Fallbacks)
}

// chatBackend is the Chat Completions backend of the settings: the
// primary model, then its fallbacks.
func chatBackend(c deployment.Settings, name string, config func(model string) Config) (inference.Backend, error) {
	primary, err := New(config(c.Primary(name)))
	if err != nil || len(c.Fallbacks) == 0 {
		return primary, err
	}
	chain := Fallback{primary}
	for _, fb := range c.Fallbacks {
		alt, err := New(config(fb))
		if err != nil {
			return nil, err
		}
		chain = append(chain, alt)
	}
	return chain, nil
}
