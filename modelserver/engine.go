package modelserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/trainer"
)

// Engine is what a Server serves over HTTP: generation, tokenization and
// the weights behind adapter names. The Server owns the wire (routes,
// decoding, errors, SSE) and the registry of adapter names; the engine
// owns the model. The policy (New) is the production engine; a test fake
// scripts one.
type Engine interface {
	// Complete and Stream generate. The request's Version is "" for the
	// base or the name of a registered adapter. A failure that is an
	// *inference.Error is answered with its status (and Retry-After).
	inference.Backend
	// PromptTokens are the ids a completion of req conditions on; without
	// generationPrompt, less the start of the assistant's turn.
	PromptTokens(req *inference.Request, generationPrompt bool) ([]int, error)
	// Encode is a plain prompt's ids.
	Encode(text string) []int
	// TokenText is a token's text, as a logprob names it.
	TokenText(id int) string
	// MaxLen is the base model's context (max_model_len).
	MaxLen() int
	// Prepare checks that adapter name can be served from path, reading
	// its weights now so a bad path fails the load, and returns the
	// adapter's context. An *inference.Error is answered with its status.
	Prepare(name, path string) (maxLen int, err error)
	// Loaded records that name now serves the weights at path. It is
	// called under the registry's lock and must not call the Server.
	Loaded(name, path string)
	// Evict drops the weights held for name (after a load or an unload),
	// so the next request naming it reads them again.
	Evict(name string)
}

// policy is the Engine of the in-process policy: a trainer.Engine whose
// adapters are whole checkpoints, each named <Name>@v<N>, N its version.
type policy struct {
	name        string
	engine      *trainer.Engine
	base        *trainer.Model // read only: the engine owns it
	baseVersion int64

	// mu guards lastPath. The engine calls loadVersion while it holds its
	// own lock, so nothing calls the engine while holding mu.
	mu sync.RWMutex
	// lastPath is the latest path each name was loaded from. It outlives
	// an unload, so a request admitted just before the unload still finds
	// its weights when the engine has to read them.
	lastPath map[string]string
}

func newPolicy(base *trainer.Model, baseVersion int64, cfg Config) (*policy, error) {
	p := &policy{name: cfg.Name, base: base, baseVersion: baseVersion, lastPath: map[string]string{}}
	engine, err := trainer.NewEngine(base, baseVersion, trainer.EngineConfig{
		Name:             cfg.Name,
		DefaultMaxTokens: cfg.DefaultMaxTokens,
		// The engine's versions include the base, which it never evicts.
		KeepVersions: cfg.KeepLoaded + 1,
		Loader:       p.loadVersion,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	p.engine = engine
	return p, nil
}

// generationPrompt is what trainer.RenderPrompt appends after the
// messages: the start of the assistant's turn.
var generationPrompt = append([]int{trainer.TokImStart}, trainer.Tokenizer{}.Encode(inference.RoleAssistant+"\n")...)

func (p *policy) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	return p.engine.Complete(ctx, req)
}

func (p *policy) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	return p.engine.Stream(ctx, req, emit)
}

func (p *policy) PromptTokens(req *inference.Request, withGenerationPrompt bool) ([]int, error) {
	ids, err := trainer.RenderPrompt(req.Messages, req.Tools, req.ToolChoice, req.PromptTokenIDs)
	if err != nil {
		return nil, err
	}
	if !withGenerationPrompt {
		ids = ids[:len(ids)-len(generationPrompt)]
	}
	return ids, nil
}

func (p *policy) Encode(text string) []int { return trainer.Tokenizer{}.Encode(text) }

func (p *policy) TokenText(id int) string { return trainer.TokenText(id) }

func (p *policy) MaxLen() int { return p.base.Config.Context }

// Prepare checks name and reads the checkpoint at path: the name must be
// "<Name>@v<N>" and the checkpoint must hold version N.
func (p *policy) Prepare(name, path string) (int, error) {
	version, ok := p.adapterVersion(name)
	if !ok {
		return 0, &inference.Error{Status: http.StatusBadRequest, Message: fmt.Sprintf(
			"Loading lora %s failed: an adapter is named %s@v<N>, N its checkpoint's version", name, p.name)}
	}
	m, err := p.read(path, version)
	var wrong *wrongVersion
	switch {
	case errors.As(err, &wrong):
		return 0, &inference.Error{Status: http.StatusBadRequest, Message: fmt.Sprintf("Loading lora %s failed: %v", name, err)}
	case err != nil:
		return 0, &inference.Error{Status: http.StatusNotFound, Message: fmt.Sprintf(
			"Loading lora %s failed: No adapter found for %s: %v", name, path, err)}
	}
	// The engine answers the base's version with the base: an adapter of
	// that version must be the same weights, as it is when versions are
	// immutable, or requests for it would get the wrong ones.
	if version == p.baseVersion && (m.Config != p.base.Config || !slices.Equal(m.W, p.base.W)) {
		return 0, &inference.Error{Status: http.StatusBadRequest, Message: fmt.Sprintf(
			"Loading lora %s failed: version %d is the base model's, and the checkpoint at %s holds other weights", name, version, path)}
	}
	return m.Config.Context, nil
}

func (p *policy) Loaded(name, path string) {
	p.mu.Lock()
	p.lastPath[name] = path
	p.mu.Unlock()
}

func (p *policy) Evict(name string) {
	if version, ok := p.adapterVersion(name); ok {
		p.engine.Evict(version)
	}
}

// adapterVersion reads N from "<Name>@v<N>", written canonically (the
// engine names a version by its decimal form, so "v01" would never match).
func (p *policy) adapterVersion(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, p.name+"@v")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	return v, err == nil && v >= 0 && strconv.FormatInt(v, 10) == digits
}

// loadVersion is the engine's Loader: it reads the checkpoint of
// <Name>@v<version> from the path it was last loaded from.
func (p *policy) loadVersion(version int64) (*trainer.Model, error) {
	name := p.name + "@v" + strconv.FormatInt(version, 10)
	p.mu.RLock()
	path, ok := p.lastPath[name]
	p.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("adapter %s was never loaded", name)
	}
	return p.read(path, version)
}

// read reads version's weights at path: a checkpoint file of the
// policy, which must hold that version, or a directory a trainer of the
// Tinker API wrote (a PEFT LoRA adapter of the base, or full weights),
// which the version's name alone identifies.
func (p *policy) read(path string, version int64) (*trainer.Model, error) {
	m, stored, err := trainer.LoadWeights(p.base, path)
	if err != nil {
		return nil, err
	}
	if stored >= 0 && stored != version {
		return nil, &wrongVersion{path: path, stored: stored, want: version}
	}
	return m, nil
}

// wrongVersion is a checkpoint file that holds another version.
type wrongVersion struct {
	path         string
	stored, want int64
}

func (e *wrongVersion) Error() string {
	return fmt.Sprintf("the checkpoint at %s holds version %d, not %d", e.path, e.stored, e.want)
}
