package deployment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// maxModelName bounds a model name in Settings, maxModelRef a base model
// or tokenizer (a path may be long).
const (
	maxModelName = 200
	maxModelRef  = 1024
)

// Dialect names the extensions a server understands for returning the
// engine's token ids.
type Dialect string

const (
	// DialectVLLM asks the chat endpoint for ids with vLLM's
	// return_token_ids (return_tokens_as_token_ids on an older vLLM).
	DialectVLLM Dialect = "vllm"
	// DialectSGLang generates through SGLang's native /generate with the
	// prompt's input_ids and return_logprob.
	DialectSGLang Dialect = "sglang"
	// DialectOpenAI is plain OpenAI Chat Completions: no ids, so its
	// samples never train (for servers that reject unknown parameters).
	// With Settings.Responses the server is relayed the Responses API too.
	DialectOpenAI Dialect = "openai"
	// DialectAnthropic is Anthropic's Messages API (api.anthropic.com, or
	// any server of that dialect): the gateway relays an Anthropic client's
	// body to it unchanged but for the model name, and converts an OpenAI
	// client's request. A hosted model returns no ids, so its samples never
	// train.
	DialectAnthropic Dialect = "anthropic"
)

// Settings are an upstream deployment's stored config (its
// deployments.config JSON): where its server is and how to call it.
type Settings struct {
	// BaseURL ends in /v1, e.g. http://vllm:8000/v1; for the anthropic
	// dialect it is the API's root, e.g. https://api.anthropic.com (a
	// trailing /v1 is allowed).
	BaseURL string `json:"base_url"`
	// Model is the server's name for the model (default: the deployment's).
	Model string `json:"model,omitempty"`
	// APIKeyEnv names the environment variable holding the server's key
	// (sent as a bearer token; as x-api-key in the anthropic dialect). The
	// key itself is never stored.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// Fallbacks are other model names on the same server, tried in order
	// when the model fails with 429, 5xx or a timeout.
	Fallbacks []string `json:"fallbacks,omitempty"`
	// Dialect is the server's: "vllm" (default), "sglang", "openai" (no
	// token ids, so no training) or "anthropic" (Anthropic's Messages API;
	// no ids either). See Dialect.
	Dialect Dialect `json:"dialect,omitempty"`
	// Responses says the server also speaks OpenAI's Responses API
	// (POST {base_url}/responses, as api.openai.com does): a Responses
	// client's body is relayed to it unchanged but for the model name,
	// not converted to Chat Completions, and its stored responses are
	// read and deleted there. Only for the openai dialect (default false).
	Responses bool `json:"responses,omitempty"`
	// VLLM is the older spelling of the dialect: false is "openai", true
	// "vllm". It is kept so stored configs still read; a config may set
	// both only where they agree.
	VLLM *bool `json:"vllm,omitempty"`
	// Timeout bounds one attempt, as a Go duration (default: the gateway's).
	Timeout string `json:"timeout,omitempty"`
	// Retries after the first attempt (default: the gateway's).
	Retries *int `json:"retries,omitempty"`
	// WeightSync is how trained versions reach the server (nil: they do
	// not). With vllm_lora each version is an adapter named by its version
	// id, and a request pinned to a version asks for that name.
	WeightSync *WeightSync `json:"weight_sync,omitempty"`
	// TrainerQueue is the Temporal task queue of the workers that train
	// this deployment (the trainer protocol's TrainBatch; default
	// flywheel-trainer, which no Flywheel worker serves: a deployment that
	// names no trainer needs a flywheel.train/v1 worker there).
	TrainerQueue string `json:"trainer_queue,omitempty"`
	// BaseModel is what the deployment's weights start from: a model hub
	// id or a path on the trainer's storage. A trainer that holds no
	// checkpoint of the deployment yet loads it (the trainer protocol's
	// base.model); "" leaves it to the trainer's own configuration.
	BaseModel string `json:"base_model,omitempty"`
	// Tokenizer is the base model's tokenizer, where it is not the base
	// model's own (default: BaseModel).
	Tokenizer string `json:"tokenizer,omitempty"`
	// Trainer says what trains the deployment (nil: a flywheel.train/v1
	// worker on TrainerQueue).
	Trainer *Trainer `json:"trainer,omitempty"`
	// Gates are this deployment's release-gate thresholds, as a JSON
	// object of ReleasePolicy's threshold fields in snake case (see
	// ReleasePolicy.WithGates); each one set here wins over the one its release was
	// started with. Empty: none.
	Gates json.RawMessage `json:"gates,omitempty"`
	// Evolution says how the cheap layers learn (nil: no reflector).
	Evolution *Evolution `json:"evolution,omitempty"`
}

// EvolutionOf is the deployment's evolution settings with their defaults.
func (c Settings) EvolutionOf() Evolution {
	if c.Evolution == nil {
		return Evolution{}.WithDefaults()
	}
	return c.Evolution.WithDefaults()
}

// ModelTokenizer is the tokenizer the settings name: Tokenizer, else the
// base model's own.
func (c Settings) ModelTokenizer() string {
	if c.Tokenizer != "" {
		return c.Tokenizer
	}
	return c.BaseModel
}

// TrainerOf is the deployment's trainer with its defaults: Trainer, else
// a flywheel.train/v1 worker on TrainerQueue; ok is false when the
// settings name neither (the training loop's default queue).
func (c Settings) TrainerOf() (t Trainer, ok bool) {
	switch {
	case c.Trainer != nil:
		return c.Trainer.WithDefaults(c.BaseModel), true
	case c.TrainerQueue != "":
		return Trainer{Kind: TrainerTemporal, Queue: c.TrainerQueue}, true
	}
	return Trainer{}, false
}

// VersionsByName reports whether the server answers each weights version
// under its own model name (LoRA adapters), so a candidate can answer
// beside the serving version.
func (c Settings) VersionsByName() bool { return c.WeightSync != nil && c.WeightSync.ByName() }

// ServerDialect is the dialect the settings give the server: Dialect,
// else the one VLLM names, else SGLang's where the weights sync through
// SGLang's endpoints, else vLLM's.
func (c Settings) ServerDialect() Dialect {
	switch {
	case c.Dialect != "":
		return c.Dialect
	case c.VLLM != nil && !*c.VLLM:
		return DialectOpenAI
	case c.VLLM == nil && c.WeightSync != nil && c.WeightSync.Kind == WeightSyncSGLangDisk:
		return DialectSGLang
	}
	return DialectVLLM
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks the config the way the gateway will use it.
func (c Settings) Validate() error {
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("base_url %q: want an http(s) URL such as http://vllm:8000/v1", c.BaseURL)
	}
	switch c.Dialect {
	case "", DialectVLLM, DialectSGLang, DialectOpenAI, DialectAnthropic:
	default:
		return fmt.Errorf("dialect %q: want %s, %s, %s or %s", c.Dialect, DialectVLLM, DialectSGLang, DialectOpenAI, DialectAnthropic)
	}
	if c.Dialect == DialectAnthropic && c.WeightSync != nil {
		return fmt.Errorf("weight_sync: a server of the %s dialect holds weights no trainer here can change", DialectAnthropic)
	}
	if c.Responses && c.ServerDialect() != DialectOpenAI {
		return fmt.Errorf("responses: true needs dialect %q (a server such as api.openai.com); dialect %q is served through the paths the gateway converts to", DialectOpenAI, c.ServerDialect())
	}
	if c.Dialect != "" && c.VLLM != nil && *c.VLLM != (c.Dialect == DialectVLLM) {
		return fmt.Errorf("vllm %t contradicts dialect %q: set dialect alone", *c.VLLM, c.Dialect)
	}
	if c.APIKeyEnv != "" && !envName.MatchString(c.APIKeyEnv) {
		return fmt.Errorf("api_key_env %q: want an environment variable name", c.APIKeyEnv)
	}
	for _, m := range append([]string{c.Model}, c.Fallbacks...) {
		if len(m) > maxModelName || strings.ContainsFunc(m, func(r rune) bool { return r < ' ' }) {
			return fmt.Errorf("model name %q: want at most %d printable characters", m, maxModelName)
		}
	}
	for _, m := range c.Fallbacks {
		if m == "" {
			return errors.New("fallbacks: a fallback names a model")
		}
	}
	if c.Timeout != "" {
		if d, err := time.ParseDuration(c.Timeout); err != nil || d <= 0 {
			return fmt.Errorf("timeout %q: want a positive duration such as 30s", c.Timeout)
		}
	}
	if c.Retries != nil && (*c.Retries < 0 || *c.Retries > 10) {
		return fmt.Errorf("retries %d: want 0..10", *c.Retries)
	}
	if c.TrainerQueue != "" && (len(c.TrainerQueue) > maxModelName || strings.ContainsFunc(c.TrainerQueue, func(r rune) bool { return r <= ' ' })) {
		return fmt.Errorf("trainer_queue %q: want a task queue name: at most %d printable characters, no spaces", c.TrainerQueue, maxModelName)
	}
	for name, v := range map[string]string{"base_model": c.BaseModel, "tokenizer": c.Tokenizer} {
		if len(v) > maxModelRef || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' }) {
			return fmt.Errorf("%s %q: want a model hub id or a path, at most %d printable characters", name, v, maxModelRef)
		}
	}
	if c.Trainer != nil {
		if c.TrainerQueue != "" {
			return fmt.Errorf("trainer_queue %q: set trainer.queue instead when trainer is set", c.TrainerQueue)
		}
		if err := c.Trainer.WithDefaults(c.BaseModel).Validate(); err != nil {
			return err
		}
	}
	if c.Evolution != nil {
		if err := c.Evolution.Validate(); err != nil {
			return err
		}
	}
	if _, err := DefaultReleasePolicy().WithGates(c.Gates); err != nil {
		return err
	}
	if c.WeightSync != nil {
		return c.WeightSync.Validate()
	}
	return nil
}

// Parse decodes and validates the deployments.config of an upstream
// deployment; unknown fields are an error, so a typo does not pass
// silently.
func Parse(raw json.RawMessage) (Settings, error) {
	var c Settings
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Settings{}, fmt.Errorf("deployment settings: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Settings{}, fmt.Errorf("deployment settings: %w", err)
	}
	return c, nil
}

// Primary is the server's name for deployment name's model.
func (c Settings) Primary(name string) string {
	if c.Model == "" {
		return name
	}
	return c.Model
}
