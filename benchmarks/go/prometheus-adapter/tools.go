//go:build tools

// Package tools pins the command we build from sigs.k8s.io/prometheus-adapter, so `go mod tidy` records every
// module it needs in go.sum.
package tools

import _ "sigs.k8s.io/prometheus-adapter/cmd/adapter"
