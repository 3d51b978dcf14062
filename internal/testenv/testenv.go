// Package testenv gives integration tests the real services: a fresh
// Postgres database per test (cloned from a migrated template), a Temporal
// dev server started from the cached CLI, and the Docker engine. Tests find
// the services through the variables `scripts/services.sh env` prints; when
// FLYWHEEL_REQUIRE_SERVICES=1 (as `make test` and CI set it) a missing
// service fails the test instead of skipping it.
package testenv

import (
	"os"
	"testing"
)

// Need skips (or, when services are required, fails) t unless the
// environment variable name is set, and returns its value.
func Need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	msg := name + " is not set: run the tests with `make test` (it starts Postgres, Temporal and Docker images)"
	if os.Getenv("FLYWHEEL_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
