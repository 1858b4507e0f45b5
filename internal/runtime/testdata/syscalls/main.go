// Command syscalls tries system calls a sandbox must not be able to make
// and prints one line per call: its name and "ok" or the errno's name.
// The runtime tests build it statically and run it inside sandboxes. Run
// elsewhere it does no harm: what it creates lives and dies with it.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	for _, c := range []struct {
		name string
		call func() error
	}{
		// A child in a new user namespace: clone(2) with CLONE_NEWUSER.
		{"clone-newuser", func() error {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
			return cmd.Run()
		}},
		{"keyctl", func() error {
			_, err := unix.KeyctlJoinSessionKeyring("warren-test")
			return err
		}},
		{"add_key", func() error {
			_, err := unix.AddKey("user", "warren-test", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
			return err
		}},
		{"mount", func() error {
			dir, err := os.MkdirTemp("", "warren-mount-")
			if err != nil {
				return err
			}
			defer os.Remove(dir)
			if err := unix.Mount("none", dir, "tmpfs", 0, ""); err != nil {
				return err
			}
			return unix.Unmount(dir, 0)
		}},
		{"getpid", func() error {
			if unix.Getpid() <= 0 {
				return unix.EINVAL
			}
			return nil
		}},
	} {
		result := "ok"
		if err := c.call(); err != nil {
			var errno unix.Errno
			if errors.As(err, &errno) {
				result = unix.ErrnoName(errno)
			} else {
				result = err.Error()
			}
		}
		fmt.Fprintf(os.Stdout, "%s %s\n", c.name, result)
	}
}
