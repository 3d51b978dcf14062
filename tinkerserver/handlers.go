package tinkerserver

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// errClient marks a failed request that is the client's fault (besides
// trainer.ErrInvalidInput): logged as a warning, not an error.
var errClient = errors.New("client error")

func slogLevel(err error) slog.Level {
	if errors.Is(err, trainer.ErrInvalidInput) || errors.Is(err, errClient) {
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (s *Server) forward(c *gin.Context) {
	var req tinker.ForwardRequest
	var data []trainer.TokenDatum
	var loss trainer.Loss
	body, ok := decodeBody(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		data, loss = passInput(ch, req.ForwardInput, "forward_input")
	})
	if ok {
		s.pass(c, req.ModelID, req.SeqID, reqForward, body, data, loss, false)
	}
}

func (s *Server) forwardBackward(c *gin.Context) {
	var req tinker.ForwardBackwardRequest
	var data []trainer.TokenDatum
	var loss trainer.Loss
	body, ok := decodeBody(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		data, loss = passInput(ch, req.ForwardBackwardInput, "forward_backward_input")
	})
	if ok {
		s.pass(c, req.ModelID, req.SeqID, reqForwardBackward, body, data, loss, true)
	}
}

// pass queues a forward (withGrad false) or forward_backward request.
// Deduplication compares the body's digest: a retry of a seq_id sends the
// same bytes (as Tinker's SDK and this project's client do), and encoding
// the tensors again to compare them cost about 5 ms of CPU a train step.
func (s *Server) pass(c *gin.Context, modelID string, seq *int64, kind string, body []byte,
	data []trainer.TokenDatum, loss trainer.Loss, withGrad bool) {
	f := s.submit(c, modelID, seq, kind, sha256.Sum256(body), nil, nil, func(ctx context.Context, m *model) (any, error) {
		l, err := s.trainee(m)
		if err != nil {
			return nil, err
		}
		run := l.Forward
		if withGrad {
			run = l.ForwardBackward
		}
		res, err := run(ctx, data, loss)
		if err != nil {
			return nil, err
		}
		return passOutput(res), nil
	})
	if f != nil {
		answerFuture(c, f)
	}
}

func (s *Server) optimStep(c *gin.Context) {
	var req struct {
		ModelID    string          `json:"model_id"`
		AdamParams json.RawMessage `json:"adam_params"`
		SeqID      *int64          `json:"seq_id"`
	}
	var step trainer.AdamStep
	if !decode(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		var p adamParams
		if len(req.AdamParams) == 0 {
			ch.add("missing", "Field required", "adam_params")
		} else if err := tinker.Unmarshal(req.AdamParams, &p); err != nil {
			ch.add("model_type", "Input should be a valid dictionary: "+err.Error(), "adam_params")
		}
		step = p.step(ch)
	}) {
		return
	}
	f := s.submit(c, req.ModelID, req.SeqID, reqOptimStep, step, nil, nil, func(_ context.Context, m *model) (any, error) {
		l, err := s.trainee(m)
		if err != nil {
			return nil, err
		}
		res, err := l.OptimStep(step)
		if err != nil {
			return nil, err
		}
		return tinker.OptimStepResponse{Metrics: map[string]float64{
			"skyrl.ai/grad_norm":     res.GradNorm,
			"skyrl.ai/learning_rate": res.LR,
			"grad_norm":              res.GradNorm,
			"learning_rate":          res.LR,
			"step":                   float64(res.Step),
		}}, nil
	})
	if f != nil {
		answerFuture(c, f)
	}
}
