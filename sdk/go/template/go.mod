module {{name}}

go 1.24

// Resolved by `sluice build` to the SDK of the host that builds it (a Go
// workspace), so no download is needed.
require sluice.dev/plugin v0.1.0
