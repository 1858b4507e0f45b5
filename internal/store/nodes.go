package store

import (
	"context"
	"regexp"
	"time"
)

// NodeState is what an operator made of a node (`warren nodes`).
type NodeState string

const (
	// NodeReady takes new sandboxes.
	NodeReady NodeState = "ready"
	// NodeCordoned takes no new sandboxes; its running ones go on.
	NodeCordoned NodeState = "cordoned"
	// NodeDraining takes no new sandboxes and pauses its running ones.
	NodeDraining NodeState = "draining"
)

// ValidNodeState says whether s is a state an operator may set.
func ValidNodeState(s NodeState) bool {
	return s == NodeReady || s == NodeCordoned || s == NodeDraining
}

// Node is a node's record: what it registered, what its last heartbeat
// said, and the state operators set.
type Node struct {
	Name    string
	Address string // where the node's internal service listens; "" for none
	Runtime string
	// Capacity: DiskMB is the size of its data dir's file system.
	CPUs, MemoryMB, MaxSandboxes, DiskMB int
	// Labels are the operator's (--node-label).
	Labels map[string]string
	// IdentityKey is the public key (a JWK, JSON) the node signs
	// sandboxes' identity tokens with; "" for none.
	IdentityKey               string
	State                     NodeState
	RegisteredAt, HeartbeatAt time.Time
	// Use, as of the heartbeat: running sandboxes (warm ones included) and
	// their nominal CPUs and memory.
	NodeUsage
}

// NodeUsage is what a node's heartbeat reports.
type NodeUsage struct {
	Sandboxes, UsedCPUs, UsedMemoryMB int
	// FreeDiskMB is what its data dir's file system has free.
	FreeDiskMB int
	// Warm counts the warm sandboxes it holds, by template ID.
	Warm map[string]int
}

// MaxHeartbeatAhead is how far after the reader's clock a heartbeat may
// be dated and still count: the cluster authentication's skew window
// (internal/cluster). A node dates its own heartbeats; one whose clock
// runs further ahead can authenticate to no one, and trusting its dates
// would count it alive that much longer after it died.
const MaxHeartbeatAhead = 60 * time.Second

// Lost says whether the node has not been heard from within after of now,
// or dates its heartbeats too far ahead of now to be believed.
func (n Node) Lost(now time.Time, after time.Duration) bool {
	return now.Sub(n.HeartbeatAt) > after || n.HeartbeatAt.Sub(now) > MaxHeartbeatAhead
}

// labelPattern is what a node label's key and value may hold: letters,
// digits and . _ / - (Kubernetes' label characters), 1 to 63 of them.
var labelPattern = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,63}$`)

// ValidLabel reports whether key=value may label a node.
func ValidLabel(key, value string) bool {
	return labelPattern.MatchString(key) && labelPattern.MatchString(value)
}

// NodeStore keeps the nodes of a cluster.
type NodeStore interface {
	// RegisterNode records a starting node, or updates the record of a
	// restarted one (its address, runtime, capacity and heartbeat); the
	// state an operator set is kept.
	RegisterNode(ctx context.Context, n Node) error
	// HeartbeatNode records that a node is alive at at, using u; it
	// returns the node's state (ErrNotFound if it never registered).
	HeartbeatNode(ctx context.Context, name string, at time.Time, u NodeUsage) (NodeState, error)
	GetNode(ctx context.Context, name string) (Node, error)
	// ListNodes lists every node, by name.
	ListNodes(ctx context.Context) ([]Node, error)
	// SetNodeState sets a node's state (ErrNotFound if there is none).
	SetNodeState(ctx context.Context, name string, state NodeState) error
}
