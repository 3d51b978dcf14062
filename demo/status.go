package demo

import (
	"bytes"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"time"

	"github.com/flywheel-ai/flywheel/demo/rehearsal"
	"github.com/flywheel-ai/flywheel/internal/statuspage"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// StatusFile is the status page's file name inside the output directory.
const StatusFile = "status.html"

// StatusPage is what the status page shows: the run's summary and curve,
// recent sessions when there are any, and its gate decisions: the
// in-process ones of an offline run (Points), or the control plane's own
// records of an online one (Control), drawn as the gateway's live /status
// draws them.
type StatusPage struct {
	Title     string
	Generated time.Time
	ModelName string
	Summary   Summary
	Points    []rehearsal.Point
	// Control is the control plane's reading of the deployment at the end
	// of an online run (GET /v1/status); nil offline.
	Control *statusapi.Status
	// Note says what the page could not show, and why.
	Note string
	// Sessions are recent agent sessions (online mode); may be empty.
	Sessions []SessionRow
	// CurveSVG is inlined as is (it is our own gonum/plot output).
	CurveSVG string
}

// SessionRow is one recent session.
type SessionRow struct {
	ID      string
	Prompt  string
	Answer  string
	Reward  float64
	Version string
}

// runTmpl is the run's own part of the page ("run"), which an online page
// puts above the control plane's records, and the offline page ("page"),
// which adds the in-process gate decisions.
var runTmpl = template.Must(template.New("run").Funcs(template.FuncMap{
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"svg": func(s string) template.HTML { return template.HTML(s) }, // #nosec: our own plot output
	"sec": func(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) },
}).Parse(`<style>
.run table{border-collapse:collapse;margin:1em 0}.run td,.run th{border:1px solid #ccc;padding:.3em .6em;text-align:right}
.run th{background:#f4f4f4}.promote{color:#2a7d2a}.rollback{color:#b22}.hold{color:#888}
.run .kv td:first-child{text-align:left;font-weight:600}.note{color:#8a5a00}
</style>
<div class="run">
<p>Demo run generated {{.Generated.Format "2006-01-02 15:04:05 UTC"}} · mode {{.Summary.Mode}} · serving <b>{{.Summary.ServingVersion}}</b>
{{with .Summary.StatusURL}} · live page <a href="{{.}}">{{.}}</a>{{end}}</p>
{{with .Note}}<p class="note">{{.}}</p>{{end}}
<table class="kv">
<tr><td>success (held-out, greedy)</td><td>{{pct .Summary.SuccessStart}} → <b>{{pct .Summary.SuccessEnd}}</b></td></tr>
<tr><td>safety suite</td><td>{{pct .Summary.SafetyStart}} → <b>{{pct .Summary.SafetyEnd}}</b></td></tr>
<tr><td>versions promoted / held / rolled back</td><td>{{.Summary.VersionsPromoted}} / {{.Summary.VersionsHeld}} / {{.Summary.VersionsRolledBack}}</td></tr>
<tr><td>training steps · sampled answers</td><td>{{.Summary.TrainSteps}} · {{.Summary.SampledAnswers}}</td></tr>
</table>
<h2>Success curve</h2>
{{svg .CurveSVG}}
{{if .Sessions}}<h2>Recent sessions</h2>
<table><tr><th>session</th><th>prompt</th><th>answer</th><th>reward</th><th>version</th></tr>
{{range .Sessions}}<tr><td>{{.ID}}</td><td>{{.Prompt}}</td><td>{{.Answer}}</td><td>{{printf "%.2f" .Reward}}</td><td>{{.Version}}</td></tr>
{{end}}</table>{{end}}
</div>`))

var pageTmpl = template.Must(template.Must(runTmpl.Clone()).New("page").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}</style></head><body>
<h1>{{.Title}}</h1>
{{template "run" .}}
<div class="run">
<h2>Gate decisions</h2>
<table><tr><th>step</th><th>time</th><th>candidate</th><th>gate success</th><th>gate safety</th><th>decision</th><th>serving</th><th>held-out success</th><th>safety</th><th>sampled success</th></tr>
{{range .Points}}<tr><td>{{.Step}}</td><td>{{sec .Elapsed}}</td><td>{{if .Decision}}v{{.Candidate}}{{else}}base{{end}}</td><td>{{pct .CandidateSuccess}}</td><td>{{pct .CandidateSafety}}</td>
<td class="{{.Decision}}">{{if .Decision}}{{.Decision}}{{else}}-{{end}}</td><td>{{$.ModelName}}@v{{.Version}}</td><td>{{pct .Success}}</td><td>{{pct .Safety}}</td><td>{{pct .SampledSuccess}}</td></tr>
{{end}}</table>
</div>
</body></html>
`))

// RenderStatusPage renders the page to HTML. With the control plane's
// reading, the page is the gateway's status page (a snapshot) with the
// run's part on top.
func RenderStatusPage(p StatusPage) ([]byte, error) {
	var buf bytes.Buffer
	if p.Control == nil {
		if err := pageTmpl.ExecuteTemplate(&buf, "page", p); err != nil {
			return nil, fmt.Errorf("render status page: %w", err)
		}
		return buf.Bytes(), nil
	}
	if err := runTmpl.ExecuteTemplate(&buf, "run", p); err != nil {
		return nil, fmt.Errorf("render status page: %w", err)
	}
	// Our own template's output, every value in it escaped.
	intro := template.HTML(buf.String()) // #nosec G203
	return statuspage.Render(p.Control, statuspage.Page{Title: p.Title, Selected: p.ModelName, Intro: intro})
}

// WriteStatusPage renders the page to path (written aside, then renamed).
func WriteStatusPage(path string, p StatusPage) error {
	html, err := RenderStatusPage(p)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, html, 0o644); err != nil {
		return fmt.Errorf("write status page: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write status page: %w", err)
	}
	return nil
}
