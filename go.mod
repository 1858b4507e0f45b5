module github.com/warren-sandbox/warren

go 1.26.8

require (
	connectrpc.com/connect v1.21.1 // indirect
	github.com/creack/pty v1.1.24 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
