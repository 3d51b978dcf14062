package trainer

import (
	"strings"
	"unicode/utf8"
)

// textStreamer turns byte tokens into stream text that is always valid UTF-8
// (a character may span several byte tokens) and never shows a stop string
// (a possible start of one is held back until it is ruled out).
type textStreamer struct {
	stops   []string
	pending string
}

// push adds bytes and returns what can be shown now.
func (s *textStreamer) push(b string) string {
	s.pending += b
	cut := len(s.pending)
	// Hold an incomplete last character.
	for back := 1; back <= utf8.UTFMax && back <= cut; back++ {
		if utf8.RuneStart(s.pending[cut-back]) {
			if !utf8.FullRuneInString(s.pending[cut-back:]) {
				cut -= back
			}
			break
		}
	}
	// Never show a stop string; generation ends on it.
	for _, st := range s.stops {
		if i := strings.Index(s.pending[:cut], st); st != "" && i >= 0 {
			cut = i
		}
	}
	// Hold the longest tail that could begin a stop string.
	for k := cut; k >= 1; k-- {
		tail := s.pending[cut-k : cut]
		held := false
		for _, st := range s.stops {
			if st != "" && len(tail) < len(st) && strings.HasPrefix(st, tail) {
				held = true
				break
			}
		}
		if held {
			cut -= k
			break
		}
	}
	out := s.pending[:cut]
	s.pending = s.pending[cut:]
	return out
}

// flush returns what is left at the end, without the stop string that ended
// generation (if any).
func (s *textStreamer) flush(stopText string) string {
	out := s.pending
	if i := strings.Index(out, stopText); stopText != "" && i >= 0 {
		out = out[:i]
	}
	s.pending = ""
	return out
}
