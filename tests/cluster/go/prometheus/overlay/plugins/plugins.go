// Copyright The Prometheus Authors; Apache-2.0. Built over the release's plugins/plugins.go (go build -overlay,
// see build.env): the release registers every service discovery; `make plugins` regenerates this file from
// plugins.yml, and this is that file with the list cut to kubernetes, the one discovery prometheus-operator's
// configurations use. file and http stay registered by plugins/minimum.go. Fewer plugins, far fewer modules
// to compile (no cloud SDKs).

package plugins

import (
	// Register kubernetes plugin.
	_ "github.com/prometheus/prometheus/discovery/kubernetes"
)
