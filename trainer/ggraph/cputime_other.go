//go:build !unix

package ggraph

import "time"

// processCPU is unavailable here; the benchmark reports zero CPU figures.
func processCPU() time.Duration { return 0 }
