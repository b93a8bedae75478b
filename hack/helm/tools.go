//go:build tools

// Package tools pins the helm command for `go build` (see hack/tools).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
