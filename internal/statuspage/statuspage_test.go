package statuspage_test

import (
	"html/template"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/statuspage"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// TestRenderLiveAndSnapshot draws one reading as the live page (reloads,
// links between deployments) and as a snapshot file (neither, with the
// caller's intro and title).
func TestRenderLiveAndSnapshot(t *testing.T) {
	st := &statusapi.Status{Tenant: "acme", GeneratedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Deployments: []statusapi.DeploymentStatus{
		{Name: "a", ReleaseCounts: map[string]map[string]int{"weights": {"promoted": 3}}}, {Name: "b"}}}

	live, err := statuspage.Render(st, statuspage.Page{Refresh: 5 * time.Second})
	require.NoError(t, err)
	for _, want := range []string{`<meta http-equiv="refresh" content="5">`, "<title>Flywheel status</title>", `<a href="?deployment=b">`, "refreshes every 5 s", "promoted 3"} {
		require.Contains(t, string(live), want)
	}

	snap, err := statuspage.Render(st, statuspage.Page{Title: "Demo <run>", Intro: template.HTML(`<p id="intro">summary</p>`)})
	require.NoError(t, err)
	require.Contains(t, string(snap), "<title>Demo &lt;run&gt;</title>")
	require.Contains(t, string(snap), `<p id="intro">summary</p>`)
	require.Contains(t, string(snap), "a snapshot of the control plane")
	require.NotContains(t, string(snap), "http-equiv")
	require.NotContains(t, string(snap), `href="?deployment=`)
}

// TestRenderUsage shows the tenant's usage per deployment, with a total
// row only when there is more than one, and says so when there is none.
func TestRenderUsage(t *testing.T) {
	st := &statusapi.Status{Tenant: "acme", Usage: statusapi.Usage{Since: "2026-01-01", Requests: 7, Errors: 1, PromptTokens: 700, CompletionTokens: 90,
		Deployments: []statusapi.DeploymentUsage{
			{Deployment: "a", Requests: 5, Errors: 1, PromptTokens: 500, CompletionTokens: 60},
			{Deployment: "b", Requests: 2, PromptTokens: 200, CompletionTokens: 30}}}}
	page, err := statuspage.Render(st, statuspage.Page{})
	require.NoError(t, err)
	require.Contains(t, string(page), "UTC days since 2026-01-01")
	require.Contains(t, string(page), `<tr><td>a</td><td class="n">5</td><td class="n">1</td><td class="n">500</td><td class="n">60</td></tr>`)
	require.Contains(t, string(page), `<tr><th>all</th><th class="n">7</th><th class="n">1</th><th class="n">700</th><th class="n">90</th></tr>`)

	st.Usage = statusapi.Usage{Since: "2026-01-01", Deployments: []statusapi.DeploymentUsage{}}
	page, err = statuspage.Render(st, statuspage.Page{})
	require.NoError(t, err)
	require.Contains(t, string(page), "No model calls of yours on the UTC days since 2026-01-01.")
}
