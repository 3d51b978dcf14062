package tinker

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
)

// Routes, under the service's base URL.
const (
	PathHealthz               = "/api/v1/healthz"
	PathCapabilities          = "/api/v1/get_server_capabilities"
	PathCreateSession         = "/api/v1/create_session"
	PathSessionHeartbeat      = "/api/v1/session_heartbeat"
	PathCreateModel           = "/api/v1/create_model"
	PathUnloadModel           = "/api/v1/unload_model"
	PathForward               = "/api/v1/forward"
	PathForwardBackward       = "/api/v1/forward_backward"
	PathOptimStep             = "/api/v1/optim_step"
	PathSaveWeights           = "/api/v1/save_weights"
	PathLoadWeights           = "/api/v1/load_weights"
	PathSaveWeightsForSampler = "/api/v1/save_weights_for_sampler"
	PathRetrieveFuture        = "/api/v1/retrieve_future"
	// PathTrainingRuns + "/{model_id}/checkpoints" lists a model's
	// checkpoints; + "/{model_id}/checkpoints/{checkpoint_id}/archive"
	// redirects to a sampler checkpoint's tar.gz.
	PathTrainingRuns = "/api/v1/training_runs"
)

// Loss functions every server of the API implements.
const (
	LossCrossEntropy       = "cross_entropy"
	LossImportanceSampling = "importance_sampling"
	LossPPO                = "ppo"
)

// Keys of a datum's loss_fn_inputs and of a loss_fn_outputs entry.
const (
	InputTargetTokens = "target_tokens"
	InputWeights      = "weights"
	InputLogprobs     = "logprobs"
	InputAdvantages   = "advantages"
	OutputLogprobs    = "logprobs"
	OutputLoss        = "elementwise_loss"
	// MetricLossSum is the summed loss in a forward_backward answer's
	// metrics (Tinker's name; SkyRL tx leaves metrics empty, so a client
	// sums elementwise_loss instead).
	MetricLossSum = "loss:sum"
	// ClipLow and ClipHigh are the ppo loss's ratio bounds, keys of
	// loss_fn_config.
	ClipLow  = "clip_low_threshold"
	ClipHigh = "clip_high_threshold"
)

// CreateSessionRequest opens a session, which the models it creates
// belong to.
type CreateSessionRequest struct {
	Tags         []string       `json:"tags"`
	UserMetadata map[string]any `json:"user_metadata,omitempty"`
	SDKVersion   string         `json:"sdk_version"`
	Type         string         `json:"type"` // "create_session"
}

// CreateSessionResponse names the session.
type CreateSessionResponse struct {
	Type      string `json:"type,omitempty"`
	SessionID string `json:"session_id"`
}

// LoraConfig is a model's adapter. Rank 0 is Flywheel's extension: full
// weights (a server of LoRA only refuses it).
type LoraConfig struct {
	Rank int `json:"rank"`
	// Seed initialises the adapter (nil: the server picks one).
	Seed *int64 `json:"seed,omitempty"`
	// Which layers carry an adapter; nil leaves the server's default
	// (Tinker: attention and MLP on, unembedding off).
	TrainAttn    *bool `json:"train_attn,omitempty"`
	TrainMLP     *bool `json:"train_mlp,omitempty"`
	TrainUnembed *bool `json:"train_unembed,omitempty"`
}

// CreateModelRequest creates a trainable model from a base model.
type CreateModelRequest struct {
	SessionID  string     `json:"session_id"`
	BaseModel  string     `json:"base_model"`
	LoraConfig LoraConfig `json:"lora_config"`
	ModelRole  string     `json:"model_role,omitempty"`
}

// CreateModelResponse names the model; RequestID is the future of its
// creation.
type CreateModelResponse struct {
	ModelID    string      `json:"model_id"`
	BaseModel  string      `json:"base_model"`
	LoraConfig *LoraConfig `json:"lora_config,omitempty"`
	Status     string      `json:"status,omitempty"`
	RequestID  string      `json:"request_id"`
}

// UnloadModelRequest frees a model.
type UnloadModelRequest struct {
	ModelID string `json:"model_id"`
}

// UnloadModelResponse names the unload's future.
type UnloadModelResponse struct {
	RequestID string `json:"request_id"`
	ModelID   string `json:"model_id"`
}

// FutureResponse answers every asynchronous request.
type FutureResponse struct {
	FutureID  string `json:"future_id,omitempty"`
	Status    string `json:"status,omitempty"`
	RequestID string `json:"request_id"`
}

// RetrieveFutureRequest asks for a request's result.
type RetrieveFutureRequest struct {
	RequestID string `json:"request_id"`
}

// TryAgain is a 200 answer of retrieve_future that means "not done yet".
type TryAgain struct {
	Type       string `json:"type"` // "try_again"
	RequestID  string `json:"request_id,omitempty"`
	QueueState string `json:"queue_state,omitempty"`
}

// TypeTryAgain is TryAgain's type.
const TypeTryAgain = "try_again"

// RequestError is a 200 answer of retrieve_future for a request that
// failed (Tinker's shape; SkyRL tx answers 400 with a detail instead).
// Category "user" will fail the same way again; "server" may not.
type RequestError struct {
	Error    string `json:"error"`
	Category string `json:"category,omitempty"`
}

// TensorData is one named tensor, flattened. Integers (token ids) travel
// as JSON integers in the same list.
type TensorData struct {
	Data  []float64 `json:"data"`
	DType string    `json:"dtype,omitempty"` // "int64" or "float32"
	Shape []int     `json:"shape,omitempty"`
}

// MarshalJSON writes integer tensors as integers and float32 tensors at
// float32 precision: the shortest decimal that reads back the same
// float32, about half the text of a float64's, which is most of what a
// train step sends and receives.
func (t TensorData) MarshalJSON() ([]byte, error) {
	buf := make([]byte, 0, 16+8*len(t.Data))
	buf = append(buf, `{"data":[`...)
	for i, v := range t.Data {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("tensor data: element %d is %v, not a JSON number", i, v)
		}
		if i > 0 {
			buf = append(buf, ',')
		}
		switch {
		case t.DType == "int64" && v == math.Trunc(v) && math.Abs(v) < 1<<53:
			buf = strconv.AppendInt(buf, int64(v), 10)
		case t.DType == "float32":
			buf = strconv.AppendFloat(buf, v, 'g', -1, 32)
		default:
			buf = strconv.AppendFloat(buf, v, 'g', -1, 64)
		}
	}
	buf = append(buf, ']')
	if t.DType != "" {
		buf = append(buf, `,"dtype":`...)
		buf = strconv.AppendQuote(buf, t.DType)
	}
	if t.Shape != nil {
		buf = append(buf, `,"shape":[`...)
		for i, n := range t.Shape {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendInt(buf, int64(n), 10)
		}
		buf = append(buf, ']')
	}
	return append(buf, '}'), nil
}

// Ints is a token-id tensor.
func Ints(ids []int) TensorData {
	d := make([]float64, len(ids))
	for i, v := range ids {
		d[i] = float64(v)
	}
	return TensorData{Data: d, DType: "int64", Shape: []int{len(ids)}}
}

// Floats is a float tensor.
func Floats(x []float64) TensorData {
	return TensorData{Data: x, DType: "float32", Shape: []int{len(x)}}
}

// Chunk is one piece of a model input; only encoded text is used here.
type Chunk struct {
	Type   string `json:"type"` // "encoded_text"
	Tokens []int  `json:"tokens"`
}

// ChunkEncodedText is the type of a chunk of token ids.
const ChunkEncodedText = "encoded_text"

// ModelInput is a sequence of chunks.
type ModelInput struct {
	Chunks []Chunk `json:"chunks"`
}

// Tokens concatenates the input's token ids; a chunk of another kind is
// an error (this trainer reads text only).
func (m ModelInput) Tokens() ([]int, error) {
	var ids []int
	for i, c := range m.Chunks {
		if c.Type != "" && c.Type != ChunkEncodedText {
			return nil, fmt.Errorf("chunk %d is %q; only %q is supported", i, c.Type, ChunkEncodedText)
		}
		ids = append(ids, c.Tokens...)
	}
	return ids, nil
}

// Text is a model input of one chunk of token ids.
func Text(ids []int) ModelInput {
	return ModelInput{Chunks: []Chunk{{Type: ChunkEncodedText, Tokens: ids}}}
}

// Datum is one training example: the input tokens and, per position, the
// loss's inputs (target_tokens is the next token at each position).
type Datum struct {
	ModelInput   ModelInput            `json:"model_input"`
	LossFnInputs map[string]TensorData `json:"loss_fn_inputs"`
}

// ForwardBackwardInput is a batch of datums and the loss to take over it.
type ForwardBackwardInput struct {
	Data         []Datum            `json:"data"`
	LossFn       string             `json:"loss_fn"`
	LossFnConfig map[string]float64 `json:"loss_fn_config,omitempty"`
}

// ForwardBackwardRequest accumulates the loss's gradient on a model.
type ForwardBackwardRequest struct {
	ModelID              string               `json:"model_id"`
	ForwardBackwardInput ForwardBackwardInput `json:"forward_backward_input"`
	SeqID                *int64               `json:"seq_id,omitempty"`
}

// ForwardRequest computes the loss and log-probs without a gradient.
type ForwardRequest struct {
	ModelID      string               `json:"model_id"`
	ForwardInput ForwardBackwardInput `json:"forward_input"`
	SeqID        *int64               `json:"seq_id,omitempty"`
}

// ForwardBackwardOutput is the result of forward and forward_backward:
// one entry per datum (logprobs and elementwise_loss per position).
type ForwardBackwardOutput struct {
	LossFnOutputType string                  `json:"loss_fn_output_type"`
	LossFnOutputs    []map[string]TensorData `json:"loss_fn_outputs"`
	Metrics          map[string]float64      `json:"metrics"`
}

// AdamParams are one optimizer step's settings.
type AdamParams struct {
	LearningRate float64 `json:"learning_rate"`
	Beta1        float64 `json:"beta1"`
	Beta2        float64 `json:"beta2"`
	Eps          float64 `json:"eps"`
	WeightDecay  float64 `json:"weight_decay"`
	// GradClipNorm bounds the global gradient norm (0: none), as
	// Tinker's SDK sends it; SkyRL tx ignores it.
	GradClipNorm float64 `json:"grad_clip_norm,omitempty"`
}

// OptimStepRequest applies the accumulated gradient.
type OptimStepRequest struct {
	ModelID    string     `json:"model_id"`
	AdamParams AdamParams `json:"adam_params"`
	SeqID      *int64     `json:"seq_id,omitempty"`
}

// OptimStepResponse is optim_step's result.
type OptimStepResponse struct {
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// SaveWeightsRequest saves the model's training state (weights and
// optimizer) as checkpoint Path, a name of [A-Za-z0-9_-].
type SaveWeightsRequest struct {
	ModelID string `json:"model_id"`
	Path    string `json:"path"`
	SeqID   *int64 `json:"seq_id,omitempty"`
}

// SaveWeightsResponse gives the state's tinker:// path.
type SaveWeightsResponse struct {
	Path string `json:"path"`
	Type string `json:"type,omitempty"`
}

// LoadWeightsRequest loads a saved training state into a new model (a
// model's first request): Path is tinker://<model>/weights/<name>.
type LoadWeightsRequest struct {
	ModelID   string `json:"model_id"`
	Path      string `json:"path"`
	Optimizer bool   `json:"optimizer"`
	SeqID     *int64 `json:"seq_id,omitempty"`
}

// LoadWeightsResponse is load_weights' result.
type LoadWeightsResponse struct {
	Type string `json:"type,omitempty"`
}

// SaveWeightsForSamplerRequest saves the weights a server samples from
// (an adapter, for LoRA) as checkpoint Path.
type SaveWeightsForSamplerRequest struct {
	ModelID string `json:"model_id"`
	Path    string `json:"path"`
	SeqID   *int64 `json:"seq_id,omitempty"`
}

// SaveWeightsForSamplerResponse gives the sampler checkpoint's path,
// tinker://<model>/<name> (or .../sampler_weights/<name>).
type SaveWeightsForSamplerResponse struct {
	Path string `json:"path"`
	Type string `json:"type,omitempty"`
}

// Checkpoint is one entry of a model's checkpoint list.
type Checkpoint struct {
	CheckpointID   string `json:"checkpoint_id"`
	CheckpointType string `json:"checkpoint_type"` // "training" or "sampler"
	TinkerPath     string `json:"tinker_path"`
}

// ListCheckpointsResponse lists a model's finished checkpoints.
type ListCheckpointsResponse struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// Checkpoint types.
const (
	CheckpointTraining = "training"
	CheckpointSampler  = "sampler"
)

// Capabilities lists the base models a server trains.
type Capabilities struct {
	SupportedModels []struct {
		ModelName string `json:"model_name"`
	} `json:"supported_models"`
}

// Path is a parsed tinker://<model>/<kind>/<name> (kind may be empty).
type Path struct {
	Model, Kind, Name string
}

// ParsePath parses a tinker:// path.
func ParsePath(s string) (Path, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "tinker" || u.Host == "" {
		return Path{}, fmt.Errorf("%q is not a tinker://<model>/... path", s)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return Path{Model: u.Host, Name: parts[0]}, nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return Path{Model: u.Host, Kind: parts[0], Name: parts[1]}, nil
	}
	return Path{}, fmt.Errorf("%q is not tinker://<model>/[<kind>/]<name>", s)
}

func (p Path) String() string {
	if p.Kind == "" {
		return "tinker://" + p.Model + "/" + p.Name
	}
	return "tinker://" + p.Model + "/" + p.Kind + "/" + p.Name
}

// Kinds of a tinker:// path.
const (
	KindWeights        = "weights"
	KindSamplerWeights = "sampler_weights"
)

// errorDetail is a FastAPI error body: {"detail": "..."} or, for a
// validation error (422), {"detail": [{"loc": [...], "msg": "..."}]}.
type errorDetail struct {
	Detail json.RawMessage `json:"detail"`
}

// detailText renders an error body for a message.
func detailText(body []byte) string {
	var e errorDetail
	if Unmarshal(body, &e) == nil && len(e.Detail) > 0 {
		var s string
		if Unmarshal(e.Detail, &s) == nil {
			return s
		}
		var items []struct {
			Loc []any  `json:"loc"`
			Msg string `json:"msg"`
		}
		if Unmarshal(e.Detail, &items) == nil && len(items) > 0 {
			var b strings.Builder
			for i, it := range items {
				if i > 0 {
					b.WriteString("; ")
				}
				fmt.Fprintf(&b, "%v: %s", it.Loc, it.Msg)
			}
			return b.String()
		}
		return string(e.Detail)
	}
	var re RequestError
	if Unmarshal(body, &re) == nil && re.Error != "" {
		return re.Error
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
