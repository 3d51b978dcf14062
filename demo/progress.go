package demo

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flywheel-ai/flywheel/internal/progress"
)

// Status is what the progress line shows.
type Status struct {
	Elapsed time.Duration
	// Success is the live success rate in [0, 1]; Safety the safety rate.
	Success float64
	Safety  float64
	// Version is the serving version.
	Version string
	// Note is a short free text (steps, calls, errors).
	Note string
}

// Progress draws a progress bar with the live success rate and the serving
// version (internal/progress draws it).
type Progress struct {
	bar   *progress.Bar
	total time.Duration
}

// DefaultProgressInterval is how often a non-terminal gets a line.
const DefaultProgressInterval = progress.DefaultInterval

// NewProgress writes to w; tty selects the in-place redraw; total is the
// run's planned length; interval (0: DefaultProgressInterval) spaces the
// lines when w is not a terminal.
func NewProgress(w io.Writer, tty bool, total, interval time.Duration) *Progress {
	return &Progress{bar: progress.New(w, tty, interval), total: total}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool { return progress.IsTerminal(f) }

// Line renders s without control characters.
func (p *Progress) Line(s Status) string {
	frac := 0.0
	if p.total > 0 {
		frac = float64(s.Elapsed) / float64(p.total)
	}
	text := fmt.Sprintf("%s/%s  success %5.1f%%  safety %5.1f%%  serving %s",
		progress.Clock(s.Elapsed), progress.Clock(p.total), 100*s.Success, 100*s.Safety, orDash(s.Version))
	if s.Note != "" {
		text += "  " + s.Note
	}
	return progress.Render(frac, text)
}

// Update shows s: always on a terminal, at most once per interval
// elsewhere.
func (p *Progress) Update(s Status) { p.bar.Update(p.Line(s)) }

// Done prints the final state and ends the line.
func (p *Progress) Done(s Status) { p.bar.Done(p.Line(s)) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
