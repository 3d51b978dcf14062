package activities_test

import (
	"time"

	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
)

// newWorkflowEnv is ts's test environment with a deadlock detector that
// tolerates a loaded machine: the SDK's default fails a workflow task that
// runs a second without yielding, which a test machine under load (a
// parallel package, a GC pause) can reach with nothing wrong in the code.
func newWorkflowEnv(ts *testsuite.WorkflowTestSuite) *testsuite.TestWorkflowEnvironment {
	env := ts.NewTestWorkflowEnvironment()
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: 30 * time.Second})
	return env
}
