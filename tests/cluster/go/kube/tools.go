//go:build tools

// Package tools pins the commands we build from k8s.io/kubernetes, so `go mod tidy` records every module
// they need in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
