// Package ggraph is the gorgonia training path of the in-process policy:
// the transformer of package trainer (learned token and position
// embeddings, pre-norm blocks with RMS norm, fused QKV, multi-head
// attention, GELU(tanh) MLP, final RMS norm, untied output layer) as a
// gorgonia ExprGraph whose weight nodes share Model.W's memory, with the
// step loss (SFT cross-entropy, or decoupled PPO with clipping, IcePop and
// KPop masks and the KL term) differentiated by gorgonia.Grad and run by a
// TapeMachine on the trainer's SGEMM (OpenBLAS under cgo) installed with
// gorgonia.Use / tensor.Use.
//
// It serves two purposes. It is the autodiff oracle for the hand-written
// forward and backward passes: the tests compare log-probs, losses and
// every gradient coordinate on random models and packed batches. And it is
// a complete alternative trainer (Trainer implements trainer.Trainer),
// which `flywheel bench ggraph` compares with trainer.Local.
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
