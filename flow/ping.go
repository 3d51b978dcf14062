package flow

// PingWorkflowName is the health-check workflow's registered name.
const PingWorkflowName = "PingWorkflow"

// PingInput asks a worker to prove it can reach its dependencies.
type PingInput struct {
	// Note is echoed back, so a caller can match answers to requests.
	Note string
}

// PingOutput is what the worker saw.
type PingOutput struct {
	Note string
	// Postgres is the database server version the activity read.
	Postgres string
	// Worker identifies the host and compute (GPU model or "cpu").
	Worker  string
	Compute string
}
