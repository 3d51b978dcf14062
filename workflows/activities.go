package workflows

import "github.com/flywheel-ai/flywheel/activities"

// The activities this package schedules, named by method value so a reader
// (and "go to definition") can follow a workflow into its activity. The
// receivers stay nil: the SDK takes only the method's name from them, and
// the worker registers the real receivers (worker.Registrations).
var (
	aSession   *activities.Session
	aPing      *activities.Ping
	aRelease   *activities.Release
	aTraining  *activities.Training
	aTinker    *activities.TinkerTraining
	aEvolution *activities.Evolution
	aForget    *activities.Forget
	aSWE       *activities.SWEActivities
)
