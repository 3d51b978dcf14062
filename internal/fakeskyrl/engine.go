package fakeskyrl

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// jobFunc processes one request on its model's worker. p is the model's
// engine state, nil while the model is not loaded (before create_model
// completes, after it failed, after unload); a job may replace it through
// the returned state.
type jobFunc func(p *policy) (result any, next *policy, err error)

type job struct {
	future *future
	run    jobFunc
}

// worker is one model's slice of SkyRL's engine loop: it processes the
// model's requests one at a time, in request_id order.
type worker struct {
	mu   sync.Mutex
	jobs []job
	wake chan struct{}
}

func newWorker() *worker { return &worker{wake: make(chan struct{}, 1)} }

func (w *worker) push(j job) {
	w.mu.Lock()
	w.jobs = append(w.jobs, j)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) pop() (job, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.jobs) == 0 {
		return job{}, false
	}
	j := w.jobs[0]
	w.jobs = w.jobs[1:]
	return j, true
}

// run processes jobs until ctx ends; the policy lives here alone.
func (s *Server) run(ctx context.Context, w *worker) {
	var p *policy
	for {
		j, ok := w.pop()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
			continue
		}
		if d := s.Faults.Delay(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		result, next, err := j.run(p)
		p = next
		s.complete(j.future, result, err)
	}
}

// notLoaded is the engine's error for a request to a model it does not
// hold (_filter_valid_requests for passes, _model_not_found_error for the
// rest).
func notLoaded(modelID string, batched bool) error {
	if batched {
		return fmt.Errorf("Model %s not loaded", modelID)
	}
	return fmt.Errorf("Model %s not loaded (likely stale request from previous server)", modelID)
}

func (s *Server) createModelJob(m *modelRecord, role string) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if role != "policy" {
			return nil, p, fmt.Errorf("JaxBackend only supports model_role='policy', got '%s'", role)
		}
		if m.lora.Rank <= 0 || m.lora.Rank > s.cfg.MaxLoRARank {
			return nil, p, fmt.Errorf("LoRA rank %d must be between 1 and %d", m.lora.Rank, s.cfg.MaxLoRARank)
		}
		out := createModelOutput{ModelID: m.id, BaseModel: s.cfg.BaseModel, LoraConfig: m.lora}
		return out, newPolicy(s.cfg.Vocab, m.lora), nil
	}
}

func (s *Server) unloadModelJob(m *modelRecord) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p != nil {
			s.mu.Lock()
			m.status = "unloaded"
			s.mu.Unlock()
		}
		return unloadModelOutput{ModelID: m.id, Status: "unloaded", Type: typeUnloadModel}, nil, nil
	}
}

func (s *Server) passJob(modelID string, in *passInput, backward bool) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p == nil {
			return nil, p, notLoaded(modelID, true)
		}
		out, err := p.pass(in, backward)
		if err != nil {
			return nil, p, err
		}
		return out, p, nil
	}
}

func (s *Server) optimStepJob(m *modelRecord, params adamParams) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p == nil {
			return nil, p, notLoaded(m.id, false)
		}
		out := p.optimStep(params)
		s.mu.Lock()
		m.optimSteps++
		s.mu.Unlock()
		return out, p, nil
	}
}

func (s *Server) saveWeightsJob(m *modelRecord, ck *checkpoint) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p == nil {
			// As in SkyRL, the checkpoint stays pending.
			return nil, p, notLoaded(m.id, false)
		}
		s.finishCheckpoint(ck, p.weights.clone(), nil)
		return saveWeightsOutput{Path: fmt.Sprintf("tinker://%s/weights/%s", m.id, ck.id), Type: typeSaveWeights}, p, nil
	}
}

func (s *Server) saveWeightsForSamplerJob(m *modelRecord, ck *checkpoint, transient bool, samplingSessionID *string) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p == nil {
			return nil, p, notLoaded(m.id, false)
		}
		archive, err := samplerArchive(s.cfg.BaseModel, p.lora, p.Table)
		if err != nil {
			s.failCheckpoint(ck, err)
			return nil, p, err
		}
		s.finishCheckpoint(ck, weights{}, archive)
		s.mu.Lock()
		s.samplerSaves[ck.id]++
		s.mu.Unlock()
		out := saveWeightsForSamplerOutput{Type: typeSaveWeightsForSampler, SamplingSessionID: samplingSessionID}
		if !transient {
			path := fmt.Sprintf("tinker://%s/%s", m.id, ck.id)
			out.Path = &path
		}
		return out, p, nil
	}
}

func (s *Server) loadWeightsJob(m *modelRecord, source checkpointKey, optimizer bool) jobFunc {
	return func(p *policy) (any, *policy, error) {
		if p == nil {
			return nil, p, notLoaded(m.id, false)
		}
		s.mu.Lock()
		ck, ok := s.checkpoints[source]
		var saved weights
		if ok {
			saved = ck.weights.clone()
		}
		s.mu.Unlock()
		if !ok || saved.Table == nil {
			return nil, p, fmt.Errorf("Training checkpoint not found in %s/%s", source.modelID, source.id)
		}
		if len(saved.Table) != len(p.Table) {
			return nil, p, fmt.Errorf("checkpoint vocabulary %d does not match %d", len(saved.Table), len(p.Table))
		}
		p.Table = saved.Table
		if optimizer {
			p.Mu, p.Nu, p.Steps = saved.Mu, saved.Nu, saved.Steps
		}
		return loadWeightsOutput{Type: typeLoadWeights}, p, nil
	}
}
