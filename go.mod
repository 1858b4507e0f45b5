module github.com/warren-sandbox/warren

go 1.26.8

require (
	connectrpc.com/connect v1.21.1
	github.com/creack/pty v1.1.24
	github.com/opencontainers/runtime-spec v1.2.1
	golang.org/x/sys v0.49.0
	google.golang.org/protobuf v1.36.12
)

require github.com/fsnotify/fsnotify v1.10.1 // indirect
