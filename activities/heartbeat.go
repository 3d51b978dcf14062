package activities

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
)

// defaultHeartbeatEvery is how often a long activity heartbeats when
// nothing shorter is asked for.
const defaultHeartbeatEvery = 10 * time.Second

// heartbeatInterval is how often an activity with heartbeat timeout
// timeout heartbeats when configured to every (0: the default): never
// slower than a third of the timeout, so a live worker is not taken for a
// dead one and its activity retried elsewhere (a step's 5 s heartbeat
// timeout against 10 s beats killed every step longer than 5 s).
func heartbeatInterval(every, timeout time.Duration) time.Duration {
	if every <= 0 {
		every = defaultHeartbeatEvery
	}
	if timeout > 0 {
		every = min(every, max(timeout/3, time.Millisecond))
	}
	return every
}

// heartbeatWhile heartbeats detail() at once and then every
// heartbeatInterval until the returned stop is called, so a long build,
// agent run, test run or train step is not mistaken for a dead worker.
// When ctx ends (the worker is stopping) the heartbeats stop, so the
// server hands the activity to another worker even if this one never
// returns. Outside an activity it does nothing.
func heartbeatWhile(ctx context.Context, every time.Duration, detail func() any) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	every = heartbeatInterval(every, activity.GetInfo(ctx).HeartbeatTimeout)
	activity.RecordHeartbeat(ctx, detail())
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx, detail())
			}
		}
	}()
	return func() { close(done) }
}
