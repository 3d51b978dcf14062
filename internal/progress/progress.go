// Package progress draws a progress bar for long commands: one line
// redrawn in place on a terminal, or a plain line at most every interval
// elsewhere, so logs and CI keep readable output. The demo and `flywheel
// sandbox build` draw theirs with it.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultInterval is how often a non-terminal gets a line.
const DefaultInterval = 10 * time.Second

// Width is the bar's width in cells.
const Width = 30

// Bar draws to w; tty selects the in-place redraw.
type Bar struct {
	w        io.Writer
	tty      bool
	interval time.Duration

	mu   sync.Mutex
	last time.Time
}

// New draws to w; interval (0: DefaultInterval) spaces the lines when w is
// not a terminal.
func New(w io.Writer, tty bool, interval time.Duration) *Bar {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Bar{w: w, tty: tty, interval: interval}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Render is the bar for a fraction done in [0, 1], then text.
func Render(frac float64, text string) string {
	frac = min(1, max(0, frac))
	full := int(frac * Width)
	line := fmt.Sprintf("[%s] %3.0f%%", strings.Repeat("█", full)+strings.Repeat("░", Width-full), 100*frac)
	if text != "" {
		line += " " + text
	}
	return line
}

// Update shows line: always on a terminal, at most once per interval
// elsewhere.
func (b *Bar) Update(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty {
		// \r and erase-line redraw in place; nothing else is needed.
		fmt.Fprint(b.w, "\r\x1b[2K"+line)
		return
	}
	now := time.Now()
	if !b.last.IsZero() && now.Sub(b.last) < b.interval {
		return
	}
	b.last = now
	fmt.Fprintln(b.w, line)
}

// Done prints the final line and ends it.
func (b *Bar) Done(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty {
		fmt.Fprint(b.w, "\r\x1b[2K"+line+"\n")
		return
	}
	fmt.Fprintln(b.w, line)
}

// Clock renders a duration as m:ss.
func Clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
