package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/tinker"
)

// fetch downloads the version's sampler weights and writes them, with
// meta, as the version's directory: all of it appears at once.
func (s *tinkerStep) fetch(ctx context.Context, meta *tinkerMeta) error {
	tmp, err := s.download(ctx, meta.Sampler)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	return s.install(tmp, meta)
}

// download unpacks the sampler weights at the tinker:// path sampler into
// a new directory beside the version's; the caller removes it.
func (s *tinkerStep) download(ctx context.Context, sampler string) (string, error) {
	if err := os.MkdirAll(s.in.Output.Dir, 0o755); err != nil {
		return "", fmt.Errorf("tinker train batch: checkpoint dir: %w", err)
	}
	p, err := tinker.ParsePath(sampler)
	if err != nil {
		return "", &tinker.APIError{Op: tinker.PathSaveWeightsForSampler, Detail: err.Error()}
	}
	tmp, err := os.MkdirTemp(s.in.Output.Dir, "."+s.name+".download-*")
	if err != nil {
		return "", fmt.Errorf("tinker train batch: %w", err)
	}
	if err := s.c.DownloadSampler(ctx, p.Model, p.Name, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return tmp, nil
}

// install makes the downloaded sampler weights in tmp, with meta, the
// version's directory.
func (s *tinkerStep) install(tmp string, meta *tinkerMeta) error {
	var err error
	if meta.Format, err = samplerFormat(tmp); err != nil {
		return &tinker.APIError{Op: tinker.PathTrainingRuns, Detail: "sampler archive of " + meta.Sampler + ": " + err.Error()}
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	// The version's directory is its only lasting copy (the service's
	// sampler copy is deleted): its files (the unpacked ones synced by
	// Untar), their names and its rename are synced before the step
	// answers.
	if err := writeFileSynced(filepath.Join(tmp, tinkerMetaFile), b); err != nil {
		return fmt.Errorf("tinker train batch: %w", err)
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("tinker train batch: %w", err)
	}
	// A directory already there is a leftover of this run (a version is
	// reserved for one run): the fetched one replaces it.
	_ = os.RemoveAll(s.outDir)
	if err := os.Rename(tmp, s.outDir); err != nil {
		return fmt.Errorf("tinker train batch: %w", err)
	}
	if err := syncDir(s.in.Output.Dir); err != nil {
		return fmt.Errorf("tinker train batch: %w", err)
	}
	_ = os.Remove(s.recordPath())
	return nil
}

// samplerFormat names what a sampler archive holds: a PEFT LoRA adapter,
// or full weights in one safetensors file (the embedded trainer's
// extension), both of which a server loads from the directory.
func samplerFormat(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "adapter_config.json")); err == nil {
		if _, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors")); err != nil {
			return "", errors.New("adapter_config.json without adapter_model.safetensors")
		}
		return flow.CheckpointPEFTLoRA, nil
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors")); len(files) == 0 {
		return "", errors.New("neither a PEFT adapter nor a .safetensors file")
	}
	return flow.CheckpointSafetensors, nil
}

// fetchSaved finishes a step an earlier attempt trained and saved on
// model: it fetches the version instead of training it again.
func (s *tinkerStep) fetchSaved(ctx context.Context, model string) (tinkerMeta, error) {
	if err := s.readSamples(ctx); err != nil {
		return tinkerMeta{}, err
	}
	cps, err := s.c.Checkpoints(ctx, model)
	if err != nil {
		return tinkerMeta{}, err
	}
	meta := tinkerMeta{Service: s.cfg.URL, Model: model, Deployment: s.in.Deployment, RunID: s.in.RunID, Parent: s.in.Base.Version,
		Samples: len(s.samples)}
	for _, c := range cps {
		if c.CheckpointID != s.name {
			continue
		}
		switch c.CheckpointType {
		case tinker.CheckpointTraining:
			meta.State = tinker.Path{Model: model, Kind: tinker.KindWeights, Name: c.CheckpointID}.String()
		case tinker.CheckpointSampler:
			meta.Sampler = tinker.Path{Model: model, Name: c.CheckpointID}.String()
		}
	}
	if meta.State == "" || meta.Sampler == "" {
		return tinkerMeta{}, fmt.Errorf("model %s holds no saved %s", model, s.name)
	}
	if err := s.fetch(ctx, &meta); err != nil {
		return tinkerMeta{}, err
	}
	s.log.Info("tinker step resumed: the version was saved before the worker died", "deployment", s.in.Deployment,
		"run_id", s.in.RunID, "version", s.in.Output.Version, "model", model)
	return meta, nil
}

// answer is the protocol's answer for the version in s.outDir.
func (s *tinkerStep) answer(meta tinkerMeta, resumed bool) flow.TrainBatchOutput {
	return flow.TrainBatchOutput{
		Version:    s.in.Output.Version,
		Checkpoint: flow.CheckpointRef{Version: s.in.Output.Version, URI: fileURI(s.outDir), Format: meta.Format},
		Loss:       meta.Loss, Samples: meta.Samples, TrainedTokens: meta.Tokens, Resumed: resumed,
		IcePopMasked: frac(int(meta.Metrics["icepop_masked_tokens"]), meta.Tokens), KPopMasked: frac(int(meta.Metrics["kpop_masked_tokens"]), meta.Tokens),
		Metrics: meta.Metrics,
	}
}

// readTinkerMeta reads the tinker.json of a version's directory.
func readTinkerMeta(path string) (tinkerMeta, bool) {
	b, err := os.ReadFile(filepath.Join(path, tinkerMetaFile))
	if err != nil {
		return tinkerMeta{}, false
	}
	var m tinkerMeta
	if json.Unmarshal(b, &m) != nil || m.State == "" {
		return tinkerMeta{}, false
	}
	return m, true
}

func (s *tinkerStep) recordPath() string {
	return filepath.Join(s.in.Output.Dir, "."+s.name+".tinker-step.json")
}

// writeRecord notes the model this attempt trained, once its updates have
// all answered.
func (s *tinkerStep) writeRecord(model string) error {
	if err := os.MkdirAll(s.in.Output.Dir, 0o755); err != nil {
		return fmt.Errorf("tinker train batch: checkpoint dir: %w", err)
	}
	b, _ := json.Marshal(stepRecord{RunID: s.in.RunID, Service: s.cfg.URL, Model: model, Trained: true})
	tmp := s.recordPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("tinker train batch: %w", err)
	}
	return os.Rename(tmp, s.recordPath())
}

func (s *tinkerStep) readRecord() (stepRecord, bool) {
	b, err := os.ReadFile(s.recordPath())
	if err != nil {
		return stepRecord{}, false
	}
	var r stepRecord
	return r, json.Unmarshal(b, &r) == nil && r.Model != ""
}

// activityError makes a refusal that will not change final (naming the
// request and the answer) and leaves the rest to Temporal's retries.
func (s *tinkerStep) activityError(err error) error {
	var api *tinker.APIError
	var app *temporal.ApplicationError
	switch {
	case errors.As(err, &app):
		return err
	case errors.As(err, &api) && !api.Retryable:
		return temporal.NewNonRetryableApplicationError("tinker train batch: "+err.Error(), "TinkerRejected", err)
	}
	if !strings.HasPrefix(err.Error(), "tinker") {
		err = fmt.Errorf("tinker train batch: %w", err)
	}
	return err
}

func (t *TinkerTraining) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}

// frac is n/of, 0 when of is 0.
func frac(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
