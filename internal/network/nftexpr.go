package network

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Small builders for the nftables expressions the rules use. Each returns
// a match (load into register 1, compare) or a statement.

// Offsets in the IPv4 header.
const (
	ipv4SourceOffset = 12
	ipv4DestOffset   = 16
)

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifnamePrefix matches interface names starting with prefix: comparing
// fewer bytes than the register holds is how nft expresses "name*".
func ifnamePrefix(key expr.MetaKey, prefix []byte) []expr.Any {
	return ifnameCmp(key, prefix, expr.CmpOpEq)
}

func ifnameNotPrefix(key expr.MetaKey, prefix []byte) []expr.Any {
	return ifnameCmp(key, prefix, expr.CmpOpNeq)
}

// ifnameExact matches one name: the whole IFNAMSIZ register, NUL-padded.
func ifnameExact(key expr.MetaKey, name string) []expr.Any {
	padded := make([]byte, ifNameMax+1)
	copy(padded, name)
	return ifnameCmp(key, padded, expr.CmpOpEq)
}

func ifnameCmp(key expr.MetaKey, data []byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// nfproto matches the packet's family inside an inet table.
func nfproto(f nftables.TableFamily) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(f)}},
	}
}

// ctEstablishedOrRelated is nft's "ct state established,related".
func ctEstablishedOrRelated() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctNotEstablishedOrRelated is nft's "ct state != established,related":
// new, invalid and untracked packets.
func ctNotEstablishedOrRelated() []expr.Any {
	e := ctEstablishedOrRelated()
	e[len(e)-1] = &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)}
	return e
}

// daddrIsLocal is nft's "fib daddr type local": the packet is addressed
// to one of the host's own addresses.
func daddrIsLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ipv4DaddrIn is nft's "ip daddr @set"; the packet must be IPv4.
func ipv4DaddrIn(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv4DestOffset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// l4proto is nft's "meta l4proto proto".
func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// dport is nft's "th dport port"; the protocol must have been matched
// (TCP and UDP keep the destination port at the same offset).
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// sourceNotRoutedBack is nft's "fib saddr . iif oif missing": the route
// to the packet's source does not leave through the interface it came in.
func sourceNotRoutedBack() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// ipv4Prefix compares the IPv4 address at offset in the network header
// with a prefix.
func ipv4Prefix(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	mask := make([]byte, 4)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// countAndDrop counts what it drops, so `nft list table` shows whether
// sandboxes try.
func countAndDrop() []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
}

// countAndReject refuses the packet with a TCP reset or an ICMP error
// (rejectType, icmpxCode as nft_reject_inet takes them), so the sender
// learns at once instead of waiting for a timeout.
func countAndReject(rejectType uint32, icmpxCode uint8) []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Reject{Type: rejectType, Code: icmpxCode}}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// ctNew is nft's "ct state new".
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ipsDstNAT is the kernel's IPS_DST_NAT conntrack status bit.
const ipsDstNAT = 1 << 5

// ctStatusDNAT is nft's "ct status dnat": the connection's destination
// was translated (here: redirected to the egress proxy).
func ctStatusDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// limitPerSecond matches at most n packets a second, burst 2n.
func limitPerSecond(n uint64) []expr.Any {
	return []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: n, Unit: expr.LimitTimeSecond, Burst: uint32(2 * n)}}
}

// ifnameIn is nft's "iifname @set" (or oifname) for a set of ifnames.
func ifnameIn(key expr.MetaKey, set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

// ifnameVmap is nft's "iifname vmap @map".
func ifnameVmap(set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: set},
	}
}

// redirectTo is nft's "redirect to :port".
func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// ipv4DaddrPrefix is nft's "ip daddr PREFIX".
func ipv4DaddrPrefix(p netip.Prefix) []expr.Any { return ipv4Prefix(ipv4DestOffset, p, expr.CmpOpEq) }
