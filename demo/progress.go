package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
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
// version: one line redrawn in place on a terminal, or a plain line every
// Interval elsewhere (logs and CI keep readable output).
type Progress struct {
	w        io.Writer
	tty      bool
	total    time.Duration
	interval time.Duration

	mu   sync.Mutex
	last time.Time
}

// DefaultProgressInterval is how often a non-terminal gets a line.
const DefaultProgressInterval = 10 * time.Second

// NewProgress writes to w; tty selects the in-place redraw; total is the
// run's planned length; interval (0: DefaultProgressInterval) spaces the
// lines when w is not a terminal.
func NewProgress(w io.Writer, tty bool, total, interval time.Duration) *Progress {
	if interval <= 0 {
		interval = DefaultProgressInterval
	}
	return &Progress{w: w, tty: tty, total: total, interval: interval}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

const barWidth = 30

// Line renders s without control characters.
func (p *Progress) Line(s Status) string {
	frac := 0.0
	if p.total > 0 {
		frac = min(1, max(0, float64(s.Elapsed)/float64(p.total)))
	}
	full := int(frac * barWidth)
	bar := strings.Repeat("█", full) + strings.Repeat("░", barWidth-full)
	line := fmt.Sprintf("[%s] %3.0f%% %s/%s  success %5.1f%%  safety %5.1f%%  serving %s",
		bar, 100*frac, fmtDur(s.Elapsed), fmtDur(p.total), 100*s.Success, 100*s.Safety, orDash(s.Version))
	if s.Note != "" {
		line += "  " + s.Note
	}
	return line
}

// Update shows s: always on a terminal, at most once per interval
// elsewhere.
func (p *Progress) Update(s Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := p.Line(s)
	if p.tty {
		// \r and erase-line redraw in place; nothing else is needed.
		fmt.Fprint(p.w, "\r\x1b[2K"+line)
		return
	}
	now := time.Now()
	if !p.last.IsZero() && now.Sub(p.last) < p.interval {
		return
	}
	p.last = now
	fmt.Fprintln(p.w, line)
}

// Done prints the final state and ends the line.
func (p *Progress) Done(s Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := p.Line(s)
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[2K"+line+"\n")
		return
	}
	fmt.Fprintln(p.w, line)
}

func fmtDur(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
