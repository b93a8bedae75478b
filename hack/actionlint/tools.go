//go:build tools

// Pins actionlint, which checks the GitHub Actions workflows in .github/workflows (hack/test).
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
