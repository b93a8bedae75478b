//go:build tools

// Package tools pins kubectl for `go build` (see hack/tools).
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
