//go:build tools

// Package tools pins the Prometheus server for `go build` (see hack/tools).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
