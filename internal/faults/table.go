package faults

import (
	"fmt"
	"sort"
	"strings"
)

// Table renders figures as the README's table.
func Table(res *Result) string {
	var b strings.Builder
	b.WriteString("| fault | sent | acknowledged | stored | lost | duplicated | sessions | orphaned | statuses | hung | first 2xx after (s) | every workflow after (s) | goroutines | Postgres conns |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range res.Faults {
		if f.Skipped != "" {
			continue
		}
		codes := make([]string, 0, len(f.Statuses))
		for k := range f.Statuses {
			codes = append(codes, k)
		}
		sort.Strings(codes)
		var st []string
		for _, k := range codes {
			st = append(st, fmt.Sprintf("%s×%d", k, f.Statuses[k]))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %d | %.1f | %.1f | %d → %d | %d → %d |\n",
			f.Fault, f.Sent, f.Acked, f.Stored, f.Lost, f.Duplicated, f.Sessions, f.Orphaned, strings.Join(st, ", "), f.Hung,
			f.RecoveryS, f.WorkflowsS, f.GoroutinesBefore, f.GoroutinesAfter, f.PGConnsBefore, f.PGConnsAfter)
	}
	for _, f := range res.Faults {
		if f.Skipped != "" {
			fmt.Fprintf(&b, "| %s | skipped: %s |\n", f.Fault, f.Skipped)
		}
	}
	var train, swe, swap []string
	for _, f := range res.Faults {
		if t := f.Train; t != nil {
			train = append(train, fmt.Sprintf("| %s | %d, %d | %s | %d / %d / %d | %.1f | %d / %d / %d | %d (%d) | %d | %d: %d / %d |",
				f.Fault, t.KilledSamples, t.KilledAttempt, t.KilledOutcome, t.KilledTrained, t.KilledRequeued, t.KilledLost, t.ResumeS,
				t.RunsTrained, t.RunsFailed, t.RunsStuck, t.Versions, t.DuplicateVersions, t.SamplesTrainedTwice, t.Samples, t.SamplesTrained, t.SamplesQueued))
		}
		if s := f.Swap; s != nil {
			swap = append(swap, fmt.Sprintf("| %s | %s, %s (%s, attempt %d) | %s | %.1f | %s, %t |",
				f.Fault, s.Candidate, s.KilledIn, s.KilledState, s.KilledAttempt, s.Outcome, s.DoneS, s.Serving, s.Served))
		}
		if s := f.SWE; s != nil {
			swe = append(swe, fmt.Sprintf("| %s | %s | %s (%d) | %s | %.1f | %d / %d | %d |",
				f.Fault, s.ControlOutcome, s.KilledIn, s.KilledAttempt, s.Outcome, s.DoneS, s.KilledOwned, s.Leaked, s.LiveOwned))
		}
	}
	subTable(&b, []string{"fault", "killed run: samples, attempt", "its outcome", "its samples trained / queued again / lost",
		"first run trained after restart (s)", "runs trained / failed / stuck", "versions (duplicate)", "samples trained twice",
		"the fault's samples: trained / still queued"}, train)
	subTable(&b, []string{"fault", "a rollout with no fault", "killed in (attempt)", "the killed rollout", "ended after restart (s)",
		"sandboxes of the killed worker: before / left", "of the restarted one"}, swe)
	subTable(&b, []string{"fault", "candidate, killed in (state, attempt)", "the release", "ended after restart (s)",
		"serving, held by the restarted model server"}, swap)
	return b.String()
}

// subTable adds a table of rows under header, after a blank line (none
// without rows).
func subTable(b *strings.Builder, header []string, rows []string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
}
