package testenv

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/encoding/protojson"
)

// RecordHistory writes workflow id's history to path when
// FLYWHEEL_RECORD_HISTORIES=1, for the replay tests that check today's code
// against committed histories.
func RecordHistory(t testing.TB, tc client.Client, id, path string) {
	t.Helper()
	if os.Getenv("FLYWHEEL_RECORD_HISTORIES") != "1" {
		return
	}
	it := tc.GetWorkflowHistory(context.Background(), id, "", false, 0)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, ev)
	}
	raw, err := protojson.MarshalOptions{Indent: "  "}.Marshal(h)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o644))
}
