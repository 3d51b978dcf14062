package sandbox_test

import (
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/stretchr/testify/require"
)

func TestPolicy(t *testing.T) {
	p := sandbox.DefaultPolicy(nil)
	cases := map[string]string{
		"python3 -m pytest -q":                  sandbox.VerdictAllow,
		"cat statkit/center.py":                 sandbox.VerdictAllow,
		"git diff && git status":                sandbox.VerdictAllow,
		"grep -rn logic .":                      sandbox.VerdictAllow,
		"git log --all -p":                      sandbox.VerdictDeny,
		"cd /workspace; git reflog":             sandbox.VerdictDeny,
		"git --no-pager log":                    sandbox.VerdictDeny,
		"cat .git/packed-refs":                  sandbox.VerdictDeny,
		"git fetch origin":                      sandbox.VerdictDeny,
		"curl http://example.com":               sandbox.VerdictDeny,
		"echo x > /dev/tcp/1.2.3.4/80":          sandbox.VerdictDeny,
		"pip install requests":                  sandbox.VerdictDeny,
		"python3 -m pip install x":              sandbox.VerdictDeny,
		"sudo id":                               sandbox.VerdictDeny,
		"cat /tmp/.grade-abc.xml":               sandbox.VerdictDeny,
		"echo 'import os' > conftest.py":        sandbox.VerdictFlag,
		"export PYTEST_ADDOPTS=-p no:x; pytest": sandbox.VerdictFlag,
	}
	for cmd, want := range cases {
		require.Equal(t, want, p.Check(cmd).Verdict, cmd)
	}
}
