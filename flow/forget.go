package flow

import "fmt"

// ForgetWorkflow names.
const (
	ForgetWorkflowName = "ForgetWorkflow"
)

// ForgetWorkflowID is the workflow that finishes one forget request.
func ForgetWorkflowID(requestID int64) string { return fmt.Sprintf("forget-%d", requestID) }

// ForgetInput names a forget request the gateway recorded (POST /v1/forget
// deletes the data and writes forget_requests).
type ForgetInput struct {
	RequestID int64
}

// ForgetResult says which versions were retired and where each affected
// deployment was rolled back to ("" when no clean version was left).
type ForgetResult struct {
	Sessions    int
	Retired     []string
	Rollbacks   map[string]string
	Checkpoints int
	// Restart maps each deployment that had a retired version to the clean
	// version its TrainingWorkflow was told to go on from.
	Restart map[string]string `json:",omitempty"`
}
