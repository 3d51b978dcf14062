// Package statuspage draws the status view (statusapi.Status: what the control
// plane did with a tenant's deployments) as one HTML page: the gateway's
// live GET /status and the demo's static status.html are this page. It
// owns the rendering only; it must not read the database or know HTTP.
package statuspage

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/internal/chart"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// section is one deployment on the page.
type section struct {
	statusapi.DeploymentStatus
	CurveSVG  template.HTML
	CurveNote string
}

// Page says how a status reading is shown.
type Page struct {
	// Title heads the page; "": "Flywheel status".
	Title string
	// Selected is the deployment the reading is of; "": all the tenant's.
	Selected string
	// Refresh > 0 makes the page reload itself that often, as the live
	// page does; 0 makes a snapshot (a file), without the reload and
	// without the links that need the gateway.
	Refresh time.Duration
	// Intro is shown under the heading as it is (the demo's summary); it
	// must be the caller's own trusted HTML.
	Intro template.HTML
	// Logout shows a log-out button (POST /status/logout), for a reader
	// who logged in with the form.
	Logout bool
}

type pageData struct {
	*statusapi.Status
	Page
	RefreshSeconds int
	Sections       []section
}

// Render draws the reading as one self-contained HTML page (no external
// assets; the curves inline as SVG).
func Render(st *statusapi.Status, p Page) ([]byte, error) {
	if p.Title == "" {
		p.Title = "Flywheel status"
	}
	data := pageData{Status: st, Page: p, RefreshSeconds: int(p.Refresh.Seconds())}
	for _, d := range st.Deployments {
		sec := section{DeploymentStatus: d}
		if len(d.Curve.Points) == 0 {
			sec.CurveNote = "No rewarded interaction of yours in the window yet."
		} else {
			svg, err := curveChart(d).SVG(chart.DefaultWidth, chart.DefaultHeight)
			if err != nil {
				return nil, fmt.Errorf("draw curve of %s: %w", d.Name, err)
			}
			// Our own chart output: gonum escapes every text it draws.
			sec.CurveSVG = template.HTML(svg) // #nosec G203
		}
		data.Sections = append(data.Sections, sec)
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("render status page: %w", err)
	}
	return buf.Bytes(), nil
}

// curveChart is a deployment's curve (at least one point): one line per
// version that served, and their weighted mean when more than one did.
func curveChart(d statusapi.DeploymentStatus) chart.Chart {
	start := d.Curve.Points[0].Start
	x := func(t time.Time) float64 { return t.Sub(start).Minutes() }
	byVersion := map[string][]chart.Point{}
	var order []string
	type bucket struct{ sum, n float64 }
	all := map[time.Time]*bucket{}
	var times []time.Time
	lo, hi := 0.0, 1.0
	for _, p := range d.Curve.Points {
		if _, ok := byVersion[p.Version]; !ok {
			order = append(order, p.Version)
		}
		byVersion[p.Version] = append(byVersion[p.Version], chart.Point{X: x(p.Start), Y: p.MeanReward})
		b := all[p.Start]
		if b == nil {
			b = &bucket{}
			all[p.Start] = b
			times = append(times, p.Start)
		}
		b.sum += p.MeanReward * float64(p.Rewarded)
		b.n += float64(p.Rewarded)
		lo, hi = math.Min(lo, p.MeanReward), math.Max(hi, p.MeanReward)
	}
	slices.SortStableFunc(order, compareVersions)
	c := chart.Chart{
		Title:  d.Name + ": mean reward of rewarded interactions",
		XLabel: fmt.Sprintf("minutes since %s UTC (%d s buckets)", start.UTC().Format("2006-01-02 15:04:05"), d.Curve.BucketSeconds),
		YLabel: "mean reward", YMin: lo - 0.05, YMax: hi + 0.05,
	}
	for _, v := range order {
		name := v
		switch {
		case v == d.ServingVersion:
			name += " (serving)"
		case d.Canary != nil && v == d.Canary.Candidate:
			name += " (canary)"
		}
		c.Series = append(c.Series, chart.Series{Name: name, Points: byVersion[v]})
	}
	if len(order) > 1 {
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		mean := chart.Series{Name: "all versions", Color: chart.Palette[7], Dashes: []float64{4, 3}}
		for _, t := range times {
			mean.Points = append(mean.Points, chart.Point{X: x(t), Y: all[t].sum / all[t].n})
		}
		c.Series = append(c.Series, mean)
	}
	return c
}

// compareVersions orders "<name>@vN" ids by N, other names after them by
// name.
func compareVersions(a, b string) int {
	na, oka := statusapi.VersionNumber(a)
	nb, okb := statusapi.VersionNumber(b)
	switch {
	case oka && okb:
		return cmp.Compare(na, nb)
	case oka:
		return -1
	case okb:
		return 1
	}
	return strings.Compare(a, b)
}

// fmtMetrics writes a metrics map as sorted key=value pairs: numbers to
// three significant digits, nested values left out (they are in the JSON).
func fmtMetrics(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		var v string
		switch x := m[k].(type) {
		case float64:
			v = fmt.Sprintf("%.3g", x)
		case bool:
			v = fmt.Sprint(x)
		case string:
			if x == "" {
				continue
			}
			v = x
		default:
			continue
		}
		if b.Len() > 0 {
			b.WriteString(" · ")
		}
		b.WriteString(k + "=" + v)
	}
	return b.String()
}

// fmtSome is fmtMetrics of the named keys only, for tables where the full
// map is noise; a map with none of them shows whole.
func fmtSome(m map[string]any, keys ...string) string {
	some := map[string]any{}
	for _, k := range keys {
		if v, ok := m[k]; ok {
			some[k] = v
		}
	}
	if len(some) == 0 {
		return fmtMetrics(m)
	}
	return fmtMetrics(some)
}

func fmtEvidence(raw json.RawMessage) string {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return ""
	}
	delete(m, "deployment")
	return fmtMetrics(m)
}

var pageTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"metrics":  fmtMetrics,
	"some":     fmtSome,
	"evidence": fmtEvidence,
	"outcome": func(o *statusapi.DecisionOutcome) string {
		if o == nil {
			return ""
		}
		return fmt.Sprintf("mean reward %.3f → %.3f (%d → %d rewarded sessions)", o.Before, o.After, o.RewardedBefore, o.RewardedAfter)
	},
	"pct":  func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) },
	"pctp": func(f *float64) string { return fmt.Sprintf("%.0f%%", 100**f) },
	"clock": func(t time.Time) string {
		return t.UTC().Format("01-02 15:04:05")
	},
	"clockp": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format("01-02 15:04:05")
	},
	"reward": func(r *float64) string {
		if r == nil {
			return "–"
		}
		return fmt.Sprintf("%.2f", *r)
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{{if .RefreshSeconds}}<meta http-equiv="refresh" content="{{.RefreshSeconds}}">
{{end}}<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}{{if .Selected}}: {{.Selected}}{{end}}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:78em;padding:0 1em;color:#222;line-height:1.35}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:2px solid #ddd}h3{margin-bottom:.3em}
.meta{color:#666}nav a{margin-right:1em}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:.92em}
td,th{border:1px solid #d4d4d4;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok,.promoted,.serving,.trained{color:#23803a}.bad,.rolled_back,.aborted,.failed{color:#b3261e}.not_evaluated{color:#8a5a00}
.running,.canary,.claimed,.queued{color:#9a6700}.small{font-size:.85em;color:#555}
svg{max-width:100%;height:auto}code{font-size:.95em}
</style></head><body>
<h1>{{.Title}}</h1>
<p class="meta">tenant <b>{{.Tenant}}</b> · generated {{clock .GeneratedAt}} UTC ·
{{if .RefreshSeconds}}refreshes every {{.RefreshSeconds}} s · JSON: {{else}}a snapshot of the control plane's records, as read from {{end}}<code>GET /v1/status{{if .Selected}}?deployment={{.Selected}}{{end}}</code></p>
{{if .Logout}}<form method="post" action="/status/logout"><button type="submit">Log out</button></form>{{end}}
{{if .Intro}}{{.Intro}}{{end}}
{{if .RefreshSeconds}}{{if .Selected}}<nav><a href="?">all deployments</a></nav>{{else if gt (len .Sections) 1}}<nav>{{range .Sections}}<a href="?deployment={{.Name}}">{{.Name}}</a>{{end}}</nav>{{end}}{{end}}
{{with .Usage}}{{if .Since}}<h2>Usage</h2>
{{if .Deployments}}<p class="small">Your keys' model calls and tokens on the UTC days since {{.Since}}, failed calls among the calls (per key: <code>GET /v1/usage</code>).</p>
<table><tr><th>deployment</th><th>calls</th><th>failed</th><th>prompt tokens</th><th>completion tokens</th></tr>
{{range .Deployments}}<tr><td>{{.Deployment}}</td><td class="n">{{.Requests}}</td><td class="n">{{.Errors}}</td><td class="n">{{.PromptTokens}}</td><td class="n">{{.CompletionTokens}}</td></tr>
{{end}}{{if gt (len .Deployments) 1}}<tr><th>all</th><th class="n">{{.Requests}}</th><th class="n">{{.Errors}}</th><th class="n">{{.PromptTokens}}</th><th class="n">{{.CompletionTokens}}</th></tr>
{{end}}</table>{{else}}<p class="small">No model calls of yours on the UTC days since {{.Since}}.</p>{{end}}{{end}}{{end}}
{{range .Sections}}
<section>
<h2>{{.Name}}</h2>
<p>backend <b>{{if .Backend}}{{.Backend}}{{else}}configured upstream{{end}}</b> · serving <b class="serving">{{if .ServingVersion}}{{.ServingVersion}}{{else}}–{{end}}</b>
{{with .Canary}} · release #{{.ReleaseID}} of <b class="canary">{{.Candidate}}</b> in phase <b>{{.Phase}}</b>{{if gt .Share 0.0}}, taking {{pct .Share}} of traffic{{end}}{{else}} · no release running{{end}}</p>

<h3>Anchor and watchdog</h3>
{{with .Anchor}}<p>anchor <b>{{.Version}}</b>, the best version promoted on the held-out suite: {{pct .PassRate}} of {{.Prompts}} prompts{{with .ServingPassRate}} · serving {{pctp .}}{{end}}.
Every release is judged against it as well as against the serving version, and the drops accepted since it share one budget.</p>
{{else}}<p class="small">No anchor: this deployment has no held-out suite yet, or no promoted version was measured on it. Without one its weights releases do not promote
(register one with <code>flywheel suite set --deployment {{$.Selected}} --suite regression --file prompts.jsonl</code>), unless its release policy allows unevaluated gates.</p>{{end}}
{{if .Watchdog}}<table><tr><th>checked</th><th>verdict</th><th>serving</th><th>anchor</th><th>reason</th></tr>
{{range .Watchdog}}<tr><td>{{clock .CreatedAt}}</td><td class="{{.Verdict}}">{{.Verdict}}</td><td>{{.Serving}}</td><td>{{if .Anchor}}{{.Anchor}}{{else}}–{{end}}</td><td class="small">{{.Reason}}</td></tr>
{{end}}</table>{{else}}<p class="small">No watchdog checks yet (<code>flywheel up</code> schedules them: <code>--control-watchdog-every</code>).</p>{{end}}

<h3>Success curve</h3>
{{if .CurveSVG}}{{.CurveSVG}}{{else}}<p class="small">{{.CurveNote}}</p>{{end}}

<h3>Versions</h3>
{{if .Versions}}<table><tr><th>version</th><th>parent</th><th>status</th><th>trained on (samples · your sessions)</th><th>training</th><th>created</th></tr>
{{range .Versions}}<tr><td><b>{{.ID}}</b>{{if .Serving}} <span class="serving">● serving</span>{{end}}{{if .Canary}} <span class="canary">◐ canary</span>{{end}}</td>
<td>{{if .Parent}}{{.Parent}}{{else}}–{{end}}</td><td class="{{.Status}}">{{.Status}}{{if .RetiredReason}} <span class="small">({{.RetiredReason}})</span>{{end}}</td>
<td class="n">{{.TrainedSamples}} · {{.TenantSessions}}</td><td class="small">{{some .Metrics "loss" "mean_reward" "trained_tokens"}}</td><td>{{clock .CreatedAt}}</td></tr>
{{end}}</table>{{else}}<p class="small">No stored versions.</p>{{end}}

<h3>Releases and gates</h3>
{{if .ReleaseCounts}}<p class="small">all releases: {{range $layer, $by := .ReleaseCounts}}<b>{{$layer}}</b> {{range $status, $n := $by}}<span class="{{$status}}">{{$status}} {{$n}}</span> {{end}}{{end}}</p>{{end}}
{{if .Releases}}<table><tr><th>#</th><th>layer</th><th>candidate ← baseline</th><th>status</th><th>phase</th><th>gates</th><th>reason</th><th>started</th><th>finished</th></tr>
{{range .Releases}}<tr><td>{{.ID}}</td><td>{{.Layer}}</td><td><b>{{.Candidate}}</b> ← {{if .Baseline}}{{.Baseline}}{{else}}–{{end}}</td>
<td class="{{.Status}}">{{.Status}}</td><td>{{.Phase}}{{if gt .CanaryShare 0.0}} ({{pct .CanaryShare}}){{end}}</td>
<td>{{range .Gates}}<div><b class="{{if .Passed}}ok{{else}}bad{{end}}">{{if .Passed}}✓{{else}}✗{{end}} {{.Gate}}</b> <span class="small">{{metrics .Metrics}}</span></div>{{else}}<span class="small">none yet</span>{{end}}</td>
<td class="small">{{.Reason}}</td><td>{{clock .StartedAt}}</td><td>{{clockp .FinishedAt}}</td></tr>
{{end}}</table>{{else}}<p class="small">No releases yet.</p>{{end}}

<h3>Evolution decisions</h3>
{{if .Decisions}}<table><tr><th>time</th><th>decision</th><th>reason</th><th>expected</th><th>release</th><th>what it did</th><th>evidence</th></tr>
{{range .Decisions}}<tr><td>{{clock .CreatedAt}}</td><td><b>{{.Decision}}</b></td><td>{{.Reason}}</td><td>{{.Expected}}</td><td>{{.Release}}</td><td>{{outcome .Outcome}}</td><td class="small">{{evidence .Evidence}}</td></tr>
{{end}}</table>{{else}}<p class="small">No decisions yet.</p>{{end}}

<h3>Training runs</h3>
{{if .TrainingRuns}}<table><tr><th>#</th><th>status</th><th>version</th><th>samples (yours)</th><th>stats</th><th>started</th><th>finished</th></tr>
{{range .TrainingRuns}}<tr><td>{{.ID}}</td><td class="{{.Status}}">{{.Status}}</td><td>{{if .Version}}{{.Version}}{{else}}–{{end}}</td>
<td class="n">{{.Samples}} ({{.TenantSamples}})</td><td class="small">{{some .Stats "parent_version" "loss" "mean_reward" "dropped_stale" "icepop_masked" "kpop_masked" "duration_ms" "error"}}</td><td>{{clock .CreatedAt}}</td><td>{{clockp .FinishedAt}}</td></tr>
{{end}}</table>{{else}}<p class="small">No training runs yet.</p>{{end}}

<h3>Your recent sessions</h3>
{{if .Sessions}}<table><tr><th>session</th><th>status</th><th>task</th><th>steps</th><th>reward</th><th>version</th><th>trained</th><th>last active</th></tr>
{{range .Sessions}}<tr><td><code>{{.ID}}</code></td><td>{{.Status}}</td><td>{{.TaskID}}</td><td class="n">{{.Steps}}</td><td class="n">{{reward .Reward}}</td><td>{{.Version}}</td>
<td>{{if .Trained}}<span class="trained">✓ into {{range $i, $v := .TrainedInto}}{{if $i}}, {{end}}{{$v}}{{end}}</span>{{else}}<span class="{{.Reason}}">✗ {{.Reason}}</span>{{end}}</td><td>{{clock .LastActiveAt}}</td></tr>
{{end}}</table>{{else}}<p class="small">No sessions.</p>{{end}}
</section>
{{else}}
<p>No deployment has a session of tenant <b>{{.Tenant}}</b> yet. Point an OpenAI or Anthropic client at this gateway's <code>/v1</code> and this page fills in.</p>
{{end}}
</body></html>
`))
