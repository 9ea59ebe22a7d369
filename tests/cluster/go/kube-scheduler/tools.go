//go:build tools

// Package tools pins kube-scheduler from the same k8s.io/kubernetes release as tests/cluster/go/kube (its
// go.mod and go.sum are kube's, so the module cache the control plane filled serves this build too).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
