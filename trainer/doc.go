// Package trainer owns the in-process policy: a small decoder-only
// transformer with a byte-level tokenizer and chat template, its sampler
// (KV cache, per-token logprobs, version stamps), the online GRPO /
// decoupled-PPO losses with KPop and IcePop masking, prefix-tree packing,
// AdamW, safetensors checkpoints and the Engine that serves hot-swappable
// immutable versions through inference.Backend.
//
// It must not know about HTTP or Temporal: Learner trains one model pass by
// pass (what tinkerserver serves behind the Tinker training API, as
// production trains it), Local a whole Batch in one StepResult.
//
// The forward and backward passes are written by hand over float32 SGEMM
// (OpenBLAS through cgo when built with cgo, gonum otherwise) so that one code
// path serves packed trees, plain batches and incremental decoding; the tests
// check every gradient against finite differences.
package trainer
