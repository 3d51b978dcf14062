package sandbox

import (
	"log/slog"
	"regexp"
)

// Policy verdicts.
const (
	// VerdictAllow runs the command.
	VerdictAllow = "allow"
	// VerdictFlag runs the command but records it as suspicious.
	VerdictFlag = "flag"
	// VerdictDeny refuses the command; the agent is told why.
	VerdictDeny = "deny"
)

// Decision is the policy's answer for one command.
type Decision struct {
	Verdict string
	// Rule names the rule that matched; empty for a plain allow.
	Rule   string
	Reason string
}

type policyRule struct {
	name    string
	verdict string
	reason  string
	re      *regexp.Regexp
}

// Policy screens agent commands before they run. It is defence in depth:
// the sandbox has no network and no history to find, and grading restores
// and checks the tests anyway; the policy makes attempts visible in the logs
// and in the trajectory, and saves the tool call.
type Policy struct {
	rules []policyRule
	log   *slog.Logger
}

// word matches a command name at a word boundary of a shell command.
const word = `(^|[\s;&|(` + "`" + `$/])`

// DefaultPolicy denies history digging, network use, privilege escalation
// and access to the grader's files, and flags mentions of test-runner hooks.
func DefaultPolicy(log *slog.Logger) *Policy {
	if log == nil {
		log = slog.Default()
	}
	r := func(name, verdict, reason, re string) policyRule {
		return policyRule{name: name, verdict: verdict, reason: reason, re: regexp.MustCompile(re)}
	}
	return &Policy{log: log, rules: []policyRule{
		r("git-history", VerdictDeny, "reading or rewriting git history is not allowed; work on the files",
			word+`git\s+(-\S+\s+)*(log|reflog|fsck|rev-list|cat-file|show-ref|for-each-ref|unpack-objects|verify-pack|bundle|fetch|pull|clone|remote|submodule|filter-branch|replace|notes)\b`),
		r("git-objects", VerdictDeny, "reading git object storage is not allowed", `\.git/(objects|packed-refs|refs|logs|ORIG_HEAD|FETCH_HEAD)`),
		r("network", VerdictDeny, "the sandbox has no network",
			word+`(curl|wget|nc|ncat|netcat|socat|ssh|scp|sftp|telnet|ftp|rsync|ping|dig|nslookup|host)\b|/dev/(tcp|udp)/|`+
				`\b(pip3?|python3?\s+-m\s+pip)\s+(install|download)\b|`+word+`(apt|apt-get|npm|yarn|gem|cargo\s+install|go\s+get)\b|http\.server`),
		r("escalation", VerdictDeny, "privilege escalation is not allowed",
			word+`(sudo|su|doas|nsenter|unshare|chroot|mount|umount|docker|capsh|setcap)\b|/proc/1/(root|environ|mem)`),
		r("grader", VerdictDeny, "the grader's files are off limits", `/tmp/\.grade-|\bjunitxml\b`),
		r("test-hooks", VerdictFlag, "test-runner hook files are checked at grading",
			`\b(conftest\.py|sitecustomize|usercustomize)\b|\.pth\b|PYTEST_ADDOPTS|PYTEST_PLUGINS`),
	}}
}

// Check returns the verdict for cmd and logs every flag and deny.
func (p *Policy) Check(cmd string) Decision {
	for _, rule := range p.rules {
		if rule.re.MatchString(cmd) {
			d := Decision{Verdict: rule.verdict, Rule: rule.name, Reason: rule.reason}
			p.log.Warn("sandbox command policy matched", "verdict", d.Verdict, "rule", d.Rule, "command", truncate(cmd, 500))
			return d
		}
	}
	return Decision{Verdict: VerdictAllow}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
