//go:build tools

// Package tools keeps the helm-unittest module in go.mod for `go build`.
package tools

import _ "github.com/helm-unittest/helm-unittest/cmd/helm-unittest"
