package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// injected is what a fault left for runFault: when it ended (the service
// back, the process restarted) and, for the faults with a scenario of
// their own, the run to settle.
type injected struct {
	end     time.Time
	killed  *trainerKill
	rollout *sweRun
	swap    *swapRun
}

// inject brings fault about under the running load ld and ends it. The
// scenarios that wait for their moment stop the load when they fail.
func inject(ctx context.Context, cfg Config, st *stack, fault string, ld *load, f *Figures) (injected, error) {
	var in injected
	var err error
	switch fault {
	case GatewayKill:
		if err := st.up.kill(); err != nil {
			return in, err
		}
		in.end = time.Now()
		if err := st.startUp(ctx); err != nil {
			return in, err
		}
	case PostgresStop:
		if in.end, err = stopPostgres(ctx, cfg, st, f); err != nil {
			return in, err
		}
	case TemporalKill:
		if err := st.temporal.kill(); err != nil {
			return in, err
		}
		sleep(ctx, cfg.Outage)
		if err := st.startTemporal(ctx); err != nil {
			return in, err
		}
		in.end = time.Now()
	case TrainerKill:
		if in.killed, err = killTrainerInStep(ctx, st, 3*time.Minute); err != nil {
			ld.stop()
			return in, err
		}
		in.end = in.killed.restarted
	case SWEKill:
		// The first rollout builds the task's image.
		if in.rollout, err = sweKill(ctx, st, 5*time.Minute); err != nil {
			ld.stop()
			return in, err
		}
		in.end = in.rollout.restarted
	case ModelServerKill:
		if in.swap, err = killModelServerInSwap(ctx, st, 3*time.Minute); err != nil {
			ld.stop()
			return in, err
		}
		in.end = in.swap.restarted
	default:
		return in, fmt.Errorf("unknown fault (want one of %s)", strings.Join(All, ", "))
	}
	return in, nil
}

// stopPostgres stops Postgres as a crash would, watches /readyz for the
// outage, and starts it again; it returns when Postgres is back.
func stopPostgres(ctx context.Context, cfg Config, st *stack, f *Figures) (time.Time, error) {
	if err := st.pgCrash(); err != nil {
		return time.Time{}, err
	}
	until := time.Now().Add(cfg.Outage)
	for time.Now().Before(until) {
		if resp, err := http.Get("http://" + st.gatewayAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				f.NotReadySeen = true
			}
		}
		sleep(ctx, 200*time.Millisecond)
	}
	if err := st.pgStart(); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}
