//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), which stands in for the kubelets of the GPU nodes Karpenter
// creates: node and pod lifecycle driven by its Stage files, read from this module's directory at test time.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
