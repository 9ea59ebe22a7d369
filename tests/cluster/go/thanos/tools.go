//go:build tools

// Package tools pins the command we build from github.com/thanos-io/thanos (sidecar, store and query are
// subcommands of one binary), so `go mod tidy` records every module it needs in go.sum.
package tools

import (
	_ "github.com/thanos-io/thanos/cmd/thanos"
)
