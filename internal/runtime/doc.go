// Package runtime runs Warren sandboxes with an OCI runtime: gVisor's runsc
// (the default: a user-space kernel between the workload and the host, with
// native checkpoint/restore) or runc (plain namespaces and cgroups; faster,
// for trusted workloads; checkpoint/restore only with CRIU >= 4.2).
//
// Both backends drive the runtime's command line with a bounded context,
// build the OCI spec in Go (oci.go) from a Spec, keep their state under
// Config.StateDir, and place every sandbox in the cgroup
// <CgroupParent>/<id> so that Stats and cleanup know where to look on cgroup
// v1 and v2 hosts alike.
//
// The package also installs its runtimes for `warren setup`: EnsureRunsc
// builds a static runsc from the Go module proxy at a pinned version, and
// EnsureRunc installs Debian's runc.
package runtime
