package tasks

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const sampleJUnit = `<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.test_a" name="test_ok" time="0.001" />
<testcase classname="tests.test_a" name="test_bad" time="0.001"><failure message="assert 1 == 2">boom</failure></testcase>
<testcase classname="tests.test_a.TestC" name="test_m[1-2]" time="0.001"><skipped message="x" /></testcase>
<testcase classname="tests.test_a" name="test_teardown" time="0.001" />
<testcase classname="tests.test_a" name="test_teardown" time="0.001"><error message="teardown" /></testcase>
</testsuite></testsuites>`

func TestParseJUnit(t *testing.T) {
	got, err := parseJUnit([]byte(sampleJUnit))
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		junitKey("tests/test_a.py::test_ok"):            OutcomePassed,
		junitKey("tests/test_a.py::test_bad"):           OutcomeFailed,
		junitKey("tests/test_a.py::TestC::test_m[1-2]"): OutcomeSkipped,
		junitKey("tests/test_a.py::test_teardown"):      OutcomeError,
	}, got)
	_, err = parseJUnit([]byte("<testsuites><testcase"))
	require.Error(t, err)
}

func FuzzParseJUnit(f *testing.F) {
	f.Add([]byte(sampleJUnit))
	f.Add([]byte("<a><b><c></c></b></a>"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseJUnit(data) // must not panic or hang
	})
}
