// Package redact removes personal data and secrets from text before it
// reaches the training queue: emails, phone numbers, payment card numbers
// (Luhn-checked), IP addresses, secrets and API keys, and patterns the
// operator configures. It reports what it removed by kind and count, never
// the removed text. It must not log its input.
package redact

import (
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
)

// Built-in kinds.
const (
	KindSecret = "secret"
	KindEmail  = "email"
	KindCard   = "card_number"
	KindIP     = "ip_address"
	KindPhone  = "phone"
)

// rule finds one kind. check, when set, confirms a candidate match (a Luhn
// sum, a parseable address) so near-misses stay in the text.
type rule struct {
	kind  string
	re    *regexp.Regexp
	check func(string) bool
}

// Builtins are applied in this order; where matches overlap, the earlier
// rule wins (a key full of digits is a secret, not a phone number).
func builtins() []rule {
	return []rule{
		{kind: KindSecret, re: regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----`)},
		{kind: KindSecret, re: regexp.MustCompile(`\b(?:sk-(?:proj-|ant-(?:api\d\d-)?)?[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35}|fw-[A-Za-z0-9]{32}|sk_(?:live|test)_[A-Za-z0-9]{16,})`)},
		{kind: KindSecret, re: regexp.MustCompile(`\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}`)},
		{kind: KindSecret, re: regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{16,}=*`)},
		{kind: KindSecret, re: regexp.MustCompile(`(?i)\b(?:api[_\-]?key|secret[_\-]?key|secret|access[_\-]?token|auth[_\-]?token|token|password|passwd|pwd)\b["']?\s*[:=]\s*["']?[^\s"',;]{6,}`)},
		{kind: KindEmail, re: regexp.MustCompile(`(?i)\b[a-z0-9._%+\-]+@[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?)*\.[a-z]{2,}\b`)},
		{kind: KindCard, re: regexp.MustCompile(`\b\d(?:[ \-]?\d){12,18}\b`), check: luhnCard},
		{kind: KindIP, re: regexp.MustCompile(`\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b`)},
		{kind: KindIP, re: regexp.MustCompile(`(?i)(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?:%[0-9a-z]+)?`), check: ipv6},
		{kind: KindPhone, re: regexp.MustCompile(`\+\d{1,3}(?:[ .\-]?\(?\d{1,4}\)?){2,5}`), check: phoneDigits},
		{kind: KindPhone, re: regexp.MustCompile(`(?:\(\d{3}\)\s?|\b\d{3}[ .\-])\d{3}[ .\-]\d{4}\b`), check: phoneDigits},
	}
}

// Redaction is what was removed: a kind and how many times.
type Redaction struct {
	Kind  string `json:"kind"`
	Count int    `json:"count"`
}

// Options configure a Redactor.
type Options struct {
	// Patterns are extra rules as "kind=regexp" (RE2 syntax), applied
	// after the built-ins.
	Patterns []string
	// Disable names built-in kinds to skip.
	Disable []string
}

// Redactor applies rules. It is safe for concurrent use.
type Redactor struct {
	rules []rule
}

// New builds a Redactor from the built-ins and opts.
func New(opts Options) (*Redactor, error) {
	off := map[string]bool{}
	for _, k := range opts.Disable {
		off[strings.TrimSpace(k)] = true
	}
	var rules []rule
	for _, r := range builtins() {
		if !off[r.kind] {
			rules = append(rules, r)
		}
	}
	for _, p := range opts.Patterns {
		kind, expr, ok := strings.Cut(p, "=")
		kind = strings.TrimSpace(kind)
		if !ok || kind == "" || expr == "" {
			return nil, fmt.Errorf("redact pattern %q: want kind=regexp", p)
		}
		if strings.ContainsAny(kind, "[] \t") {
			return nil, fmt.Errorf("redact pattern %q: kind must not contain spaces or brackets", p)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("redact pattern %q: %w", kind, err)
		}
		if re.MatchString("") {
			return nil, fmt.Errorf("redact pattern %q: matches the empty string", kind)
		}
		rules = append(rules, rule{kind: kind, re: re})
	}
	return &Redactor{rules: rules}, nil
}

// Placeholder is what replaces a match of kind.
func Placeholder(kind string) string { return "[REDACTED_" + strings.ToUpper(kind) + "]" }

type span struct {
	start, end int
	kind       string
}

// Text returns text with every match replaced by its placeholder, and the
// redactions applied (sorted by kind; empty when nothing matched).
func (r *Redactor) Text(text string) (string, []Redaction) {
	var spans []span
	for _, ru := range r.rules {
		for _, m := range ru.re.FindAllStringIndex(text, -1) {
			if ru.check != nil && !ru.check(text[m[0]:m[1]]) {
				continue
			}
			if overlaps(spans, m[0], m[1]) {
				continue
			}
			spans = append(spans, span{m[0], m[1], ru.kind})
		}
	}
	if len(spans) == 0 {
		return text, nil
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var b strings.Builder
	counts := map[string]int{}
	last := 0
	for _, s := range spans {
		b.WriteString(text[last:s.start])
		b.WriteString(Placeholder(s.kind))
		last = s.end
		counts[s.kind]++
	}
	b.WriteString(text[last:])
	out := make([]Redaction, 0, len(counts))
	for k, n := range counts {
		out = append(out, Redaction{Kind: k, Count: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return b.String(), out
}

func overlaps(spans []span, start, end int) bool {
	for _, s := range spans {
		if start < s.end && s.start < end {
			return true
		}
	}
	return false
}

func digits(s string) string {
	var b strings.Builder
	for _, c := range s {
		if c >= '0' && c <= '9' {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// luhnCard accepts 13-19 digits with a valid Luhn checksum.
func luhnCard(s string) bool {
	d := digits(s)
	if len(d) < 13 || len(d) > 19 {
		return false
	}
	return Luhn(d)
}

// Luhn reports whether the decimal string d passes the Luhn checksum.
func Luhn(d string) bool {
	sum, double := 0, false
	for i := len(d) - 1; i >= 0; i-- {
		c := d[i]
		if c < '0' || c > '9' {
			return false
		}
		n := int(c - '0')
		if double {
			n *= 2
			if n > 9 {
				n -= 9
			}
		}
		sum += n
		double = !double
	}
	return len(d) > 0 && sum%10 == 0
}

func ipv6(s string) bool {
	groups := 0
	for _, g := range strings.Split(strings.SplitN(s, "%", 2)[0], ":") {
		if g != "" {
			groups++
		}
	}
	// Fewer groups is more often code ("std::map", "a::b") than an address.
	if groups < 3 {
		return false
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

func phoneDigits(s string) bool {
	n := len(digits(s))
	return n >= 7 && n <= 15
}
