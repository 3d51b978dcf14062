package deployment

import (
	"fmt"
	"net/url"
	"time"
)

// Kinds of weight sync: how trained versions reach a deployment's engine.
const (
	WeightSyncVLLMLoRA   = "vllm_lora"
	WeightSyncSGLangDisk = "sglang_disk"
)

// WeightSync is how trained versions reach a deployment's engine (the
// weight_sync object of its settings); package inference/weightsync does
// the syncing.
type WeightSync struct {
	// Kind is vllm_lora or sglang_disk.
	Kind string `json:"kind"`
	// URL is where the engine's weight endpoints are. Default: the
	// deployment's base_url (vLLM's are under /v1), or for SGLang that URL
	// without its /v1.
	URL string `json:"url,omitempty"`
	// Timeout bounds one load, as a Go duration (default 2m for an
	// adapter, 10m for full weights).
	Timeout string `json:"timeout,omitempty"`
}

// Validate checks the weight sync settings.
func (s WeightSync) Validate() error {
	switch s.Kind {
	case WeightSyncVLLMLoRA, WeightSyncSGLangDisk:
	default:
		return fmt.Errorf("weight_sync.kind %q: want %s or %s", s.Kind, WeightSyncVLLMLoRA, WeightSyncSGLangDisk)
	}
	if s.URL != "" {
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("weight_sync.url %q: want an http(s) URL", s.URL)
		}
	}
	if s.Timeout != "" {
		if d, err := time.ParseDuration(s.Timeout); err != nil || d <= 0 {
			return fmt.Errorf("weight_sync.timeout %q: want a positive duration such as 5m", s.Timeout)
		}
	}
	return nil
}

// ByName reports whether the engine serves each version under its own
// model name (an adapter), beside the others, rather than in place.
func (s WeightSync) ByName() bool { return s.Kind == WeightSyncVLLMLoRA }
