package activities

// What the external tests that run these activities inside their workflows
// (workflows_test.go) use of the package's own test helpers.
var (
	SeedTenant  = seedTenant
	SeedSession = seedSession
	SeedReward  = seedReward
	TestRules   = testRules
)

type SeedInteraction = seedInteraction
