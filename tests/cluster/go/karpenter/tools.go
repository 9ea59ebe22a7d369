//go:build tools

// Package tools pins Karpenter's kwok cloud provider (sigs.k8s.io/karpenter/kwok): real Karpenter core
// (provisioning, consolidation, NodePool weights) creating kwok nodes from a GPU instance-types file. Its
// CRDs (kwok/charts/crds, kwok/apis/crds) are read from this module's directory at test time.
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
