// Command flywheel-agent runs inside a sandbox container and serves the
// agent protocol on stdin/stdout. It is built with CGO_ENABLED=0 and copied
// into sandbox images; it opens no socket.
package main

import (
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/sandbox/agent"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(agent.ProtocolVersion)
		return
	}
	if err := guardFromCommands(); err != nil {
		fmt.Fprintf(os.Stderr, "flywheel-agent: %v\n", err)
		os.Exit(1)
	}
	agent.ReserveThreads(agent.ReservedThreads)
	s := &agent.Server{Log: os.Stderr, AdoptsOrphans: adoptsOrphans}
	if err := s.Serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "flywheel-agent: %v\n", err)
		os.Exit(1)
	}
}
