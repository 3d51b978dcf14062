package flow

import (
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// The external-trainer protocol, flywheel.train/v1 (docs/trainer-protocol.md).
// A train step is three activities. The control plane writes the claimed
// run as a Parquet batch (PrepareBatch), a trainer worker trains it into a
// checkpoint (TrainBatch, on the deployment's trainer task queue), and the
// control plane records that checkpoint as a candidate version
// (RegisterCheckpoint). TrainBatch is the only one a trainer implements.
// It needs no database, only the files its input names, so a worker in
// any language with a Temporal SDK can take it: verl, TRL, OpenRLHF or the
// Go trainer, which is one implementation of it (activities.Training).
//
// Its input and output are JSON with the field names below, Temporal's
// default payload encoding in every SDK.
const (
	// TrainerProtocol names this protocol in TrainBatchInput.Protocol and
	// in the batch file's metadata.
	TrainerProtocol = parquetbatch.Protocol

	TrainBatchActivity = "TrainBatch"
)

// Checkpoint formats a TrainBatch may answer with.
const (
	// CheckpointFlywheelPolicy is the built-in policy's single-file
	// safetensors checkpoint (trainer.SaveCheckpoint).
	CheckpointFlywheelPolicy = "flywheel-policy-v1"
	// CheckpointSafetensors is a directory of full weights
	// (model*.safetensors and config.json), as vLLM and SGLang load them.
	CheckpointSafetensors = "safetensors"
	// CheckpointPEFTLoRA is a PEFT LoRA adapter directory
	// (adapter_config.json and adapter_model.safetensors), as vLLM's
	// /v1/load_lora_adapter loads it.
	CheckpointPEFTLoRA = "peft_lora"
)

// PrepareBatchInput names the claimed run to write and the weights it
// trains on from.
type PrepareBatchInput struct {
	Deployment string
	RunID      int64
	// Base is the version the step continues from: the newest candidate
	// the loop trained, or the serving version after a reset.
	Base string
	// Algorithm is copied into the TrainBatch input.
	Algorithm TrainAlgorithm
}

// TrainBatchInput is one train step, as a trainer worker receives it.
type TrainBatchInput struct {
	Protocol   string `json:"protocol"`
	Deployment string `json:"deployment"`
	RunID      int64  `json:"run_id"`
	// Batch is the Parquet file of the step's samples, advantages set.
	Batch BatchRef `json:"batch"`
	// Base is the checkpoint to train on from. A trainer that already
	// holds those weights (its previous step's output) may keep them.
	Base CheckpointRef `json:"base"`
	// Output is the version this step produces and where to write it.
	Output OutputRef      `json:"output"`
	Algo   TrainAlgorithm `json:"algorithm"`
	// Trainer is the deployment's Tinker trainer (kind tinker), which the
	// Flywheel worker taking the step drives; nil for a trainer worker of
	// this protocol.
	Trainer *deployment.Trainer `json:"trainer,omitempty"`
	// TaskQueue is the queue the control plane sends the step on, the
	// deployment's trainer's ("": the training policy's).
	TaskQueue string `json:"task_queue,omitempty"`
}

// BatchRef locates a batch file.
type BatchRef struct {
	// URI is file:///absolute/path.parquet on storage the trainer shares.
	URI     string `json:"uri"`
	Format  string `json:"format"` // "parquet"
	Samples int    `json:"samples"`
	// Tokens is the sum of prompt and completion tokens over the samples.
	Tokens int    `json:"tokens"`
	SHA256 string `json:"sha256"`
}

// CheckpointRef is one version's weights.
type CheckpointRef struct {
	Version string `json:"version"`
	// URI is empty for a base the deployment never stored (the trainer's
	// own base model).
	URI    string `json:"uri,omitempty"`
	Format string `json:"format,omitempty"`
	// Model and Tokenizer are the deployment's base model and its
	// tokenizer (a hub id or a path; the deployment's base_model and
	// tokenizer settings), set on a step's base: what a trainer loads when
	// URI is empty, and what every checkpoint of the deployment extends.
	Model     string `json:"model,omitempty"`
	Tokenizer string `json:"tokenizer,omitempty"`
}

// OutputRef says what a step produces: Version, written under Dir (a
// directory the serving engine can read), e.g. Dir/v9/ for an adapter.
type OutputRef struct {
	Version string `json:"version"`
	Dir     string `json:"dir"`
}

// TrainAlgorithm are the step's algorithm settings. Zero values leave the
// trainer's own.
type TrainAlgorithm struct {
	// Objective is "grpo" (decoupled PPO on the batch's advantages) or
	// "sft" (cross-entropy on the loss-masked tokens).
	Objective string  `json:"objective"`
	ClipLow   float64 `json:"clip_low,omitempty"`
	ClipHigh  float64 `json:"clip_high,omitempty"`
	KLCoef    float64 `json:"kl_coef,omitempty"`
	// MaxStaleness is η. The control plane dropped samples staler than
	// that already; a trainer that counts staleness itself uses the same.
	MaxStaleness int                    `json:"max_staleness"`
	Masks        *deployment.TokenMasks `json:"masks,omitempty"`
}

// TrainBatchOutput is what a trainer answers: the checkpoint it wrote.
type TrainBatchOutput struct {
	Version    string        `json:"version"`
	Checkpoint CheckpointRef `json:"checkpoint"`
	Loss       float64       `json:"loss"`
	// Samples is how many samples trained (after any the trainer dropped).
	Samples       int `json:"samples"`
	DroppedStale  int `json:"dropped_stale,omitempty"`
	TrainedTokens int `json:"trained_tokens,omitempty"`
	// IcePopMasked and KPopMasked are the fractions of trained tokens each
	// mask dropped.
	IcePopMasked float64 `json:"icepop_masked,omitempty"`
	KPopMasked   float64 `json:"kpop_masked,omitempty"`
	// Resumed is set when an earlier attempt had written this checkpoint.
	Resumed bool `json:"resumed,omitempty"`
	// Metrics are any further figures, stored with the version.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// RegisterCheckpointInput records a trained checkpoint; its base is the
// one the run was prepared with.
type RegisterCheckpointInput struct {
	Deployment string
	RunID      int64
	Trained    TrainBatchOutput
}

// FailTrainingRunInput closes a failed run.
type FailTrainingRunInput struct {
	RunID  int64
	Reason string
}
