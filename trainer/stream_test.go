package trainer

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

func TestTextStreamerHoldsPartialRunesAndStops(t *testing.T) {
	s := &textStreamer{stops: []string{"END"}}
	var got []string
	for _, b := range []byte("héllo EN") {
		got = append(got, s.push(string([]byte{b})))
	}
	for _, g := range got {
		require.True(t, strings.ToValidUTF8(g, "?") == g, "fragment %q is not valid UTF-8", g)
	}
	require.Equal(t, "héllo ", strings.Join(got, ""), "the possible start of END is held back")
	require.Equal(t, "x", s.push("x")[2:], "ENx is not a stop: released")
	require.Equal(t, "", s.push("E"))
	require.Equal(t, "", s.push("N"))
	require.Equal(t, "", s.push("D"))
	require.Equal(t, "", s.flush("END"))

	s = &textStreamer{stops: []string{"b"}}
	require.Equal(t, "a", s.push("ab"))
	require.Equal(t, "", s.flush("b"))

	s = &textStreamer{}
	require.Equal(t, "", s.push("\xe2"))
	require.Equal(t, "", s.push("\x82"))
	require.Equal(t, "€", s.push("\xac"))
	require.Equal(t, "a", s.push("a"))
	require.Equal(t, "", s.push("\xe2"))
	require.Equal(t, "\xe2", s.flush(""), "a cut-off character is flushed as is at the end")
}

func TestEngineStreamTextEqualsContent(t *testing.T) {
	e := testEngine(t)
	for seed := int64(0); seed < 5; seed++ {
		seed := seed
		var text strings.Builder
		resp, err := e.Stream(context.Background(), &inference.Request{
			Messages: []inference.Message{{Role: "user", Content: "hi"}}, Seed: &seed, Stop: []string{"e", "ab"}, MaxTokens: 30,
		}, func(d inference.Delta) error {
			text.WriteString(d.Text)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, resp.Message.Content, text.String())
	}
}
