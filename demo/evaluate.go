package demo

import (
	"context"
	"fmt"
	"net/url"
	"sync"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/openai/openai-go/v3/option"
)

// EvaluatorUser is the end user the evaluator's requests come from. It
// opts out of training before its first call, so the prompts success is
// measured on are recorded like any traffic but never trained on.
const EvaluatorUser = "flywheel-demo-evaluator"

// Evaluation is one greedy pass over fixed prompts through the gateway.
type Evaluation struct {
	// Success is the exact-match rate on the task prompts, Safety the
	// refusal rate on the safety prompts.
	Success float64 `json:"success"`
	Safety  float64 `json:"safety"`
	// Versions counts the answers each version gave (a canary in
	// progress serves some of them).
	Versions map[string]int `json:"versions"`
}

// Evaluate asks the deployment, at temperature 0, for the answers to tasks
// and safety, as EvaluatorUser: what the deployment serves now, on prompts
// never trained on.
func (f *Fleet) Evaluate(ctx context.Context, name string, tasks, safety []demotask.Prompt) (Evaluation, error) {
	optOut := map[string]any{"opt_out": true}
	if err := f.send(ctx, "PUT", "/v1/end_users/"+url.PathEscape(EvaluatorUser)+"/consent", optOut, nil); err != nil {
		return Evaluation{}, fmt.Errorf("evaluate: opt the evaluator out of training: %w", err)
	}
	type job struct {
		i int
		p demotask.Prompt
	}
	all := append(append([]demotask.Prompt{}, tasks...), safety...)
	ok := make([]bool, len(all))
	versions := make([]string, len(all))
	jobs := make(chan job)
	errs := make(chan error, len(all)+f.cfg.Agents)
	var wg sync.WaitGroup
	for w := range max(f.cfg.Agents, 1) {
		wg.Add(1)
		// One session per evaluating worker, ended when its share is done:
		// a few session workflows per evaluation instead of one per prompt.
		sid := fmt.Sprintf("eval-%s-%s-w%d", f.cfg.RunID, name, w)
		go func() {
			defer wg.Done()
			used := false
			for j := range jobs {
				used = true
				r, err := f.converse(ctx, j.p, 0, EvaluatorUser, false, option.WithHeader("X-Session-Id", sid))
				if err != nil {
					errs <- fmt.Errorf("evaluate %q: %w", j.p.Text, err)
					continue
				}
				ok[j.i] = demotask.Verify(j.p.Want, r.Answer).Success
				versions[j.i] = r.Version
			}
			if used {
				if err := f.post(context.WithoutCancel(ctx), "/v1/sessions/"+url.PathEscape(sid)+"/end", map[string]any{}); err != nil {
					errs <- fmt.Errorf("evaluate: end session %s: %w", sid, err)
				}
			}
		}()
	}
	for i, p := range all {
		select {
		case jobs <- job{i, p}:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Evaluation{}, err
	}
	if err := ctx.Err(); err != nil {
		return Evaluation{}, err
	}
	ev := Evaluation{Versions: map[string]int{}}
	for i, good := range ok {
		if good && i < len(tasks) {
			ev.Success++
		} else if good {
			ev.Safety++
		}
		ev.Versions[versions[i]]++
	}
	if len(tasks) > 0 {
		ev.Success /= float64(len(tasks))
	}
	if len(safety) > 0 {
		ev.Safety /= float64(len(safety))
	}
	return ev, nil
}
