package flow

import "github.com/flywheel-ai/flywheel/deployment"

// PrunableStatesInput asks which of a deployment's training states no
// step can start from again; Keep are the versions the loop still holds.
type PrunableStatesInput struct {
	Deployment string   `json:"deployment"`
	Keep       []string `json:"keep,omitempty"`
}

// PrunableStatesOutput lists them, with the deployment's Tinker trainer
// that holds them (nil, and no versions, for another kind of trainer).
type PrunableStatesOutput struct {
	// Versions maps a version to its directory (where tinker.json names
	// its state).
	Versions map[string]string   `json:"versions,omitempty"`
	Trainer  *deployment.Trainer `json:"trainer,omitempty"`
}

// PruneStatesInput deletes the training states of Versions on Trainer's
// service.
type PruneStatesInput struct {
	Deployment string              `json:"deployment"`
	Trainer    *deployment.Trainer `json:"trainer"`
	Versions   map[string]string   `json:"versions"`
}

// PruneStatesOutput names the versions whose states are gone (deleted
// now, or found gone).
type PruneStatesOutput struct {
	Pruned []string `json:"pruned"`
}

// MarkStatesPrunedInput records Versions' states as gone.
type MarkStatesPrunedInput struct {
	Versions []string `json:"versions"`
}
