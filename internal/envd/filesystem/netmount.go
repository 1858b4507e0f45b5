package filesystem

import "golang.org/x/sys/unix"

// networkFS maps statfs magic numbers of network and FUSE filesystems to a
// name for the error message. inotify only sees changes made through this
// kernel, so a watch there silently misses remote changes; E2B therefore
// refuses such paths unless the caller sets allow_network_mounts.
var networkFS = map[uint32]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x65735546: "fuse",
}

// statfsType returns the filesystem magic of path; a variable so tests can
// pretend to be on a network mount.
var statfsType = func(path string) (uint32, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	// Magic numbers are 32-bit; Type's width differs between architectures.
	return uint32(st.Type), nil
}

// networkMount names the network filesystem path is on, or "" when it is
// local.
func networkMount(path string) (string, error) {
	magic, err := statfsType(path)
	if err != nil {
		return "", err
	}
	return networkFS[magic], nil
}
