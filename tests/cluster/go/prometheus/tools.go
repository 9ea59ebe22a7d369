//go:build tools

// Package tools pins the command we build, so `go mod tidy` records every module it needs in go.sum.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
