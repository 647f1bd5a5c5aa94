module sluice.dev/plugin

go 1.24
