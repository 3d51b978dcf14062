// Package ggraph is the independent autodiff reference for package
// trainer's hand-written forward and backward passes, and the project's only
// user of gorgonia. It builds the transformer of package trainer (learned
// token and position embeddings, pre-norm blocks with RMS norm, fused QKV,
// multi-head attention, GELU(tanh) MLP, final RMS norm, untied output layer)
// as a gorgonia ExprGraph whose weight nodes share Model.W's memory, with the
// step loss (SFT cross-entropy, or decoupled PPO with clipping, IcePop and
// KPop masks and the KL term) differentiated by gorgonia.Grad and run by a
// TapeMachine on the trainer's SGEMM (OpenBLAS under cgo) installed with
// gorgonia.Use / tensor.Use.
//
// Its job is the tests: on random models and packed batches they compare
// the log-probs, the loss and every gradient coordinate of the hand-written
// passes (trainer.Model.ReferenceLoss) with the graph's, so a wrong
// derivative in trainer fails `go test ./trainer/ggraph/`. It is also a
// complete alternative trainer (Trainer implements trainer.Trainer), which
// `flywheel bench ggraph` compares with trainer.Local; nothing in serving or
// training uses it.
//
// A packed batch (trainer.Pack) enters the graph as its unique tokens with
// their depth as position ids. Attention runs per head (column slices of
// the fused QKV weight, row slices of the output projection, so no
// activation is transposed) and batched over blocks, where a block is one
// prefix tree padded with zero rows to the largest tree, or — when padding
// would cost more than the whole square — all nodes as one sequence; an
// additive mask of 0 and −Inf lets each query see exactly its ancestors and
// itself, so the numbers are the hand-written path's.
//
// Finite-difference checks of the building blocks found two gorgonia
// v0.9.18 defects, worked around here: InverseSqrt's symbolic derivative
// divides the incoming gradient by 2y³ where it should multiply by y³/2
// (1/√x is built as Inverse(Sqrt(x))), and ByIndices' backward is wrong on
// vectors (gathers are a small op of this package with a scatter-add
// backward). TestBuildingBlocksAgainstFiniteDifferences checks what the
// graph uses instead.
package ggraph
