// Package demo runs the demo against Flywheel: a fleet of agents that work
// the demo task (package demotask) through a gateway with an ordinary
// OpenAI client and send their rewards, greedy evaluations through the
// same gateway, and the run's terminal output, success curve and status
// page. Online it is only a client of Flywheel's public HTTP API: it must
// not import the store, the workflows, the activities or the gateway. The
// offline demo reports on the in-process rehearsal (package rehearsal)
// instead.
package demo
