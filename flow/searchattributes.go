package flow

import (
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
)

// Custom search attributes, registered by `flywheel temporal setup` (which
// scripts/services.sh runs when the dev server starts) so that users can
// filter workflows in the Temporal UI and CLI, e.g.
// `temporal workflow list --query "FlywheelTenant='acme'"`.
var (
	SessionIDKey    = temporal.NewSearchAttributeKeyKeyword("FlywheelSessionId")
	TenantKey       = temporal.NewSearchAttributeKeyKeyword("FlywheelTenant")
	DeploymentKey   = temporal.NewSearchAttributeKeyKeyword("FlywheelDeployment")
	ModelVersionKey = temporal.NewSearchAttributeKeyKeyword("FlywheelModelVersion")
	RewardKey       = temporal.NewSearchAttributeKeyFloat64("FlywheelReward")
	DecisionKey     = temporal.NewSearchAttributeKeyKeyword("FlywheelDecision")
	GateKey         = temporal.NewSearchAttributeKeyKeyword("FlywheelGate")
)

// SearchAttributes lists every custom search attribute with its type.
func SearchAttributes() map[string]enumspb.IndexedValueType {
	return map[string]enumspb.IndexedValueType{
		SessionIDKey.GetName():    enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		TenantKey.GetName():       enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		DeploymentKey.GetName():   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		ModelVersionKey.GetName(): enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		RewardKey.GetName():       enumspb.INDEXED_VALUE_TYPE_DOUBLE,
		DecisionKey.GetName():     enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		GateKey.GetName():         enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
}

// Task queues. The control plane's workflows and light activities run on
// TaskQueue; agent sessions on SessionTaskQueue, so thousands of open
// sessions never queue ahead of a release or a train step; sandbox
// operations on SandboxTaskQueue (workers next to a Docker engine). A
// train step runs where the deployment's trainer says (deployment.Trainer:
// a Tinker trainer's on deployment.TinkerQueue, which every Flywheel worker
// can serve). TrainerTaskQueue is the default of a deployment that names no
// trainer: the queue a flywheel.train/v1 trainer of its own polls. No
// Flywheel worker serves it, so such a deployment's step fails once
// TrainingPolicy.StepStartTimeout passes, saying that no worker took it.
const (
	TaskQueue        = "flywheel"
	SessionTaskQueue = "flywheel-sessions"
	TrainerTaskQueue = "flywheel-trainer"
	SandboxTaskQueue = "flywheel-sandbox"
)
