module windows

go 1.24

require sluice.dev/plugin v0.1.0
